package e2e

import (
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	apiv1 "github.com/mqlet/mqlet/api/v1"
)

// created is one container attempt as CRI reported it: when it was created
// and, once it has exited, when it finished.
type created struct {
	id       string
	at       time.Time
	finished time.Time
}

// attempts polls CRI until container main of pod name has had n distinct
// containers, and returns them in creation order with the finish time of
// each one seen exited.
func (e *podEnv) attempts(name string, n int, timeout time.Duration) []created {
	e.t.Helper()
	seen := map[string]*created{}
	Eventually(e.t, timeout, strconv.Itoa(n)+" attempts of "+name, func() bool {
		for _, c := range e.cri.Containers(e.ns, name) {
			a := seen[c.Id]
			if a == nil {
				a = &created{id: c.Id, at: time.Unix(0, c.CreatedAt)}
				seen[c.Id] = a
			}
			if a.finished.IsZero() && c.State == runtimeapi.ContainerState_CONTAINER_EXITED {
				ctx, cancel := criCtx()
				st, err := e.rt.ContainerStatus(ctx, c.Id, false)
				cancel()
				if err == nil && st.GetStatus().GetFinishedAt() != 0 {
					a.finished = time.Unix(0, st.GetStatus().GetFinishedAt())
				}
			}
		}
		return len(seen) >= n
	})
	out := make([]created, 0, len(seen))
	for _, a := range seen {
		out = append(out, *a)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].at.Before(out[j].at) })
	return out
}

// noNewContainer fails if, during window, pod name gets a container other
// than the ones in ids.
func (e *podEnv) noNewContainer(name string, ids map[string]bool, window time.Duration) {
	e.t.Helper()
	end := time.Now().Add(window)
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for time.Now().Before(end) {
		for _, c := range e.cri.Containers(e.ns, name) {
			if !ids[c.Id] {
				e.t.Fatalf("pod %s got a new container %s (state %s) but must not be restarted", name, c.Id, c.State)
			}
		}
		<-tick.C
	}
}

// Always restarts a failing container with doubling delays (1 s base, 4 s cap)
// and reports CrashLoopBackOff.
func TestPodRestartAlwaysBacksOff(t *testing.T) {
	e := newPodEnv(t, "")
	e.cleanupPods("crash")
	id := e.nextID("apply")
	e.mq.Command(e.node, "apply", id, e.pod("crash", "Always", "exit 1"))
	e.mq.WaitReply(e.node, id, apiv1.Accepted, 30*time.Second)

	p := e.waitStatus("crash", 60*time.Second, "in CrashLoopBackOff", func(p *v1.Pod) bool {
		cs, ok := containerStatus(p, "main", false)
		return ok && cs.State.Waiting != nil && cs.State.Waiting.Reason == "CrashLoopBackOff"
	})
	cs, _ := containerStatus(p, "main", false)
	if cs.LastTerminationState.Terminated == nil || cs.LastTerminationState.Terminated.ExitCode != 1 {
		t.Errorf("CrashLoopBackOff status lacks the last exit (code 1): %s", dump(cs))
	}

	const n = 6
	att := e.attempts("crash", n, 90*time.Second)
	// The backoff is counted from the exit of the attempt before (as the
	// kubelet counts it from FinishedAt), so the wait is measured from that
	// exit to the next creation: the container's own start and run time,
	// which grow on a loaded machine, are not part of it.
	var waits []time.Duration
	for i := 1; i < len(att); i++ {
		if att[i-1].finished.IsZero() {
			t.Fatalf("attempt %d (%s) was replaced but never seen exited", i, att[i-1].id)
		}
		waits = append(waits, att[i].at.Sub(att[i-1].finished))
	}
	t.Logf("waits from an exit to the next creation: %v", waits)
	// Attempt 2 starts at once; then the waits are 1 s, 2 s, 4 s, 4 s (the
	// cap). Each is a lower bound: the exit's discovery (500 ms PLEG), the
	// sync and CreateContainer come on top, and on a loaded machine that
	// took up to 5.5 s, so the upper bound only catches a wait far too long.
	want := []time.Duration{0, time.Second, 2 * time.Second, 4 * time.Second, 4 * time.Second}
	const clockSkew = 50 * time.Millisecond // CRI times come from runc and containerd
	const tooLong = 15 * time.Second
	for i, w := range want[:min(len(want), len(waits))] {
		if waits[i] < w-clockSkew || waits[i] > w+tooLong {
			t.Errorf("wait %d = %v, want at least %v (and less than %v)", i+1, waits[i], w, w+tooLong)
		}
	}
	// The cap: the back-off the agent reports (the kubelet's message names
	// the whole back-off) stops at 4 s and stays there.
	backoffOf := func(p *v1.Pod) string {
		cs, ok := containerStatus(p, "main", false)
		if !ok || cs.State.Waiting == nil || cs.State.Waiting.Reason != "CrashLoopBackOff" {
			return ""
		}
		return cs.State.Waiting.Message
	}
	e.waitStatus("crash", 30*time.Second, "CrashLoopBackOff of 4s", func(p *v1.Pod) bool {
		return strings.HasPrefix(backoffOf(p), "back-off 4s ")
	})
	after := e.attempts("crash", n+1, 30*time.Second)
	p = e.waitStatus("crash", 30*time.Second, "CrashLoopBackOff after attempt "+strconv.Itoa(len(after)), func(p *v1.Pod) bool {
		cs, ok := containerStatus(p, "main", false)
		return ok && cs.RestartCount >= int32(len(after)-1) && backoffOf(p) != ""
	})
	if m := backoffOf(p); !strings.HasPrefix(m, "back-off 4s ") {
		t.Errorf("after %d attempts the back-off is %q, want the cap of 4s", len(after), m)
	}
	p = e.waitStatus("crash", 30*time.Second, "restartCount >= 4", func(p *v1.Pod) bool {
		cs, ok := containerStatus(p, "main", false)
		return ok && cs.RestartCount >= 4
	})
	if p.Status.Phase != v1.PodRunning && p.Status.Phase != v1.PodPending {
		t.Errorf("a crash-looping Always pod has phase %s, want Running or Pending", p.Status.Phase)
	}
}

// Never leaves a failed container alone and the pod Failed.
func TestPodRestartNeverFails(t *testing.T) {
	e := newPodEnv(t, "")
	e.cleanupPods("once")
	// The reply may say succeeded (the container ran) or failed (it had
	// already exited when looked at); what counts is what happens next.
	id := e.nextID("apply")
	e.mq.Command(e.node, "apply", id, e.pod("once", "Never", "exit 1"))
	e.mq.WaitReply(e.node, id, apiv1.Accepted, 30*time.Second)
	p := e.waitStatus("once", 30*time.Second, "phase Failed", func(p *v1.Pod) bool { return p.Status.Phase == v1.PodFailed })
	cs, _ := containerStatus(p, "main", false)
	if cs.State.Terminated == nil || cs.State.Terminated.ExitCode != 1 || cs.RestartCount != 0 {
		t.Fatalf("status of main = %s, want terminated with exit 1 and no restarts", dump(cs))
	}
	list := e.cri.Containers(e.ns, "once")
	if len(list) != 1 || list[0].State != runtimeapi.ContainerState_CONTAINER_EXITED {
		t.Fatalf("CRI containers of once = %s, want one exited", dump(list))
	}
	// Longer than the whole backoff cap plus relists: no restart may come.
	e.noNewContainer("once", map[string]bool{list[0].Id: true}, 8*time.Second)
}

// OnFailure restarts a failing container but not one that exited 0.
func TestPodRestartOnFailure(t *testing.T) {
	e := newPodEnv(t, "")
	e.cleanupPods("ok", "bad")
	e.apply(e.pod("ok", "OnFailure", "exit 0"), apiv1.Succeeded, podReadyTimeout)
	badID := e.nextID("apply")
	e.mq.Command(e.node, "apply", badID, e.pod("bad", "OnFailure", "exit 1"))
	e.mq.WaitReply(e.node, badID, apiv1.Accepted, 30*time.Second)

	p := e.waitStatus("ok", 30*time.Second, "phase Succeeded", func(p *v1.Pod) bool { return p.Status.Phase == v1.PodSucceeded })
	if cs, _ := containerStatus(p, "main", false); cs.State.Terminated == nil || cs.State.Terminated.ExitCode != 0 || cs.RestartCount != 0 {
		t.Fatalf("status of ok/main = %s, want terminated 0, no restarts", dump(cs))
	}
	ok := e.cri.Containers(e.ns, "ok")
	if len(ok) != 1 || ok[0].State != runtimeapi.ContainerState_CONTAINER_EXITED {
		t.Fatalf("CRI containers of ok = %s, want one exited", dump(ok))
	}

	// The failing one is restarted: a second attempt exists in CRI and the
	// status counts restarts.
	att := e.attempts("bad", 3, 60*time.Second)
	t.Logf("bad: %d attempts", len(att))
	e.waitStatus("bad", 30*time.Second, "restartCount >= 2", func(p *v1.Pod) bool {
		cs, ok := containerStatus(p, "main", false)
		return ok && cs.RestartCount >= 2
	})
	e.noNewContainer("ok", map[string]bool{ok[0].Id: true}, 2*time.Second)
}
