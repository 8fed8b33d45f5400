package e2e

import (
	"fmt"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	apiv1 "github.com/mqlet/mqlet/api/v1"
)

// A failing init container keeps the app containers from being created.
func TestPodFailingInitBlocksApp(t *testing.T) {
	e := newPodEnv(t, "")
	e.cleanupPods("gated")
	pod := fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: gated, namespace: %s}
spec:
  restartPolicy: Always
  terminationGracePeriodSeconds: 2
  initContainers:
  - name: init
    image: docker.io/mqlet/busybox:test
    imagePullPolicy: Never
    command: ["sh", "-c", "exit 3"]
  containers:
  - name: main
    image: docker.io/mqlet/busybox:test
    imagePullPolicy: Never
    command: ["sleep", "3600"]
`, e.ns)
	id := e.nextID("apply")
	e.mq.Command(e.node, "apply", id, []byte(pod))
	e.mq.WaitReply(e.node, id, apiv1.Accepted, 30*time.Second)

	// Watch long enough for several init attempts (1 s, 2 s backoff).
	inits := map[string]bool{}
	end := time.Now().Add(12 * time.Second)
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for time.Now().Before(end) {
		for _, c := range e.cri.Containers(e.ns, "gated") {
			switch name := c.GetMetadata().GetName(); name {
			case "init":
				inits[c.Id] = true
			default:
				t.Fatalf("container %s (state %s) was created while init keeps failing", name, c.State)
			}
		}
		<-tick.C
	}
	if len(inits) < 2 {
		t.Fatalf("init container was attempted %d times in 12 s, want it retried (>= 2)", len(inits))
	}
	t.Logf("init attempts seen: %d", len(inits))
	p := e.waitStatus("gated", 10*time.Second, "pending with init failing", func(p *v1.Pod) bool {
		ics, ok := containerStatus(p, "init", true)
		return ok && ics.RestartCount >= 1 && p.Status.Phase == v1.PodPending
	})
	if cs, ok := containerStatus(p, "main", false); ok && (cs.State.Running != nil || cs.ContainerID != "") {
		t.Fatalf("main reported started while init fails: %s", dump(cs))
	}
}

// A changed command or image replaces the container; an identical re-apply
// touches nothing.
func TestPodSpecChangeReplacesContainer(t *testing.T) {
	e := newPodEnv(t, "")
	e.cleanupPods("svc")
	e.apply(e.pod("svc", "Always", "sleep 3600"), apiv1.Succeeded, podReadyTimeout)
	first := e.cri.Running(e.ns, "svc")
	if len(first) != 1 {
		t.Fatalf("running containers = %s, want 1", dump(first))
	}
	sandboxes := e.sandboxIDs("svc")

	// Identical spec: same container, same restart count, no new attempt.
	r := e.apply(e.pod("svc", "Always", "sleep 3600"), apiv1.Succeeded, podReadyTimeout)
	t.Logf("identical re-apply: %s", r.Message)
	e.noNewContainer("svc", map[string]bool{first[0].Id: true}, 3*time.Second)
	again := e.cri.Running(e.ns, "svc")
	if len(again) != 1 || again[0].Id != first[0].Id || again[0].Annotations[restartCountKey] != first[0].Annotations[restartCountKey] {
		t.Fatalf("after identical re-apply running = %s, want the same container %s untouched", dump(again), first[0].Id)
	}

	// New command: a new container replaces the old one.
	e.apply(e.pod("svc", "Always", "sleep 3601"), apiv1.Succeeded, podReadyTimeout)
	second := e.replaced("svc", first[0].Id)
	if got := second.GetMetadata().GetName(); got != "main" {
		t.Fatalf("replacement container is %q, want main", got)
	}

	// New image (the pause image runs its own entrypoint).
	image := fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: svc, namespace: %s}
spec:
  restartPolicy: Always
  terminationGracePeriodSeconds: 2
  containers:
  - name: main
    image: docker.io/mqlet/pause:test
    imagePullPolicy: Never
`, e.ns)
	e.apply([]byte(image), apiv1.Succeeded, podReadyTimeout)
	third := e.replaced("svc", second.Id)
	if got := third.GetImage().GetImage(); got == "" || got == second.GetImage().GetImage() {
		t.Fatalf("replacement container image = %q, want the pause image (was %q)", got, second.GetImage().GetImage())
	}
	if got := e.sandboxIDs("svc"); len(got) != 1 || got[0] != sandboxes[0] {
		t.Fatalf("sandboxes after container changes = %v, want the original %v kept", got, sandboxes)
	}
}

const restartCountKey = "io.kubernetes.container.restartCount"

// replaced waits until pod name runs exactly one container, not oldID, and
// oldID no longer runs; it returns the new container.
func (e *podEnv) replaced(name, oldID string) *runtimeapi.Container {
	e.t.Helper()
	var got *runtimeapi.Container
	Eventually(e.t, 30*time.Second, name+": container "+oldID[:12]+" replaced", func() bool {
		run := e.cri.Running(e.ns, name)
		if len(run) != 1 || run[0].Id == oldID {
			return false
		}
		got = run[0]
		return true
	})
	for _, c := range e.cri.Containers(e.ns, name) {
		if c.Id == oldID && c.State == runtimeapi.ContainerState_CONTAINER_RUNNING {
			e.t.Fatalf("old container %s still runs beside its replacement", oldID)
		}
	}
	return got
}
