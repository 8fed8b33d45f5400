package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	apiv1 "github.com/mqlet/mqlet/api/v1"
)

// Final replies across agent kills (issue 18, finding 1): a command
// answered accepted gets exactly one final reply, whatever number of
// restarts lies between, and wherever mqlet was killed.

// restartArmed starts the stopped or killed agent again with the fault
// points armed ("" for none) and waits until it is online.
func (e *podEnv) restartArmed(points string) {
	e.t.Helper()
	mark := e.mq.Mark()
	e.agent.RestartWithFaults(points)
	e.mq.WaitState(mark, e.node, "online", 30*time.Second)
}

// rearm stops the running agent and starts it with the fault points armed.
func (e *podEnv) rearm(points string) {
	e.t.Helper()
	e.agent.Stop()
	e.restartArmed(points)
}

// waitKilled waits for the armed agent to kill itself at its fault point.
func (e *podEnv) waitKilled(point string) {
	e.t.Helper()
	if !e.agent.WaitExit(90 * time.Second) {
		e.t.Fatalf("mqlet did not die at fault point %s within 90s", point)
	}
	if e.agent.cmd.ProcessState.ExitCode() != -1 {
		e.t.Fatalf("mqlet exited with code %d, want killed at %s", e.agent.cmd.ProcessState.ExitCode(), point)
	}
}

// finals are the distinct final replies seen for request id. A message
// seen twice with the same bytes (timestamp included) is one reply
// delivered twice: MQTT QoS 1 is at least once, and the outbox sends again
// what the broker acknowledged just before a kill. A second decision has
// a timestamp of its own.
func (e *podEnv) finals(id string) []apiv1.Reply {
	var out []apiv1.Reply
	seen := map[string]bool{}
	for _, r := range e.mq.Replies(e.node, id) {
		if r.Final() && !seen[dump(r)] {
			seen[dump(r)] = true
			out = append(out, r)
		}
	}
	return out
}

// exactlyOneFinal fails unless request id got exactly one final reply, of
// phase. It first restarts mqlet cleanly (a start that still found the
// request owed would answer it again) and waits for the answer to a get
// sent after it: the outbox publishes in order, so any second final reply
// queued before would have come before it.
func (e *podEnv) exactlyOneFinal(id, phase string) {
	e.t.Helper()
	e.rearm("")
	barrier := e.nextID("get")
	e.mq.Command(e.node, "get", barrier, nil)
	e.waitFinal(barrier, apiv1.Succeeded, 60*time.Second)
	finals := e.finals(id)
	if len(finals) != 1 || finals[0].Phase != phase {
		e.t.Fatalf("request %s got final replies %s, want exactly one %s", id, dump(finals), phase)
	}
}

// An apply whose agent is killed after the command was stored, answered
// accepted and acknowledged, but before the tracker heard of it, is
// answered succeeded after the restart, once.
func TestFinalReplyOfApplyKilledBeforeTracker(t *testing.T) {
	e := newPodEnv(t, "")
	e.cleanupPods("owed")
	e.rearm("intake.before-effects")
	id := e.nextID("apply")
	e.mq.Command(e.node, "apply", id, e.pod("owed", "Always", "sleep 3600"))
	e.waitKilled("intake.before-effects")
	e.restartArmed("")
	e.mq.WaitReply(e.node, id, apiv1.Accepted, 60*time.Second)
	e.waitFinal(id, apiv1.Succeeded, podReadyTimeout)
	e.exactlyOneFinal(id, apiv1.Succeeded)
}

// Killed at four starts in a row, at different points: after the command
// was acknowledged; twice at the start, with the owed reply followed again;
// once the pod runs and its final reply is decided but not yet queued. The
// apply is answered succeeded once. (A kill inside a pod's sync is left
// out here: that is what the poison-pod guard of finding 2 looks at.)
func TestFinalReplyOfApplyKilledAtConsecutiveRestarts(t *testing.T) {
	e := newPodEnv(t, "")
	e.cleanupPods("again")
	e.rearm("intake.before-effects")
	id := e.nextID("apply")
	e.mq.Command(e.node, "apply", id, e.pod("again", "Always", "sleep 3600"))
	e.waitKilled("intake.before-effects")
	for _, point := range []string{"replies.after-restore", "replies.after-restore", "replies.before-final-queued"} {
		e.agent.RestartWithFaults(point)
		e.waitKilled(point)
	}
	e.restartArmed("")
	e.waitFinal(id, apiv1.Succeeded, podReadyTimeout)
	e.exactlyOneFinal(id, apiv1.Succeeded)
}

// A delete killed after the runtime pod was removed, before its final
// reply: after the restart nothing of the pod is desired nor runs, and the
// delete is answered succeeded, once.
func TestFinalReplyOfDeleteKilledBeforeReply(t *testing.T) {
	e := newPodEnv(t, "")
	e.cleanupPods() // the delete below removes it; the sweep checks
	e.apply(e.pod("gone", "Always", "sleep 3600"), apiv1.Succeeded, podReadyTimeout)
	const point = "podworker.after-kill-pod"
	e.rearm(point)
	id := e.nextID("delete")
	e.mq.Command(e.node, "delete", id, fmt.Appendf(nil, `{"kind":"Pod","namespace":%q,"name":%q}`, e.ns, "gone"))
	e.waitKilled(point)
	if n := len(e.cri.Sandboxes(e.ns, "gone")); n != 0 {
		t.Fatalf("%d sandboxes left at the kill point, want the pod removed", n)
	}
	e.restartArmed("")
	e.waitFinal(id, apiv1.Succeeded, podGoneTimeout)
	e.exactlyOneFinal(id, apiv1.Succeeded)
}

// Killed between deciding the final reply and queueing it, or between
// queueing it and dropping the pending entry: still exactly one final
// reply (the first is queued at the restart, the second is not queued
// twice).
func TestFinalReplyKilledAroundQueueing(t *testing.T) {
	for _, point := range []string{"replies.before-final-queued", "replies.after-final-queued"} {
		t.Run(point, func(t *testing.T) {
			e := newPodEnv(t, "")
			name := strings.Split(point, ".")[1][:5]
			e.cleanupPods(name)
			e.rearm(point)
			id := e.nextID("apply")
			e.mq.Command(e.node, "apply", id, e.pod(name, "Always", "sleep 3600"))
			e.waitKilled(point)
			e.restartArmed("")
			e.waitFinal(id, apiv1.Succeeded, podReadyTimeout)
			e.exactlyOneFinal(id, apiv1.Succeeded)
		})
	}
}

// Killed while the pod is being started (its cgroups made, its sandbox
// not yet): after the restart the pod is started and the apply answered
// succeeded, once.
func TestFinalReplyOfApplyKilledWhilePodStarts(t *testing.T) {
	e := newPodEnv(t, "")
	e.cleanupPods("starting")
	const point = "cri.after-pod-cgroups"
	e.rearm(point)
	id := e.nextID("apply")
	e.mq.Command(e.node, "apply", id, e.pod("starting", "Always", "sleep 3600"))
	e.waitKilled(point)
	if f := e.finals(id); len(f) != 0 {
		t.Fatalf("final reply %s before the pod ever ran", dump(f))
	}
	e.restartArmed("")
	e.waitFinal(id, apiv1.Succeeded, podReadyTimeout)
	e.exactlyOneFinal(id, apiv1.Succeeded)
}
