package e2e

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/mqlet/mqlet/agent/inflight"
	apiv1 "github.com/mqlet/mqlet/api/v1"
)

// A spec update replaces a container; the old one, stopped gracefully,
// exits 0. Under OnFailure or Never that exit must not be read as the pod
// finishing, nor the replacement as a crash held back by the crash-loop
// backoff: the new spec's container runs.

// specVersion is a container command that exits 0 on SIGTERM and names
// its version in its command line, so CRI tells which spec runs.
func specVersion(v int) string {
	return fmt.Sprintf("trap 'exit 0' TERM; : spec-v%d; sleep 3600 & wait", v)
}

// defaultBackoffEnv is a pod env with the default crash-loop numbers (10 s
// base): the ones the lost update was seen with.
func defaultBackoffEnv(t *testing.T) *podEnv {
	return startPodEnv(t, func(logDir string) string {
		return fmt.Sprintf(`runtime:
  plegPeriod: 500ms
  podLogDir: %s
pods:
  backoffBase: 10s
  backoffMax: 40s
telemetry:
  metricsInterval: 0s
`, logDir)
	})
}

// runsVersion reports whether pod name runs exactly one container, and it
// is the one of spec version v (its command line, read from CRI).
func (e *podEnv) runsVersion(name string, v int) bool {
	e.t.Helper()
	run := e.cri.Running(e.ns, name)
	if len(run) != 1 {
		return false
	}
	ctx, cancel := criCtx()
	defer cancel()
	st, err := e.rt.ContainerStatus(ctx, run[0].Id, true)
	if err != nil {
		return false
	}
	return strings.Contains(st.GetInfo()["info"], fmt.Sprintf("spec-v%d;", v))
}

// staysRunning watches pod name's published status for d and fails if
// it ever says the pod finished, or stops running version v.
func (e *podEnv) staysRunning(name string, v int, d time.Duration) {
	e.t.Helper()
	end := time.Now().Add(d)
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for time.Now().Before(end) {
		if p, ok := e.status(name); ok && p != nil && p.Status.Phase != v1.PodRunning {
			e.t.Fatalf("%s: phase %s after the update to v%d, want Running: %s", name, p.Status.Phase, v, dump(p.Status))
		}
		if !e.runsVersion(name, v) {
			e.t.Fatalf("%s: no longer runs exactly the container of v%d: %s", name, v, dump(e.cri.Containers(e.ns, name)))
		}
		<-tick.C
	}
}

// Three updates a second apart, no fault: the last spec runs, the pod is
// Running (not Succeeded), and the last apply answers succeeded with the
// containers running.
func TestPodSpecUpdatesOfFinishingPolicyPodsRun(t *testing.T) {
	e := defaultBackoffEnv(t)
	names := map[string]string{"onfail": "OnFailure", "never": "Never"}
	e.cleanupPods("onfail", "never")
	for name, policy := range names {
		e.apply(e.pod(name, policy, specVersion(0)), apiv1.Succeeded, podReadyTimeout)
		if !e.runsVersion(name, 0) {
			t.Fatalf("%s does not run v0: %s", name, dump(e.cri.Containers(e.ns, name)))
		}
	}

	last := map[string]string{}
	for v := 1; v <= 3; v++ {
		if v > 1 {
			time.Sleep(time.Second) // the pace of the updates, not a wait for an outcome
		}
		for name, policy := range names {
			last[name] = e.nextID("apply")
			e.mq.Command(e.node, "apply", last[name], e.pod(name, policy, specVersion(v)))
		}
	}
	for name := range names {
		r := e.waitFinalAny(last[name], podReadyTimeout)
		if r.Phase != apiv1.Succeeded || !strings.Contains(r.Message, "running") {
			t.Fatalf("%s: last apply ended %s (%s), want succeeded with the containers running", name, r.Phase, r.Message)
		}
		Eventually(t, podReadyTimeout, name+" runs v3", func() bool { return e.runsVersion(name, 3) })
		e.waitStatus(name, 30*time.Second, "Running with main running", func(p *v1.Pod) bool {
			cs, ok := containerStatus(p, "main", false)
			return p.Status.Phase == v1.PodRunning && ok && cs.State.Running != nil
		})
	}
	// Past a crash-loop backoff step: the pod is not finished late either.
	for name := range names {
		e.staysRunning(name, 3, 12*time.Second)
	}
}

// The agent killed between stopping the old container and starting the
// new one: the restarted agent starts the new spec's container.
func TestPodSpecUpdateInterruptedResumes(t *testing.T) {
	e := defaultBackoffEnv(t)
	e.cleanupPods("never")
	e.apply(e.pod("never", "Never", specVersion(0)), apiv1.Succeeded, podReadyTimeout)
	old := e.cri.Running(e.ns, "never")
	if len(old) != 1 {
		t.Fatalf("running containers = %s, want 1", dump(old))
	}

	e.agent.Stop()
	mark := e.mq.Mark()
	e.agent.RestartWithFaults("cri.after-kill-changed")
	e.mq.WaitState(mark, e.node, "online", 30*time.Second)
	id := e.nextID("apply")
	e.mq.Command(e.node, "apply", id, e.pod("never", "Never", specVersion(1)))
	if !e.agent.WaitExit(podReadyTimeout) {
		t.Fatal("mqlet did not reach cri.after-kill-changed")
	}
	for _, c := range e.cri.Containers(e.ns, "never") {
		if c.Id == old[0].Id && c.State == runtimeapi.ContainerState_CONTAINER_RUNNING {
			t.Fatalf("the old container still runs after the fault point: %s", dump(c))
		}
	}
	if run := e.cri.Running(e.ns, "never"); len(run) != 0 {
		t.Fatalf("a container runs after the fault point, want none yet: %s", dump(run))
	}
	clearSyncMarks(t, e.stateDir)

	mark = e.mq.Mark()
	e.agent.RestartWithFaults("")
	e.mq.WaitState(mark, e.node, "online", 30*time.Second)
	Eventually(t, podReadyTimeout, "never runs v1 after the restart", func() bool { return e.runsVersion("never", 1) })
	e.waitStatus("never", 30*time.Second, "Running with main running", func(p *v1.Pod) bool {
		cs, ok := containerStatus(p, "main", false)
		return p.Status.Phase == v1.PodRunning && ok && cs.State.Running != nil
	})
	r := e.apply(e.pod("never", "Never", specVersion(1)), apiv1.Succeeded, podReadyTimeout)
	if !strings.Contains(r.Message, "running") {
		t.Fatalf("re-apply of v1 answered %q, want the containers running", r.Message)
	}
	e.staysRunning("never", 1, 5*time.Second)
}

// clearSyncMarks clears the mark a fault-point kill leaves on the sync it
// interrupted, so the restarted agent does not quarantine the pod as the
// one that stopped it (the poison guard's scenario, not this test's).
func clearSyncMarks(t *testing.T, stateDir string) {
	t.Helper()
	f, err := inflight.Open(filepath.Join(stateDir, "inflight-syncs"), 1)
	if err != nil {
		t.Fatalf("reading the sync marks: %v", err)
	}
	defer f.Close()
	if left := f.Left(); len(left) > 0 {
		t.Logf("the kill landed while %v was synced; clearing its mark", left)
		if err := f.Reset(); err != nil {
			t.Fatal(err)
		}
	}
}
