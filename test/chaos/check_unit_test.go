package chaos

import (
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	apiv1 "github.com/mqlet/mqlet/api/v1"
)

// The reply check finds each way a request's replies can break the
// contract, and nothing in a sequence that keeps it.
func TestReplyProblem(t *testing.T) {
	rep := func(phases ...string) []apiv1.Reply {
		var out []apiv1.Reply
		for _, p := range phases {
			out = append(out, apiv1.Reply{Phase: p})
		}
		return out
	}
	const a, ip, ok, no = apiv1.Accepted, apiv1.InProgress, apiv1.Succeeded, apiv1.Failed
	for _, tc := range []struct {
		name    string
		replies []apiv1.Reply
		inv     string
		final   bool
	}{
		{"nothing yet", nil, "", false},
		{"accepted only: a lost final", rep(a), "", false},
		{"in order", rep(a, ip, ip, ok), "", true},
		{"failed at once", rep(no), "", true},
		{"accepted twice (a redelivery answered)", rep(a, a, ok), "", true},
		{"two finals", append(rep(a, ok), apiv1.Reply{Phase: ok, Message: "decided again"}), invDuplicateFinal, true},
		{"two finals a moment apart", append(rep(a, ok), apiv1.Reply{Phase: ok, TS: time.Unix(1, 0)}), invDuplicateFinal, true},
		{"one final delivered twice (QoS 1)", rep(a, ip, ok, ok), "", true},
		{"succeeded then failed", rep(a, ok, no), invDuplicateFinal, true},
		{"progress after the final", rep(a, no, ip), invAfterFinal, true},
		{"accepted after in_progress", append(rep(a, ip), apiv1.Reply{Phase: a, Message: "answered again"}, apiv1.Reply{Phase: ok}), invPhaseOrder, false},
		{"accepted and in_progress delivered again (QoS 1)", rep(a, ip, a, ip, no), "", true},
		{"unknown phase", rep("weird"), invPhaseOrder, false},
	} {
		inv, _, final := replyProblem(tc.replies)
		if inv != tc.inv || final != tc.final {
			t.Errorf("%s: got %q final %v, want %q final %v", tc.name, inv, final, tc.inv, tc.final)
		}
	}
}

// A status says "not started" when the pod is Pending or the container has
// no id or waits; a running or terminated container has started.
func TestNotStarted(t *testing.T) {
	pod := func(phase v1.PodPhase, cs ...v1.ContainerStatus) *v1.Pod {
		return &v1.Pod{Status: v1.PodStatus{Phase: phase, ContainerStatuses: cs}}
	}
	running := v1.ContainerStatus{Name: "main", ContainerID: "containerd://abc", State: v1.ContainerState{Running: &v1.ContainerStateRunning{}}}
	waiting := v1.ContainerStatus{Name: "main", State: v1.ContainerState{Waiting: &v1.ContainerStateWaiting{Reason: "ContainerCreating"}}}
	done := v1.ContainerStatus{Name: "main", ContainerID: "containerd://abc", State: v1.ContainerState{Terminated: &v1.ContainerStateTerminated{}}}
	for _, tc := range []struct {
		name string
		pod  *v1.Pod
		want bool
	}{
		{"running", pod(v1.PodRunning, running), false},
		{"terminated", pod(v1.PodSucceeded, done), false},
		{"pending with a running container", pod(v1.PodPending, running), true},
		{"ContainerCreating", pod(v1.PodRunning, waiting), true},
		{"no container status", pod(v1.PodRunning), true},
	} {
		if got, _ := notStarted(tc.pod, "main"); got != tc.want {
			t.Errorf("%s: notStarted %v, want %v", tc.name, got, tc.want)
		}
	}
	if id := runningID(pod(v1.PodRunning, running), "main"); id != "abc" {
		t.Errorf("runningID = %q, want abc", id)
	}
}

// Replies decide the model: accepted (or any later phase) applies a
// command, a failure alone does not, nothing yet is undecided.
func TestAccepted(t *testing.T) {
	for _, tc := range []struct {
		phases      []string
		ok, decided bool
	}{
		{nil, false, false},
		{[]string{apiv1.Failed}, false, true},
		{[]string{apiv1.Accepted}, true, true},
		{[]string{apiv1.Accepted, apiv1.Failed}, true, true},
	} {
		var rs []apiv1.Reply
		for _, p := range tc.phases {
			rs = append(rs, apiv1.Reply{Phase: p})
		}
		if ok, decided := accepted(rs); ok != tc.ok || decided != tc.decided {
			t.Errorf("%v: accepted %v decided %v, want %v %v", tc.phases, ok, decided, tc.ok, tc.decided)
		}
	}
}
