package cri

import (
	"context"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// A Never pod whose container's start is cut short, as a kill of the
// agent cuts it (the call's context ends while containerd starts the
// task), is not finished: containerd records the attempt exited with
// StartError and no start time, the start mark says the agent made that
// record, and the next sync runs the container. Without the mark the
// attempt reads as a failed run and the Never pod never runs its spec.
func TestInterruptedStartIsNotARun(t *testing.T) {
	e := newEnv(t)
	pod := e.newPod(v1.RestartPolicyNever, sleeper("main"))
	st := e.syncUntil(pod, 30*time.Second, "container running", isRunning("main"))
	svc, err := e.m.conn.get()
	if err != nil {
		t.Fatal(err)
	}
	// Replace the running attempt by one created from the same spec whose
	// start is cut short (the first attempt goes, as if it had never been).
	first := latest(st, "main")
	listed, err := svc.runtime.ListContainers(e.ctx, &runtimeapi.ContainerFilter{Id: first.ID})
	if err != nil || len(listed) != 1 {
		t.Fatalf("listing the running container: %v (%d found)", err, len(listed))
	}
	if err := svc.runtime.StopContainer(e.ctx, first.ID, 0); err != nil {
		t.Fatal(err)
	}
	if err := svc.runtime.RemoveContainer(e.ctx, first.ID); err != nil {
		t.Fatal(err)
	}
	sandboxCfg, err := e.m.buildSandboxConfig(pod, st.Sandboxes[0].Attempt)
	if err != nil {
		t.Fatal(err)
	}
	cfg := &runtimeapi.ContainerConfig{
		Metadata: &runtimeapi.ContainerMetadata{Name: "main", Attempt: 1},
		Image:    &runtimeapi.ImageSpec{Image: pod.Spec.Containers[0].Image},
		Command:  []string{"sleep", "3600"},
		Labels:   listed[0].Labels, Annotations: listed[0].Annotations,
		LogPath: "main/1.log",
	}
	id, err := svc.runtime.CreateContainer(e.ctx, st.Sandboxes[0].ID, cfg, sandboxCfg)
	if err != nil {
		t.Fatal(err)
	}
	clearMark, err := e.m.markStarting(string(pod.UID), id)
	if err != nil {
		t.Fatal(err)
	}
	_ = clearMark // the agent "died" in the call: nobody clears the mark
	// containerd's own record of a start cut short: exited, StartError,
	// never started. A cut can also land before the call reaches
	// containerd (the container stays created, nothing was cut): then the
	// start is cut again, a little later each time.
	cutShort := false
	for _, after := range []time.Duration{time.Millisecond, 3 * time.Millisecond, 10 * time.Millisecond, 30 * time.Millisecond} {
		cut, cancel := context.WithTimeout(e.ctx, after)
		err := svc.runtime.StartContainer(cut, id)
		cancel()
		if err == nil {
			t.Fatalf("the start finished within %v: nothing was cut short (a start takes tens of ms here)", after)
		}
		if cutShort = e.waitStartError(svc, id, 10*time.Second); cutShort {
			break
		}
	}
	if !cutShort {
		t.Fatal("no cut start was recorded as StartError by containerd (the container stayed created after every cut)")
	}
	if c := latest(e.status(pod), "main"); c == nil || c.ID != id || c.State != ContainerCreated {
		t.Fatalf("the cut attempt reads as %+v, want created (not started)", c)
	}
	st = e.syncUntil(pod, 30*time.Second, "the spec running after the cut start", isRunning("main"))
	if c := latest(st, "main"); c.ID == id {
		t.Fatalf("the cut attempt %s reads as running", id)
	}
	// The same record without the mark is a start that failed: a Never
	// pod's run, not started again.
	if m := e.m.startInterrupted(string(pod.UID), &ContainerStatus{ID: "ab12", State: ContainerExited, Reason: "StartError"}); m {
		t.Fatal("a StartError without a mark reads as interrupted")
	}
}

// waitStartError waits up to limit for containerd to record container id
// as a start cut short (exited, StartError, never started); false if it is
// still created then. Any other record fails the test.
func (e *env) waitStartError(svc *services, id string, limit time.Duration) bool {
	e.t.Helper()
	deadline := time.Now().Add(limit)
	for {
		resp, err := svc.runtime.ContainerStatus(e.ctx, id, false)
		if err != nil {
			e.t.Fatal(err)
		}
		s := resp.GetStatus()
		switch s.State {
		case runtimeapi.ContainerState_CONTAINER_EXITED:
			if s.Reason != "StartError" || s.StartedAt != 0 {
				e.t.Fatalf("containerd recorded reason %q, started %d; want StartError and no start", s.Reason, s.StartedAt)
			}
			return true
		case runtimeapi.ContainerState_CONTAINER_CREATED:
		default:
			e.t.Fatalf("the cut start is %v, want exited with StartError", s.State)
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(100 * time.Millisecond)
	}
}
