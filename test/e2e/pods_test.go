package e2e

import (
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	apiv1 "github.com/mqlet/mqlet/api/v1"
)

// An applied pod runs in containerd; a deleted one leaves nothing behind
// and its retained status topic is cleared.
func TestPodApplyRunsAndDeleteRemoves(t *testing.T) {
	e := newPodEnv(t, "")
	start := time.Now()
	r := e.apply(e.pod("web", "Always", "sleep 3600"), apiv1.Succeeded, podReadyTimeout)
	t.Logf("apply succeeded after %v: %s", time.Since(start), r.Message)

	running := e.cri.Running(e.ns, "web")
	if len(running) != 1 || running[0].GetMetadata().GetName() != "main" {
		t.Fatalf("CRI running containers of web = %s, want exactly main", dump(running))
	}
	if sbs := e.cri.Sandboxes(e.ns, "web"); len(sbs) != 1 {
		t.Fatalf("CRI sandboxes of web = %s, want 1", dump(sbs))
	}
	p := e.waitStatus("web", 30*time.Second, "status Running", func(p *v1.Pod) bool { return p.Status.Phase == v1.PodRunning })
	if cs, ok := containerStatus(p, "main", false); !ok || cs.State.Running == nil || cs.ContainerID == "" {
		t.Fatalf("published status of main = %s, want running with an id", dump(cs))
	}

	delStart := time.Now()
	e.deletePod("web")
	took := time.Since(delStart)
	t.Logf("delete succeeded after %v", took)
	// sleep ignores SIGTERM as PID 1, so the pod's own 2 s grace period ends
	// it; the runtime's 30 s default must not be used.
	if took > 15*time.Second {
		t.Fatalf("delete took %v; the pod's terminationGracePeriodSeconds is 2", took)
	}
	if n := len(e.cri.Containers(e.ns, "web")); n != 0 {
		t.Fatalf("after delete succeeded CRI still lists %d containers of web", n)
	}
	if n := len(e.cri.Sandboxes(e.ns, "web")); n != 0 {
		t.Fatalf("after delete succeeded CRI still lists %d sandboxes of web", n)
	}
	Eventually(t, 30*time.Second, "retained status of web cleared", func() bool {
		p, seen := e.status("web")
		return seen && p == nil
	})
	// The clear must be retained: a new subscriber sees no status at all.
	late := Connect(t, e.broker.URL())
	late.Subscribe(e.podTopic("web"))
	late.Subscribe(prefix + "/" + e.node + "/state") // retained online: proves retained delivery happened
	late.WaitFor(0, 10*time.Second, "retained state", func(m Msg) bool { return m.Retained })
	for _, m := range late.Messages() {
		if m.Topic == e.podTopic("web") && len(m.Payload) > 0 {
			t.Fatalf("a new subscriber still gets a status for deleted pod web: %s", m.Payload)
		}
	}
}
