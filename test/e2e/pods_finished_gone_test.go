package e2e

import (
	"encoding/json"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	apiv1 "github.com/mqlet/mqlet/api/v1"
)

// A finished job (Never, or OnFailure after exit 0) is never run again,
// also once its exited containers are gone from the runtime: removed by
// mqlet's own GC (maxDeadPerContainer: 0), or by someone else (an
// operator's crictl rm, another agent's GC on a shared containerd: chaos
// seed 2, p18–p23 re-run at once). The runtime then lists only the stopped
// sandbox, which alone does not say the pod ran; the pod's published
// phase does.

func TestPodFinishedJobNotRunAgainWhenGCRemovedItsContainers(t *testing.T) {
	e := newPodEnv(t, "gc: {interval: 1s, minDeadAge: 1s, maxDeadPerContainer: 0, imageGCHighPercent: 0}\n")
	for _, policy := range []string{"Never", "OnFailure"} {
		t.Run(policy, func(t *testing.T) { e.finishedStaysFinished(t, "gc-"+lowerPolicy(policy), policy, false) })
	}
}

func TestPodFinishedJobNotRunAgainWhenItsContainersWereRemoved(t *testing.T) {
	e := newPodEnv(t, "")
	for _, policy := range []string{"Never", "OnFailure"} {
		t.Run(policy, func(t *testing.T) { e.finishedStaysFinished(t, "rm-"+lowerPolicy(policy), policy, true) })
	}
}

func lowerPolicy(p string) string {
	if p == "OnFailure" {
		return "onfailure"
	}
	return "never"
}

// finishedStaysFinished runs a job to Succeeded, waits until its exited
// containers are gone (removeThem: the test removes them through CRI, else
// GC does), and then checks for a while that no new sandbox or container
// of it appears and its status stays Succeeded.
func (e *podEnv) finishedStaysFinished(t *testing.T, name, policy string, removeThem bool) {
	e.cleanupPods(name)
	e.apply(e.pod(name, policy, "echo done > /dev/termination-log; exit 0"), apiv1.Succeeded, podReadyTimeout)
	e.waitStatus(name, podReadyTimeout, "Succeeded", func(p *v1.Pod) bool { return p.Status.Phase == v1.PodSucceeded })
	Eventually(t, 30*time.Second, name+"'s sandbox stopped", func() bool {
		sbs := e.cri.Sandboxes(e.ns, name)
		return len(sbs) == 1 && sbs[0].State != runtimeapi.PodSandboxState_SANDBOX_READY
	})
	sandboxes := e.sandboxIDs(name)
	if removeThem {
		ctx, cancel := criCtx()
		for _, c := range e.cri.Containers(e.ns, name) {
			if err := e.rt.RemoveContainer(ctx, c.Id); err != nil {
				cancel()
				t.Fatalf("removing container %s of %s: %v", c.Id, name, err)
			}
		}
		cancel()
	}
	Eventually(t, 30*time.Second, name+"'s exited containers gone", func() bool { return len(e.cri.Containers(e.ns, name)) == 0 })
	mark := e.mq.Mark()

	// The removal is seen at the next relist (500 ms) and the pod synced at
	// once: a re-run would show within this window many times over.
	end := time.Now().Add(8 * time.Second)
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for time.Now().Before(end) {
		if got := e.sandboxIDs(name); len(got) != len(sandboxes) || (len(got) == 1 && got[0] != sandboxes[0]) {
			t.Fatalf("finished %s pod %s got a new sandbox after its containers were removed: sandboxes %v, was %v; containers %s",
				policy, name, got, sandboxes, dump(e.cri.Containers(e.ns, name)))
		}
		if cs := e.cri.Containers(e.ns, name); len(cs) > 0 {
			t.Fatalf("finished %s pod %s was run again after its containers were removed: %s", policy, name, dump(cs))
		}
		<-tick.C
	}
	msgs := e.mq.Messages()
	for i := mark; i < len(msgs); i++ {
		var p v1.Pod
		if msgs[i].Topic != e.podTopic(name) || len(msgs[i].Payload) == 0 || json.Unmarshal(msgs[i].Payload, &p) != nil {
			continue
		}
		if p.Status.Phase != v1.PodSucceeded {
			t.Fatalf("finished pod %s published %s after its containers were removed: %s", name, p.Status.Phase, dump(p.Status.ContainerStatuses))
		}
	}
	if p, _ := e.status(name); p == nil || p.Status.Phase != v1.PodSucceeded {
		t.Fatalf("finished pod %s is not published Succeeded at the end: %v", name, p)
	}
}
