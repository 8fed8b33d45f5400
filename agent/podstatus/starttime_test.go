package podstatus

import (
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/mqlet/mqlet/cri"
)

func TestAdoptedPodKeepsItsSandboxStartTime(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	started := now.Add(-3 * time.Hour)
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "d", UID: "u"},
		Spec: v1.PodSpec{RestartPolicy: v1.RestartPolicyAlways, Containers: []v1.Container{{Name: "c", Image: "i"}}}}
	rs := &cri.PodStatus{UID: "u", Sandboxes: []cri.SandboxStatus{{ID: "s2", Ready: true, CreatedAt: now.Add(-time.Hour)}, {ID: "s1", CreatedAt: started}}}
	st := Build(pod, rs, Hints{}, now)
	if st.StartTime == nil || !st.StartTime.Time.Equal(started) {
		t.Fatalf("start time %v, want the oldest sandbox %v", st.StartTime, started)
	}
	if fresh := Build(pod, nil, Hints{}, now); !fresh.StartTime.Time.Equal(now) {
		t.Fatalf("a pod unknown to the runtime starts now, got %v", fresh.StartTime)
	}
}

// After a restart the first status may be built before the runtime
// answers (start time "now"); the pod's older sandbox corrects it.
func TestOlderSandboxCorrectsAStartTimeMadeAtARestart(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	started := now.Add(-time.Hour)
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "d", UID: "u"},
		Spec: v1.PodSpec{RestartPolicy: v1.RestartPolicyAlways, Containers: []v1.Container{{Name: "c", Image: "i"}}}}
	unreachable := Build(pod, nil, Hints{RuntimeUnreachable: true}, now)
	rs := &cri.PodStatus{UID: "u", Sandboxes: []cri.SandboxStatus{{ID: "s1", Ready: true, CreatedAt: started}}}
	st := Build(pod, rs, Hints{Previous: &unreachable}, now.Add(time.Second))
	if st.StartTime == nil || !st.StartTime.Time.Equal(started) {
		t.Fatalf("start time %v, want the sandbox's %v", st.StartTime, started)
	}
	// A newer sandbox (a new attempt) leaves it alone.
	rs.Sandboxes = append([]cri.SandboxStatus{{ID: "s2", Ready: true, CreatedAt: now}}, rs.Sandboxes[1:]...)
	if again := Build(pod, rs, Hints{Previous: &st}, now.Add(2*time.Second)); !again.StartTime.Time.Equal(started) {
		t.Fatalf("start time moved to %v", again.StartTime)
	}
}
