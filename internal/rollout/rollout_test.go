package rollout

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	apiv1 "github.com/mqlet/mqlet/api/v1"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func TestWaveSizes(t *testing.T) {
	for _, tc := range []struct {
		n    int
		s    apiv1.RolloutStrategy
		want []int
	}{
		{4, apiv1.RolloutStrategy{Batch: 2}, []int{2, 2}},
		{5, apiv1.RolloutStrategy{Batch: 2}, []int{2, 2, 1}},
		{1, apiv1.RolloutStrategy{Batch: 3}, []int{1}},
		{10, apiv1.RolloutStrategy{BatchPercent: 25}, []int{3, 3, 3, 1}},
		{3, apiv1.RolloutStrategy{BatchPercent: 1}, []int{1, 1, 1}}, // rounded up, at least one
		{10, apiv1.RolloutStrategy{Batch: 1, Growth: 2}, []int{1, 2, 4, 3}},
		{20, apiv1.RolloutStrategy{BatchPercent: 10, Growth: 1.5}, []int{2, 3, 5, 8, 2}},
		{0, apiv1.RolloutStrategy{Batch: 1}, nil},
	} {
		if got := WaveSizes(tc.n, tc.s); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("WaveSizes(%d, %+v) = %v, want %v", tc.n, tc.s, got, tc.want)
		}
	}
}

func TestValidateStrategy(t *testing.T) {
	ok := apiv1.RolloutStrategy{Batch: 1, NodeTimeoutSeconds: 60}
	if err := ValidateStrategy(ok); err != nil {
		t.Fatalf("valid strategy refused: %v", err)
	}
	for name, tc := range map[string]struct {
		mod  func(*apiv1.RolloutStrategy)
		want string
	}{
		"no batch":     {func(s *apiv1.RolloutStrategy) { s.Batch = 0 }, "--batch is required"},
		"both":         {func(s *apiv1.RolloutStrategy) { s.BatchPercent = 10 }, "not both"},
		"over 100%":    {func(s *apiv1.RolloutStrategy) { s.Batch, s.BatchPercent = 0, 101 }, "at most 100%"},
		"growth < 1":   {func(s *apiv1.RolloutStrategy) { s.Growth = 0.5 }, "--growth"},
		"neg failures": {func(s *apiv1.RolloutStrategy) { s.MaxFailures = -1 }, "--max-failures"},
		"pct failures": {func(s *apiv1.RolloutStrategy) { s.MaxFailurePercent = 150 }, "--max-failures"},
		"no timeout":   {func(s *apiv1.RolloutStrategy) { s.NodeTimeoutSeconds = 0 }, "--node-timeout"},
	} {
		s := ok
		tc.mod(&s)
		if err := ValidateStrategy(s); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want an error with %q", name, err, tc.want)
		}
	}
}

func newDoc(t *testing.T, nodes int, s apiv1.RolloutStrategy) *apiv1.Rollout {
	t.Helper()
	if s.NodeTimeoutSeconds == 0 {
		s.NodeTimeoutSeconds = 60
	}
	var names []string
	for i := nodes - 1; i >= 0; i-- { // New sorts them
		names = append(names, fmt.Sprintf("n%d", i))
	}
	r, err := New("r1", apiv1.RolloutTarget{Group: "g"}, s, "kind: Pod", []apiv1.ObjectRef{{Kind: "Pod", Namespace: "default", Name: "web"}}, names, t0)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func none(string) bool { return false }

func actions(as []Action) string {
	var out []string
	for _, a := range as {
		out = append(out, a.Kind.String()+" "+a.Node)
	}
	return strings.Join(out, ",")
}

// succeed takes a node from Pending through an answered, Ready apply.
func succeed(r *apiv1.Rollout, name string, at time.Time) {
	id := "req-" + name
	Sent(r, name, id, at)
	Accepted(r, name, id, []apiv1.RolloutPod{{Namespace: "default", Name: "web", UID: "u-" + name, Generation: 1}}, at)
	Answered(r, name, id, true, "pods run", at)
	PodsReady(r, name, func(ns, n string) (PodView, bool) {
		return PodView{UID: "u-" + name, ObservedGeneration: 1, Ready: true}, true
	}, at)
}

func fail(r *apiv1.Rollout, name, msg string, at time.Time) {
	id := "req-" + name
	Sent(r, name, id, at)
	Accepted(r, name, id, nil, at)
	Answered(r, name, id, false, msg, at)
}

func TestWavesAbortAndRollback(t *testing.T) {
	for _, tc := range []struct {
		name     string
		nodes    int
		strategy apiv1.RolloutStrategy
		// run drives the rollout after the first Step and returns the
		// actions of the Step it checks.
		run        func(r *apiv1.Rollout) []Action
		wantPhase  string
		wantAction string
		wantTotals apiv1.RolloutTotals
		wantReason string
	}{
		{
			name: "first wave sent, nothing more", nodes: 4, strategy: apiv1.RolloutStrategy{Batch: 2},
			run:       func(r *apiv1.Rollout) []Action { return Step(r, t0, none) },
			wantPhase: apiv1.RolloutRunning, wantAction: "send n0,send n1",
			wantTotals: apiv1.RolloutTotals{Targeted: 4, Pending: 4},
		},
		{
			name: "a wave finished opens the next", nodes: 4, strategy: apiv1.RolloutStrategy{Batch: 2},
			run: func(r *apiv1.Rollout) []Action {
				succeed(r, "n0", t0)
				succeed(r, "n1", t0)
				return Step(r, t0, none)
			},
			wantPhase: apiv1.RolloutRunning, wantAction: "send n2,send n3",
			wantTotals: apiv1.RolloutTotals{Targeted: 4, Applied: 2, Succeeded: 2, Pending: 2},
		},
		{
			name: "succeeded but not Ready holds the wave", nodes: 4, strategy: apiv1.RolloutStrategy{Batch: 2},
			run: func(r *apiv1.Rollout) []Action {
				succeed(r, "n0", t0)
				Sent(r, "n1", "x", t0)
				Accepted(r, "n1", "x", []apiv1.RolloutPod{{Namespace: "default", Name: "web", UID: "u1", Generation: 2}}, t0)
				Answered(r, "n1", "x", true, "runs", t0)
				// Ready, but for the previous generation.
				PodsReady(r, "n1", func(string, string) (PodView, bool) {
					return PodView{UID: "u1", ObservedGeneration: 1, Ready: true}, true
				}, t0)
				return Step(r, t0, func(n string) bool { return false })
			},
			wantPhase: apiv1.RolloutRunning, wantAction: "",
			wantTotals: apiv1.RolloutTotals{Targeted: 4, Applied: 2, Succeeded: 1, Pending: 3},
		},
		{
			name: "one failure aborts at --max-failures 0, no new wave", nodes: 4, strategy: apiv1.RolloutStrategy{Batch: 2},
			run: func(r *apiv1.Rollout) []Action {
				succeed(r, "n0", t0)
				fail(r, "n1", "ErrImageNeverPull", t0)
				return Step(r, t0, none)
			},
			wantPhase: apiv1.RolloutAborted, wantAction: "", wantReason: "1 node(s) failed (n1: ErrImageNeverPull), more than --max-failures 0",
			wantTotals: apiv1.RolloutTotals{Targeted: 4, Applied: 2, Succeeded: 1, Failed: 1, Cancelled: 2},
		},
		{
			name: "rollback marks the changed nodes, not the refused or unsent", nodes: 4, strategy: apiv1.RolloutStrategy{Batch: 3, Rollback: true},
			run: func(r *apiv1.Rollout) []Action {
				succeed(r, "n0", t0)
				fail(r, "n1", "ErrImageNeverPull", t0)
				Sent(r, "n2", "x", t0)
				Answered(r, "n2", "x", false, "refused at admission", t0) // never stored
				return Step(r, t0, none)
			},
			wantPhase: apiv1.RolloutAborted, wantAction: "rollback n0,rollback n1", wantReason: "2 node(s) failed (n1: ErrImageNeverPull, n2: refused at admission)",
			wantTotals: apiv1.RolloutTotals{Targeted: 4, Failed: 1, Cancelled: 1, RollingBack: 2},
		},
		{
			name: "failures within --max-failures go on", nodes: 4, strategy: apiv1.RolloutStrategy{Batch: 2, MaxFailures: 1},
			run: func(r *apiv1.Rollout) []Action {
				succeed(r, "n0", t0)
				fail(r, "n1", "x", t0)
				return Step(r, t0, none)
			},
			wantPhase: apiv1.RolloutRunning, wantAction: "send n2,send n3",
			wantTotals: apiv1.RolloutTotals{Targeted: 4, Applied: 2, Succeeded: 1, Failed: 1, Pending: 2},
		},
		{
			name: "percentage waits for --min-executed", nodes: 10, strategy: apiv1.RolloutStrategy{Batch: 2, MaxFailurePercent: 20, MinExecuted: 4},
			run: func(r *apiv1.Rollout) []Action {
				succeed(r, "n0", t0)
				fail(r, "n1", "x", t0)
				return Step(r, t0, none)
			},
			wantPhase: apiv1.RolloutRunning, wantAction: "send n2,send n3",
			wantTotals: apiv1.RolloutTotals{Targeted: 10, Applied: 2, Succeeded: 1, Failed: 1, Pending: 8},
		},
		{
			name: "percentage over its share after --min-executed aborts", nodes: 10, strategy: apiv1.RolloutStrategy{Batch: 2, MaxFailurePercent: 20, MinExecuted: 4},
			run: func(r *apiv1.Rollout) []Action {
				succeed(r, "n0", t0)
				fail(r, "n1", "x", t0)
				Step(r, t0, none)
				succeed(r, "n2", t0)
				succeed(r, "n3", t0)
				return Step(r, t0, none) // 1 of 4 = 25 % > 20 %
			},
			wantPhase: apiv1.RolloutAborted, wantAction: "", wantReason: "1 of 4 finished node(s) failed",
			wantTotals: apiv1.RolloutTotals{Targeted: 10, Applied: 4, Succeeded: 3, Failed: 1, Cancelled: 6},
		},
		{
			name: "timeout starts at accepted and fails the node", nodes: 2, strategy: apiv1.RolloutStrategy{Batch: 2, MaxFailures: 5, NodeTimeoutSeconds: 30},
			run: func(r *apiv1.Rollout) []Action {
				Step(r, t0, none)
				Sent(r, "n0", "a", t0)
				// Sent long ago but accepted only now: no timeout yet.
				Accepted(r, "n0", "a", nil, t0.Add(time.Hour))
				busy := func(n string) bool { return n == "n0" } // its apply is still answered
				Step(r, t0.Add(time.Hour+29*time.Second), busy)
				if r.Nodes[0].Phase != apiv1.NodeApplied {
					panic("failed before its timeout: " + r.Nodes[0].Message)
				}
				succeed(r, "n1", t0)
				return Step(r, t0.Add(time.Hour+31*time.Second), busy)
			},
			wantPhase: apiv1.RolloutSucceeded, wantAction: "", wantReason: "1 node(s) succeeded, 1 failed",
			wantTotals: apiv1.RolloutTotals{Targeted: 2, Applied: 2, Succeeded: 1, Failed: 1},
		},
		{
			name: "time offline does not count against the node timeout", nodes: 1, strategy: apiv1.RolloutStrategy{Batch: 1, NodeTimeoutSeconds: 30},
			run: func(r *apiv1.Rollout) []Action {
				Sent(r, "n0", "a", t0)
				Accepted(r, "n0", "a", nil, t0)
				Online(r, "n0", false, t0.Add(10*time.Second), t0.Add(10*time.Second))
				busy := func(n string) bool { return n == "n0" } // its apply is still answered
				Step(r, t0.Add(time.Hour), busy)                 // offline: no timeout
				Online(r, "n0", true, t0, t0.Add(time.Hour))
				return Step(r, t0.Add(time.Hour+19*time.Second), busy) // 10 s + 19 s online
			},
			wantPhase: apiv1.RolloutRunning, wantAction: "",
			wantTotals: apiv1.RolloutTotals{Targeted: 1, Applied: 1, Pending: 1},
		},
		{
			name: "an offline node is pending, not sent, and does not hold the next wave", nodes: 4, strategy: apiv1.RolloutStrategy{Batch: 2},
			run: func(r *apiv1.Rollout) []Action {
				Online(r, "n1", false, t0, t0)
				succeed(r, "n0", t0)
				return Step(r, t0, none)
			},
			wantPhase: apiv1.RolloutRunning, wantAction: "send n2,send n3",
			wantTotals: apiv1.RolloutTotals{Targeted: 4, Applied: 1, Succeeded: 1, Pending: 3, Offline: 1},
		},
		{
			name: "the rollout finishes when the offline node returns", nodes: 2, strategy: apiv1.RolloutStrategy{Batch: 2},
			run: func(r *apiv1.Rollout) []Action {
				Online(r, "n1", false, t0, t0)
				succeed(r, "n0", t0)
				if as := Step(r, t0, none); len(as) != 0 || r.Phase != apiv1.RolloutRunning {
					panic("rollout ended or sent with a node offline")
				}
				Online(r, "n1", true, t0, t0.Add(time.Minute))
				if as := Step(r, t0.Add(time.Minute), none); actions(as) != "send n1" {
					panic("not sent on return: " + actions(as))
				}
				succeed(r, "n1", t0.Add(time.Minute))
				return Step(r, t0.Add(time.Minute), none)
			},
			wantPhase: apiv1.RolloutSucceeded, wantAction: "", wantReason: "2 node(s) succeeded",
			wantTotals: apiv1.RolloutTotals{Targeted: 2, Applied: 2, Succeeded: 2},
		},
		{
			name: "resume: sent and unanswered nodes are sent again, in-flight ones not", nodes: 3, strategy: apiv1.RolloutStrategy{Batch: 3},
			run: func(r *apiv1.Rollout) []Action {
				Sent(r, "n0", "a", t0)
				Sent(r, "n1", "b", t0)
				Accepted(r, "n1", "b", nil, t0)
				Sent(r, "n2", "c", t0)
				return Step(r, t0, func(n string) bool { return n == "n2" })
			},
			wantPhase: apiv1.RolloutRunning, wantAction: "send n0,send n1",
			wantTotals: apiv1.RolloutTotals{Targeted: 3, Applied: 1, Pending: 3},
		},
		{
			name: "resume long after: a node left Applied is sent again, not timed out", nodes: 1, strategy: apiv1.RolloutStrategy{Batch: 1, NodeTimeoutSeconds: 30},
			run: func(r *apiv1.Rollout) []Action {
				Sent(r, "n0", "a", t0)
				Accepted(r, "n0", "a", nil, t0)
				return Step(r, t0.Add(time.Hour), none) // the runner died; resumed an hour later
			},
			wantPhase: apiv1.RolloutRunning, wantAction: "send n0",
			wantTotals: apiv1.RolloutTotals{Targeted: 1, Applied: 1, Pending: 1},
		},
		{
			name: "an operator's abort with rollback", nodes: 3, strategy: apiv1.RolloutStrategy{Batch: 1},
			run: func(r *apiv1.Rollout) []Action {
				succeed(r, "n0", t0)
				Step(r, t0, none)
				Sent(r, "n1", "b", t0) // may be queued for an offline node
				Abort(r, "aborted by operator", true, t0)
				return Step(r, t0, none)
			},
			wantPhase: apiv1.RolloutAborted, wantAction: "rollback n0,rollback n1", wantReason: "aborted by operator",
			wantTotals: apiv1.RolloutTotals{Targeted: 3, Cancelled: 1, RollingBack: 2},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newDoc(t, tc.nodes, tc.strategy)
			got := tc.run(r)
			if r.Phase != tc.wantPhase {
				t.Errorf("phase %s (%s), want %s", r.Phase, r.Reason, tc.wantPhase)
			}
			if a := actions(got); a != tc.wantAction {
				t.Errorf("actions %q, want %q", a, tc.wantAction)
			}
			if r.Totals != tc.wantTotals {
				t.Errorf("totals %+v, want %+v", r.Totals, tc.wantTotals)
			}
			if !strings.Contains(r.Reason, tc.wantReason) {
				t.Errorf("reason %q, want it to hold %q", r.Reason, tc.wantReason)
			}
			checkTotals(t, r)
		})
	}
}

// checkTotals: the totals add up to the nodes, whatever happened.
func checkTotals(t *testing.T, r *apiv1.Rollout) {
	t.Helper()
	tt := r.Totals
	if sum := tt.Pending + tt.Succeeded + tt.Failed + tt.Cancelled + tt.RollingBack + tt.RolledBack + tt.RollbackFailed; sum != tt.Targeted || tt.Targeted != len(r.Nodes) {
		t.Errorf("totals %+v do not add up to %d nodes", tt, len(r.Nodes))
	}
}

func TestRollbackAnswersEndTheRollout(t *testing.T) {
	r := newDoc(t, 2, apiv1.RolloutStrategy{Batch: 2, Rollback: true})
	Step(r, t0, none)
	succeed(r, "n0", t0)
	fail(r, "n1", "ErrImageNeverPull", t0)
	as := Step(r, t0, none)
	if actions(as) != "rollback n0,rollback n1" || Done(r) {
		t.Fatalf("actions %q, done %v", actions(as), Done(r))
	}
	Sent(r, "n0", "rb0", t0)
	Sent(r, "n1", "rb1", t0)
	Answered(r, "n0", "rb0", true, "restored", t0)
	Answered(r, "n1", "old-request", true, "late answer to the apply", t0) // not the rollback's
	if r.Nodes[1].Phase != apiv1.NodeRollingBack {
		t.Fatalf("an answer to another request ended the rollback: %+v", r.Nodes[1])
	}
	Answered(r, "n1", "rb1", false, "refused", t0)
	Step(r, t0, none)
	if !Done(r) || r.Totals.RolledBack != 1 || r.Totals.RollbackFailed != 1 || r.Totals.Applied != 0 {
		t.Fatalf("done %v, totals %+v", Done(r), r.Totals)
	}
	checkTotals(t, r)
}

func TestPreviousIsReadOnce(t *testing.T) {
	r := newDoc(t, 1, apiv1.RolloutStrategy{Batch: 1})
	Previous(r, "n0", "d1", "kind: Pod\nold", nil)
	Previous(r, "n0", "d2", "kind: Pod\nnew", nil) // what a resume would read: the rollout's own
	if r.Nodes[0].Previous != "d1" || len(r.Previous) != 1 || r.Previous["d1"] != "kind: Pod\nold" {
		t.Fatalf("previous overwritten: %+v %v", r.Nodes[0], r.Previous)
	}
	if err := r.Validate(); err != nil {
		t.Fatal(err)
	}
	r.Nodes[0].Previous = "missing"
	if err := r.Validate(); err == nil {
		t.Fatal("a node naming a previous manifest the document lacks was accepted")
	}
}

func TestNewRefuses(t *testing.T) {
	s := apiv1.RolloutStrategy{Batch: 1, NodeTimeoutSeconds: 1}
	if _, err := New("r1", apiv1.RolloutTarget{}, s, "x", nil, nil, t0); err == nil || !strings.Contains(err.Error(), "no node") {
		t.Errorf("empty node list: %v", err)
	}
	if _, err := New("r/1", apiv1.RolloutTarget{}, s, "x", nil, []string{"a"}, t0); err == nil {
		t.Error("rollout id with '/' accepted")
	}
	if _, err := New("r1", apiv1.RolloutTarget{}, s, "x", nil, []string{"a", "a"}, t0); err == nil {
		t.Error("node named twice accepted")
	}
}

// An accepted answer without uids still waits for every pod of the
// manifests to be Ready.
func TestAcceptedWithoutUIDsWaitsForReady(t *testing.T) {
	r := newDoc(t, 1, apiv1.RolloutStrategy{Batch: 1})
	Sent(r, "n0", "a", t0)
	Answered(r, "n0", "a", true, "runs", t0) // no accepted seen
	if r.Nodes[0].Phase != apiv1.NodeApplied || len(r.Nodes[0].Pods) != 1 {
		t.Fatalf("succeeded without its pod Ready: %+v", r.Nodes[0])
	}
	PodsReady(r, "n0", func(string, string) (PodView, bool) { return PodView{UID: "any", Ready: true}, true }, t0)
	if r.Nodes[0].Phase != apiv1.NodeSucceeded {
		t.Fatalf("not succeeded once Ready: %+v", r.Nodes[0])
	}
}
