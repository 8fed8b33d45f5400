package e2e

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	apiv1 "github.com/mqlet/mqlet/api/v1"
)

// The agent SIGKILLed while it starts a pod (its sandbox made and no
// container yet, or a container created and not started), at the first
// apply or at a spec update, with or without the sandbox dying meanwhile:
// after the restart the current spec runs, the pod is never published
// Failed or Succeeded on the way, and the apply is answered succeeded.
// Under OnFailure and Never alike: the current spec has not run, so
// neither policy's "do not restart" applies.

type startKillCase struct {
	name   string
	update bool   // v0 runs first; the kill comes with the update to v1
	point  string // the fault point the agent dies at
	// sandboxDies: the test stops the pod's sandbox while the agent is
	// down (the sandbox of a half-made start, lost with the agent).
	sandboxDies bool
}

var startKillCases = []startKillCase{
	{name: "first apply, after the sandbox", point: "cri.after-run-sandbox"},
	{name: "first apply, after create", point: "cri.after-create-container"},
	{name: "first apply, after create, sandbox dead", point: "cri.after-create-container", sandboxDies: true},
	{name: "update, after create", update: true, point: "cri.after-create-container"},
	{name: "update, after create, sandbox dead", update: true, point: "cri.after-create-container", sandboxDies: true},
}

func TestPodStartKillOnFailureRunsTheCurrentSpec(t *testing.T) {
	runStartKillCases(t, "OnFailure")
}

func TestPodStartKillNeverRunsTheCurrentSpec(t *testing.T) {
	runStartKillCases(t, "Never")
}

// runStartKillCases runs each case on a fresh agent of its own.
func runStartKillCases(t *testing.T, policy string) {
	for _, c := range startKillCases {
		t.Run(c.name, func(t *testing.T) {
			defaultBackoffEnv(t).startKill(strings.ToLower(policy), policy, c)
		})
	}
}

// startKill runs one case on pod name.
func (e *podEnv) startKill(name, policy string, c startKillCase) {
	t := e.t.(*testing.T)
	e.cleanupPods(name)
	v := 0
	if c.update {
		e.apply(e.pod(name, policy, specVersion(0)), apiv1.Succeeded, podReadyTimeout)
		if !e.runsVersion(name, 0) {
			t.Fatalf("%s does not run v0: %s", name, dump(e.cri.Containers(e.ns, name)))
		}
		v = 1
	}

	e.rearm(c.point)
	from := e.mq.Mark()
	id := e.nextID("apply")
	e.mq.Command(e.node, "apply", id, e.pod(name, policy, specVersion(v)))
	e.waitKilled(c.point)
	if e.runsVersion(name, v) {
		t.Fatalf("%s runs v%d at the fault point already; the kill came too late to test anything", name, v)
	}
	if c.point == "cri.after-create-container" {
		created := false
		for _, ct := range e.cri.Containers(e.ns, name) {
			created = created || ct.State == runtimeapi.ContainerState_CONTAINER_CREATED
		}
		if !created {
			t.Fatalf("no container of %s is created-not-started at %s: %s", name, c.point, dump(e.cri.Containers(e.ns, name)))
		}
	}
	if c.sandboxDies {
		ctx, cancel := criCtx()
		for _, sb := range e.cri.Sandboxes(e.ns, name) {
			if err := e.rt.StopPodSandbox(ctx, sb.Id); err != nil {
				cancel()
				t.Fatalf("stopping the sandbox of %s: %v", name, err)
			}
		}
		cancel()
	}

	e.restartArmed("")
	r := e.waitFinalAny(id, podReadyTimeout)
	if r.Phase != apiv1.Succeeded {
		t.Fatalf("%s: the apply of v%d ended %s (%s), want succeeded", name, v, r.Phase, r.Message)
	}
	Eventually(t, podReadyTimeout, name+" runs the current spec", func() bool { return e.runsVersion(name, v) })
	e.waitStatus(name, 30*time.Second, "Running with main running", func(p *v1.Pod) bool {
		cs, ok := containerStatus(p, "main", false)
		return p.Status.Phase == v1.PodRunning && ok && cs.State.Running != nil
	})
	if bad := e.finishedStatuses(from, name); len(bad) > 0 {
		t.Fatalf("%s was published finished before its current spec ran: %v", name, bad)
	}
	e.staysRunning(name, v, 3*time.Second)
}

// finishedStatuses lists the statuses of pod name published at or after
// message from that say it finished (Failed or Succeeded).
func (e *podEnv) finishedStatuses(from int, name string) []string {
	var bad []string
	msgs := e.mq.Messages()
	for i := from; i < len(msgs); i++ {
		m := msgs[i]
		if m.Topic != e.podTopic(name) || len(m.Payload) == 0 {
			continue
		}
		var p v1.Pod
		if json.Unmarshal(m.Payload, &p) != nil {
			continue
		}
		if p.Status.Phase == v1.PodFailed || p.Status.Phase == v1.PodSucceeded {
			bad = append(bad, string(p.Status.Phase)+": "+dump(p.Status.ContainerStatuses))
		}
	}
	return bad
}
