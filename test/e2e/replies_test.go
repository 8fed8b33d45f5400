package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/mqlet/mqlet/agent/intake"
	apiv1 "github.com/mqlet/mqlet/api/v1"
)

// phases of every reply recorded for id, in arrival order, after a later
// get's reply arrived (the outbox is one queue: a reply the agent queued
// for id before the get's would have arrived first).
func (e *podEnv) phasesSettled(id string) []string {
	e.t.Helper()
	probe := e.nextID("get")
	e.mq.Command(e.node, "get", probe, []byte(`{"kind":"Pod","name":"none-such"}`))
	e.waitFinalAny(probe, 30*time.Second)
	var out []string
	for _, r := range e.mq.Replies(e.node, id) {
		out = append(out, r.Phase)
	}
	return out
}

// Issue 10's reply and intake bugs, through mosquitto and containerd: a
// re-apply of a running pod is answered in phase order with nothing after
// the final reply; a deliberate repeat of a delete without a request id
// runs; an apply whose pod a later delete removes ends at once.
func TestRepliesOrderRepeatsAndSupersededRequests(t *testing.T) {
	e := newPodEnv(t, "")
	web := e.pod("web", "Always", "sleep 3600")
	e.apply(web, apiv1.Succeeded, podReadyTimeout)

	for i := 0; i < 3; i++ {
		id := e.nextID("reapply")
		e.mq.Command(e.node, "apply", id, web)
		e.waitFinal(id, apiv1.Succeeded, podReadyTimeout)
		if got := strings.Join(e.phasesSettled(id), ","); got != "accepted,in_progress,succeeded" {
			t.Fatalf("re-apply %d of a running pod answered %s", i+1, got)
		}
	}

	// The same delete twice without a request id, the pod applied again in
	// between: both run (the second was answered from the first's record).
	del := fmt.Appendf(nil, `{"kind":"Pod","namespace":%q,"name":"web"}`, e.ns)
	derived := intake.DeriveRequestID(prefix+"/"+e.node+"/cmd/delete", del)
	e.mq.Command(e.node, "delete", "", del)
	e.waitFinal(derived, apiv1.Succeeded, podGoneTimeout)
	e.apply(web, apiv1.Succeeded, podReadyTimeout)
	mark := e.mq.Mark()
	e.mq.Command(e.node, "delete", "", del)
	e.mq.WaitFor(mark, podGoneTimeout, "the repeated delete's succeeded reply", func(m Msg) bool {
		r, err := apiv1.DecodeReply(m.Payload)
		return err == nil && r.RequestID == derived && r.Phase == apiv1.Succeeded
	})
	Eventually(t, podGoneTimeout, "pod web gone from containerd after the repeated delete", func() bool {
		return len(e.cri.Running(e.ns, "web")) == 0
	})

	// An apply still waiting (its init container sleeps) is superseded by a
	// delete of its pod: it ends at once, long before pods.applyDeadline.
	slow := fmt.Appendf(nil, `apiVersion: v1
kind: Pod
metadata: {name: slow, namespace: %s}
spec:
  terminationGracePeriodSeconds: 2
  initContainers:
  - {name: wait, image: docker.io/mqlet/busybox:test, imagePullPolicy: Never, command: ["sleep", "600"]}
  containers:
  - {name: main, image: docker.io/mqlet/busybox:test, imagePullPolicy: Never, command: ["sleep", "600"]}
`, e.ns)
	applyID := e.nextID("slow")
	e.mq.Command(e.node, "apply", applyID, slow)
	e.mq.WaitReply(e.node, applyID, apiv1.InProgress, 30*time.Second)
	e.deletePod("slow")
	final := e.waitFinal(applyID, apiv1.Failed, 30*time.Second)
	if !strings.Contains(final.Message, "superseded") || !strings.Contains(final.Message, "deleted by a later request") {
		t.Fatalf("superseded apply answered %q", final.Message)
	}
	if got := strings.Join(e.phasesSettled(applyID), ","); got != "accepted,in_progress,failed" {
		t.Fatalf("superseded apply's replies: %s", got)
	}
}
