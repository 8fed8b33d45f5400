package intake

import (
	"strings"
	"testing"

	"github.com/mqlet/mqlet/agent/pending"
	apiv1 "github.com/mqlet/mqlet/api/v1"
)

// checkPhaseOrder fails unless the phases rise (accepted, in_progress...,
// then one final) and nothing follows the final one.
func checkPhaseOrder(t *testing.T, phases []string) {
	t.Helper()
	last := 0
	for i, p := range phases {
		rank := apiv1.PhaseRank(p)
		if rank == 0 || rank < last || (last == 3 && i > 0) {
			t.Fatalf("replies out of phase order: %v", phases)
		}
		last = rank
	}
}

// A re-apply of an unchanged, running pod is answered by the tracker at
// once (its outcome is known): the in_progress reply must come before that
// final one, never after it.
func TestReapplyOfARunningPodRepliesInPhaseOrder(t *testing.T) {
	r := newRig(t)
	tracker := pending.New(r.sender, nil)
	r.in.tracker = tracker
	r.in.Handle(Command{Topic: "mqlet/v1/n1/cmd/apply/a1", Payload: []byte(webPod)})
	tracker.Observe("default/web", pending.Outcome{Generation: 1, Done: true, OK: true, Reason: "running"})
	if got := strings.Join(r.sender.phases("a1"), ","); got != "accepted,in_progress,succeeded" {
		t.Fatalf("first apply: %s", got)
	}
	r.in.Handle(Command{Topic: "mqlet/v1/n1/cmd/apply/a2", Payload: []byte(webPod)})
	got := r.sender.phases("a2")
	checkPhaseOrder(t, got)
	if strings.Join(got, ",") != "accepted,in_progress,succeeded" {
		t.Fatalf("re-apply of the running pod: %v", got)
	}
	if tracker.Len() != 0 {
		t.Fatalf("%d requests still tracked", tracker.Len())
	}
}

// A delete of a pod that is already gone is answered at once, after accepted.
func TestDeleteOfAGonePodRepliesInPhaseOrder(t *testing.T) {
	r := newRig(t)
	tracker := pending.New(r.sender, nil)
	r.in.tracker = tracker
	r.in.Handle(Command{Topic: "mqlet/v1/n1/cmd/apply/a1", Payload: []byte(webPod)})
	tracker.Observe("default/web", pending.Outcome{Gone: true})
	r.in.Handle(Command{Topic: "mqlet/v1/n1/cmd/delete/d1", Payload: []byte(`{"kind":"Pod","name":"web"}`)})
	got := r.sender.phases("d1")
	checkPhaseOrder(t, got)
	if strings.Join(got, ",") != "accepted,succeeded" {
		t.Fatalf("delete: %v", got)
	}
}

// An apply still waiting for its pod when a sync removes that pod ends at
// once, failed, saying so (it was answered "deadline passed" minutes later).
func TestApplySupersededBySyncEndsAtOnce(t *testing.T) {
	r := newRig(t)
	tracker := pending.New(r.sender, nil)
	r.in.tracker = tracker
	r.in.Handle(Command{Topic: "mqlet/v1/n1/cmd/apply/a1", Payload: []byte(webPod)})
	r.in.Handle(Command{Topic: "mqlet/v1/n1/cmd/sync/s1", Payload: []byte(`{"apiVersion":"v1","kind":"List","items":[]}`)})
	got := r.sender.phases("a1")
	checkPhaseOrder(t, got)
	last := r.sender.last("a1")
	if strings.Join(got, ",") != "accepted,in_progress,failed" || !strings.Contains(last.Message, "default/web deleted by a later request s1 (sync)") {
		t.Fatalf("a1: %v, last %+v", got, last)
	}
	if tracker.Len() != 1 {
		t.Fatalf("%d requests tracked, want s1 only", tracker.Len())
	}
}
