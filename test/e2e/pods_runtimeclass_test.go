package e2e

import (
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	apiv1 "github.com/mqlet/mqlet/api/v1"
)

// A pod naming a RuntimeClass of runtime.classes runs on the class's
// handler (runc-b, a second runc handler of the test containerd), as the
// sandbox's status in CRI says; a pod naming a class the node does not
// know is refused at apply, naming it, and nothing is stored or run.
func TestRuntimeClassPicksTheHandler(t *testing.T) {
	e := startPodEnv(t, func(logDir string) string {
		return strings.Replace(podTestConfig(logDir, ""), "runtime:\n", `runtime:
  classes:
  - name: second
    handler: runc-b
    overhead: {memory: 8Mi}
`, 1)
	})
	e.cleanupPods("rc", "rcdefault")
	withClass := func(name, class string) []byte {
		return []byte(strings.Replace(string(e.pod(name, "Always", "sleep 3600")), "spec:\n", "spec:\n  runtimeClassName: "+class+"\n", 1))
	}
	e.apply(withClass("rc", "second"), apiv1.Succeeded, podReadyTimeout)
	e.apply(e.pod("rcdefault", "Always", "sleep 3600"), apiv1.Succeeded, podReadyTimeout)
	handler := func(name string) string {
		t.Helper()
		sbs := e.cri.Sandboxes(e.ns, name)
		if len(sbs) != 1 {
			t.Fatalf("pod %s: %d sandboxes, want 1", name, len(sbs))
		}
		ctx, cancel := criCtx()
		defer cancel()
		st, err := e.rt.PodSandboxStatus(ctx, sbs[0].Id, false)
		if err != nil {
			t.Fatalf("PodSandboxStatus: %v", err)
		}
		if sbs[0].RuntimeHandler != st.GetStatus().GetRuntimeHandler() {
			t.Errorf("listing says handler %q, status %q", sbs[0].RuntimeHandler, st.GetStatus().GetRuntimeHandler())
		}
		return st.GetStatus().GetRuntimeHandler()
	}
	if got := handler("rc"); got != "runc-b" {
		t.Errorf("pod of class second runs on handler %q, want runc-b", got)
	}
	if got := handler("rcdefault"); got != "" && got != "runc" {
		t.Errorf("pod without a class runs on handler %q, want the default", got)
	}
	p := e.waitStatus("rc", 30*time.Second, "running", func(p *v1.Pod) bool { return p.Status.Phase == v1.PodRunning })
	if p.Spec.Overhead.Memory().String() != "8Mi" {
		t.Errorf("published overhead %v, want the class's memory 8Mi", p.Spec.Overhead)
	}

	got := e.apply(withClass("rcunknown", "kata"), apiv1.Failed, 30*time.Second)
	if !strings.Contains(got.Message, `spec.runtimeClassName: Not found: "kata"`) || !strings.Contains(got.Message, "known: second") {
		t.Errorf("unknown class: reply %q, want it named", got.Message)
	}
	if sbs := e.cri.Sandboxes(e.ns, "rcunknown"); len(sbs) != 0 {
		t.Errorf("the refused pod has %d sandboxes", len(sbs))
	}
}
