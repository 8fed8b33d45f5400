package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"sigs.k8s.io/yaml"

	apiv1 "github.com/mqlet/mqlet/api/v1"
)

const managedLabel = "io.mqlet.managed"

// foreignPod runs a sandbox with a sleeping and an already exited container
// through CRI directly, labelled like a kubelet would but not by mqlet.
func (e *podEnv) foreignPod(name string) (sandbox string, containers []string) {
	e.t.Helper()
	ctx, cancel := criCtx()
	defer cancel()
	uid := "foreign-" + e.ns
	labels := map[string]string{"io.kubernetes.pod.namespace": e.ns, "io.kubernetes.pod.name": name, "io.kubernetes.pod.uid": uid}
	sbCfg := &runtimeapi.PodSandboxConfig{
		Metadata:     &runtimeapi.PodSandboxMetadata{Name: name, Namespace: e.ns, Uid: uid},
		Hostname:     name,
		Labels:       labels,
		LogDirectory: e.t.TempDir(),
		Linux:        &runtimeapi.LinuxPodSandboxConfig{CgroupParent: "/e2e-foreign/pod" + uid},
	}
	sandbox, err := e.rt.RunPodSandbox(ctx, sbCfg, "")
	if err != nil {
		e.t.Fatalf("foreign sandbox: %v", err)
	}
	for _, c := range []struct{ name, cmd string }{{"sleeper", "sleep 3600"}, {"quitter", "exit 0"}} {
		cl := map[string]string{"io.kubernetes.container.name": c.name}
		for k, v := range labels {
			cl[k] = v
		}
		id, err := e.rt.CreateContainer(ctx, sandbox, &runtimeapi.ContainerConfig{
			Metadata: &runtimeapi.ContainerMetadata{Name: c.name},
			Image:    &runtimeapi.ImageSpec{Image: "docker.io/mqlet/busybox:test"},
			Command:  []string{"sh", "-c", c.cmd},
			LogPath:  c.name + ".log",
			Labels:   cl,
		}, sbCfg)
		if err != nil {
			e.t.Fatalf("foreign container %s: %v", c.name, err)
		}
		if err := e.rt.StartContainer(ctx, id); err != nil {
			e.t.Fatalf("starting foreign container %s: %v", c.name, err)
		}
		containers = append(containers, id)
	}
	return sandbox, containers
}

// foreignIntact fails unless the foreign sandbox is ready and its containers exist.
func (e *podEnv) foreignIntact(name, sandbox string, containers []string, when string) {
	e.t.Helper()
	var ready bool
	for _, sb := range e.cri.Sandboxes(e.ns, name) {
		if sb.Id == sandbox {
			ready = sb.State == runtimeapi.PodSandboxState_SANDBOX_READY
		}
	}
	if !ready {
		e.t.Fatalf("%s: the foreign sandbox %s is gone or stopped", when, sandbox)
	}
	have := map[string]runtimeapi.ContainerState{}
	for _, c := range e.cri.Containers(e.ns, name) {
		have[c.Id] = c.State
	}
	for _, id := range containers {
		if _, ok := have[id]; !ok {
			e.t.Fatalf("%s: foreign container %s was removed", when, id)
		}
	}
	if have[containers[0]] != runtimeapi.ContainerState_CONTAINER_RUNNING {
		e.t.Fatalf("%s: foreign container sleeper is %s, want running", when, have[containers[0]])
	}
}

// managed counts mqlet's containers of pod name.
func (e *podEnv) managed(name string) int {
	n := 0
	for _, c := range e.cri.Containers(e.ns, name) {
		if c.Labels[managedLabel] == "true" {
			n++
		}
	}
	return n
}

// Containers another CRI client made are none of mqlet's business, even
// under the same pod namespace and name, through reconcile, delete and GC.
func TestPodForeignContainersLeftAlone(t *testing.T) {
	e := newPodEnv(t, "gc: {interval: 1s, minDeadAge: 1s, maxDeadPerContainer: 1, imageGCHighPercent: 0}\n")
	sandbox, containers := e.foreignPod("shared")
	e.apply(e.pod("shared", "Always", "sleep 3600"), apiv1.Succeeded, podReadyTimeout)
	if n := e.managed("shared"); n != 1 {
		t.Fatalf("mqlet's containers of shared = %d, want 1", n)
	}
	// Several GC rounds with the foreign quitter dead for longer than minDeadAge.
	window := func(when string) {
		end := time.Now().Add(5 * time.Second)
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		for time.Now().Before(end) {
			e.foreignIntact("shared", sandbox, containers, when)
			<-tick.C
		}
	}
	window("while mqlet runs its GC")

	mark := e.mq.Mark()
	e.kill9BetweenSyncs()
	e.agent.Restart()
	e.mq.WaitState(mark, e.node, "online", 30*time.Second)
	window("after mqlet restarted and reconciled")

	e.deletePod("shared")
	if n := e.managed("shared"); n != 0 {
		t.Fatalf("after delete mqlet still has %d containers of shared", n)
	}
	window("after mqlet deleted its pod of the same name")
	// The sweep at the end removes the foreign sandbox (same namespace).
}

// containerdDir is the scratch dir of the test containerd, from its socket.
func containerdDir(t *testing.T, endpoint string) string {
	t.Helper()
	sock := strings.TrimPrefix(endpoint, "unix://")
	if sock == endpoint || filepath.Base(sock) != "containerd.sock" {
		t.Fatalf("CRI endpoint %s is not a containerd-up.sh socket", endpoint)
	}
	return filepath.Dir(sock)
}

// waitEvent waits for an event with reason on node's events topic.
func (e *podEnv) waitEvent(from int, reason string, timeout time.Duration) {
	e.t.Helper()
	e.mq.WaitFor(from, timeout, "event "+reason, func(m Msg) bool {
		var ev v1.Event
		return m.Topic == prefix+"/"+e.node+"/events" && json.Unmarshal(m.Payload, &ev) == nil && ev.Reason == reason
	})
}

// containerd killed and started again: mqlet notices, recovers, the pod
// that ran keeps running, and new work succeeds.
func TestPodsRecoverFromContainerdRestart(t *testing.T) {
	e := newPodEnv(t, "")
	e.cleanupPods("before", "after")
	e.apply(e.pod("before", "Always", "sleep 3600"), apiv1.Succeeded, podReadyTimeout)
	running := e.snapshot("before")

	_, endpoint := ConnectCRI(t)
	dir := containerdDir(t, endpoint)
	raw, err := os.ReadFile(filepath.Join(dir, "containerd.pid"))
	if err != nil {
		t.Fatalf("reading containerd pid: %v", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(raw)))
	if err != nil {
		t.Fatalf("containerd pid %q: %v", raw, err)
	}
	mark := e.mq.Mark()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("killing containerd %d: %v", pid, err)
	}
	restarted := false
	t.Cleanup(func() {
		if !restarted { // leave a containerd for the tests that follow
			up := exec.Command(filepath.Join("..", "env", "containerd-up.sh"))
			up.Env = append(os.Environ(), "MQLET_TEST_DIR="+dir)
			_ = up.Run()
		}
	})
	Eventually(t, 10*time.Second, "containerd exited", func() bool { return syscall.Kill(pid, 0) != nil })
	e.waitEvent(mark, "ContainerRuntimeUnreachable", 30*time.Second)

	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	up := exec.CommandContext(ctx, filepath.Join("..", "env", "containerd-up.sh"))
	up.Env = append(os.Environ(), "MQLET_TEST_DIR="+dir)
	out, err := up.CombinedOutput()
	if err != nil {
		t.Fatalf("restarting containerd: %v\n%s", err, out)
	}
	restarted = true
	e.waitEvent(mark, "ContainerRuntimeReady", 60*time.Second)

	e.apply(e.pod("after", "Always", "sleep 3600"), apiv1.Succeeded, podReadyTimeout)
	if n := len(e.cri.Running(e.ns, "after")); n != 1 {
		t.Fatalf("after containerd restart the new pod runs %d containers, want 1", n)
	}
	e.sameAs("before", running, "after containerd restart")
	e.waitStatus("before", 30*time.Second, "running", func(p *v1.Pod) bool { return p.Status.Phase == v1.PodRunning })
}

// 20 pods in one List all run.
func TestPodsTwentyInOneList(t *testing.T) {
	e := newPodEnv(t, "")
	const n = 20
	items := make([]json.RawMessage, 0, n)
	for i := range n {
		j, err := yaml.YAMLToJSON(e.pod(fmt.Sprintf("p%02d", i), "Always", "sleep 3600"))
		if err != nil {
			t.Fatal(err)
		}
		items = append(items, j)
	}
	list, _ := json.Marshal(map[string]any{"apiVersion": "v1", "kind": "List", "items": items})
	t.Cleanup(func() {
		if !e.agent.Running() {
			return
		}
		e.mq = Connect(t, e.broker.URL())
		e.mq.Subscribe(prefix + "/" + e.node + "/reply/#")
		id := e.nextID("sync")
		e.mq.Command(e.node, "sync", id, []byte(`{"apiVersion":"v1","kind":"List","items":[]}`))
		e.waitFinal(id, apiv1.Succeeded, 3*time.Minute)
		Eventually(t, 60*time.Second, "every pod gone", func() bool { return e.nsContainers(false) == 0 })
	})
	start := time.Now()
	e.apply(list, apiv1.Succeeded, 5*time.Minute)
	t.Logf("%d pods running after %v", n, time.Since(start))
	if got := e.nsContainers(true); got != n {
		t.Fatalf("CRI runs %d containers in %s, want %d", got, e.ns, n)
	}
	for i := range n {
		if r := e.cri.Running(e.ns, fmt.Sprintf("p%02d", i)); len(r) != 1 {
			t.Fatalf("pod p%02d runs %d containers, want 1", i, len(r))
		}
	}
}

// nsContainers counts this namespace's containers (running only, or all).
func (e *podEnv) nsContainers(runningOnly bool) int {
	e.t.Helper()
	ctx, cancel := criCtx()
	defer cancel()
	list, err := e.rt.ListContainers(ctx, &runtimeapi.ContainerFilter{LabelSelector: map[string]string{"io.kubernetes.pod.namespace": e.ns}})
	if err != nil {
		e.t.Fatalf("listing containers: %v", err)
	}
	n := 0
	for _, c := range list {
		if !runningOnly || c.State == runtimeapi.ContainerState_CONTAINER_RUNNING {
			n++
		}
	}
	return n
}
