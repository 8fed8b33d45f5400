package cri

import (
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
)

// A restart request lets the containers it names start through their
// crash-loop backoff (found by the key of their current spec), and only them.
func TestSkipBackoffForcesOnlyWhatIsRestarted(t *testing.T) {
	pod := testPod(v1.RestartPolicyAlways, nil, "a", "b")
	a, b := &pod.Spec.Containers[0], &pod.Spec.Containers[1]
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	held := &fakeBackoff{since: map[string]time.Time{BackoffKey(pod, a): t0, BackoffKey(pod, b): t0}}
	for _, tt := range []struct {
		name         string
		only         string
		waitA, waitB bool
	}{
		{"the whole pod", "", false, false},
		{"container a", "a", false, true},
		{"container b", "b", true, false},
	} {
		s := skipBackoff{next: held, pod: pod, only: tt.only}
		if got, _ := s.InBackoff(BackoffKey(pod, a), t0); got != tt.waitA {
			t.Errorf("%s: a waits %v, want %v", tt.name, got, tt.waitA)
		}
		if got, _ := s.InBackoff(BackoffKey(pod, b), t0); got != tt.waitB {
			t.Errorf("%s: b waits %v, want %v", tt.name, got, tt.waitB)
		}
	}
}
