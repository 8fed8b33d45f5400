package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	statsv1alpha1 "k8s.io/kubelet/pkg/apis/stats/v1alpha1"

	apiv1 "github.com/mqlet/mqlet/api/v1"
)

// A container burning CPU shows in the Summary with CPU and memory usage;
// the node has CPU and memory; the mqlet system container carries counters.
func TestTelemetryMetrics(t *testing.T) {
	e := newTelEnv(t)
	e.cleanupPods("burn")
	e.apply([]byte(fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: burn, namespace: %s}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: spin
    image: docker.io/mqlet/busybox:test
    imagePullPolicy: Never
    command: ["sh", "-c", "while :; do :; done"]
    resources:
      limits: {cpu: 200m, memory: 32Mi}
`, e.ns)), apiv1.Succeeded, podReadyTimeout)

	from := e.mq.Mark()
	var sum statsv1alpha1.Summary
	var spin *statsv1alpha1.ContainerStats
	var burnPod *statsv1alpha1.PodStats
	// Usage rates need two samples of the pod's cgroup: allow a few intervals.
	e.mq.WaitFor(from, 30*time.Second, "metrics with usage of burn/spin", func(m Msg) bool {
		if m.Topic != prefix+"/"+e.node+"/metrics" {
			return false
		}
		sum = statsv1alpha1.Summary{}
		if err := decodeStrict(m.Payload, &sum); err != nil {
			t.Errorf("metrics do not decode strictly: %v", err)
			return false
		}
		spin, burnPod = nil, nil
		for pi, p := range sum.Pods {
			if p.PodRef.Namespace != e.ns || p.PodRef.Name != "burn" {
				continue
			}
			burnPod = &sum.Pods[pi]
			for i := range p.Containers {
				if p.Containers[i].Name == "spin" {
					spin = &p.Containers[i]
				}
			}
		}
		return spin != nil && spin.CPU != nil && spin.CPU.UsageNanoCores != nil && *spin.CPU.UsageNanoCores > 0
	})
	b, _ := json.Marshal(spin)
	t.Logf("burn/spin stats: %s", b)
	if c := spin.CPU; c.UsageCoreNanoSeconds == nil || *c.UsageCoreNanoSeconds == 0 {
		t.Errorf("spin has no cumulative CPU usage: %s", b)
	} else if cores := float64(*c.UsageNanoCores) / 1e9; cores > 0.4 {
		// The 200m limit holds (with slack for the sampling window).
		t.Errorf("spin uses %.3f cores under a 200m limit", cores)
	}
	if m := spin.Memory; m == nil || m.WorkingSetBytes == nil || *m.WorkingSetBytes == 0 {
		t.Errorf("spin has no working set: %s", b)
	}
	// Container disk use: the writable layer and the logs, on filesystems
	// whose capacity is known.
	for name, f := range map[string]*statsv1alpha1.FsStats{"rootfs": spin.Rootfs, "logs": spin.Logs} {
		if f == nil || f.UsedBytes == nil || f.CapacityBytes == nil || *f.CapacityBytes == 0 {
			t.Errorf("spin has no %s stats: %s", name, dump(f))
		}
	}
	// The pod's own network namespace: its eth0 from the CNI bridge.
	if net := burnPod.Network; net == nil || net.Name != "eth0" || net.RxBytes == nil {
		t.Errorf("pod network stats missing or not the pod's eth0: %s", dump(burnPod.Network))
	}

	n := sum.Node
	if n.CPU == nil || n.CPU.UsageNanoCores == nil || *n.CPU.UsageNanoCores == 0 || n.CPU.UsageCoreNanoSeconds == nil || *n.CPU.UsageCoreNanoSeconds == 0 {
		t.Errorf("node CPU usage missing or zero: %s", dump(n.CPU))
	}
	if n.Memory == nil || n.Memory.WorkingSetBytes == nil || *n.Memory.WorkingSetBytes == 0 {
		t.Errorf("node memory missing or zero: %s", dump(n.Memory))
	}
	if n.NodeName != e.node {
		t.Errorf("summary node name %q, want %q", n.NodeName, e.node)
	}
	counters := map[string]float64{}
	for _, sc := range n.SystemContainers {
		if sc.Name != "mqlet" {
			continue
		}
		for _, u := range sc.UserDefinedMetrics {
			counters[u.Name] = u.Value
		}
	}
	t.Logf("mqlet counters: %v", counters)
	for _, name := range []string{"mqtt_connected", "outbox_sent", "mqtt_messages_in"} {
		if counters[name] <= 0 {
			t.Errorf("mqlet counter %s = %v, want > 0", name, counters[name])
		}
	}
}

// testContainerdDir is the scratch dir of the test containerd (as containerd-up.sh defaults it).
func testContainerdDir() string {
	if d := os.Getenv("MQLET_TEST_DIR"); d != "" {
		return d
	}
	return "/run/mqlet-test"
}

// processGone reports whether pid has exited (gone or a zombie nobody reaps).
func processGone(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	// state is the field after the ")" that closes the command name
	fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	return len(fields) > 0 && (fields[0] == "Z" || fields[0] == "X")
}

// stopContainerd stops the test containerd (its shims and containers live
// on) and returns a func that starts it again, idempotently.
func stopContainerd(t *testing.T) (start func()) {
	t.Helper()
	dir := testContainerdDir()
	raw, err := os.ReadFile(filepath.Join(dir, "containerd.pid"))
	if err != nil {
		t.Fatalf("reading the test containerd's pid: %v", err)
	}
	var pid int
	if _, err := fmt.Sscan(string(raw), &pid); err != nil || pid <= 1 {
		t.Fatalf("bad containerd pid %q: %v", raw, err)
	}
	script, err := filepath.Abs("../env/containerd-up.sh")
	if err != nil {
		t.Fatal(err)
	}
	start = func() {
		t.Helper()
		cmd := exec.Command(script)
		cmd.Env = append(os.Environ(), "MQLET_TEST_DIR="+dir)
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("restarting containerd: %v", err)
		}
		t.Logf("containerd restarted: %s", strings.TrimSpace(string(out)))
		ConnectCRI(t) // fails unless it answers
	}
	// Whatever happens below, other tests need containerd back.
	t.Cleanup(func() {
		if !criAnswers() {
			start()
		}
	})
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		t.Fatalf("stopping containerd %d: %v", pid, err)
	}
	Eventually(t, 15*time.Second, "containerd exited", func() bool { return processGone(pid) })
	return start
}

// criAnswers reports whether the test CRI endpoint answers.
func criAnswers() bool {
	sock := strings.TrimPrefix(os.Getenv("MQLET_TEST_CRI_ENDPOINT"), "unix://")
	return exec.Command("ctr", "-a", sock, "--timeout", "2s", "version").Run() == nil
}

// containerd going away turns the node NotReady (ContainerRuntimeUnreachable)
// within the node status interval; its return makes it Ready, pods running.
func TestTelemetryRuntimeDownAndBack(t *testing.T) {
	e := newTelEnv(t)
	e.cleanupPods("run")
	e.apply(e.pod("run", "Always", "sleep 3600"), apiv1.Succeeded, podReadyTimeout)
	e.waitStatus("run", 30*time.Second, "Running", func(p *v1.Pod) bool { return p.Status.Phase == v1.PodRunning })
	before := e.runningIDs("run")
	isReady := func(n *v1.Node) bool {
		c := nodeCondition(n, v1.NodeReady)
		return c != nil && c.Status == v1.ConditionTrue
	}
	e.waitNode(0, 30*time.Second, "Ready=True", isReady)

	mark := e.mq.Mark()
	stopped := time.Now()
	start := stopContainerd(t) // registered after cleanupPods: runs before the deletes
	n, m := e.waitNode(mark, telNodeStatusInterval+10*time.Second, "Ready=False", func(n *v1.Node) bool {
		c := nodeCondition(n, v1.NodeReady)
		return c != nil && c.Status == v1.ConditionFalse
	})
	notReadyAfter := m.At.Sub(stopped)
	c := nodeCondition(n, v1.NodeReady)
	t.Logf("containerd stopped → Ready=False after %v: %s: %s", notReadyAfter, c.Reason, c.Message)
	if c.Reason != "ContainerRuntimeUnreachable" {
		t.Errorf("Ready=False reason %q, want ContainerRuntimeUnreachable", c.Reason)
	}
	if notReadyAfter > telNodeStatusInterval+5*time.Second {
		t.Errorf("Ready=False came %v after containerd stopped; want within the %v node status interval (+5 s)", notReadyAfter, telNodeStatusInterval)
	}
	// It stays NotReady while containerd is down (heartbeats say so too).
	e.waitNode(e.mq.Mark(), 2*telNodeStatusInterval+5*time.Second, "a NotReady heartbeat", func(n *v1.Node) bool { return !isReady(n) })
	if !e.agent.Running() {
		t.Fatal("mqlet died without its runtime")
	}

	mark = e.mq.Mark()
	start()
	back := time.Now()
	_, m = e.waitNode(mark, telNodeStatusInterval+20*time.Second, "Ready=True again", isReady)
	t.Logf("containerd answers again → Ready=True after %v", m.At.Sub(back))

	Eventually(t, 60*time.Second, "run has its container running", func() bool { return len(e.cri.Running(e.ns, "run")) == 1 })
	after := e.runningIDs("run")
	t.Logf("container of run before %v, after %v (same: %v)", before, after, before["main"] == after["main"])
	p := e.waitStatus("run", 30*time.Second, "Running and ready", func(p *v1.Pod) bool {
		cs, ok := containerStatus(p, "main", false)
		return p.Status.Phase == v1.PodRunning && ok && cs.State.Running != nil && cs.ContainerID != ""
	})
	if cs, _ := containerStatus(p, "main", false); !strings.HasSuffix(cs.ContainerID, after["main"]) {
		t.Errorf("published container id %s is not the running one %s", cs.ContainerID, after["main"])
	}
}

// How long from a container's exit to its Succeeded status at a subscriber.
func TestTelemetryExitToStatusDelay(t *testing.T) {
	e := newTelEnv(t)
	const pods = 5
	names := make([]string, pods)
	for i := range names {
		names[i] = fmt.Sprintf("exit-%d", i)
	}
	e.cleanupPods(names...)
	// Staggered exits, all after every apply has been answered.
	for i, name := range names {
		e.apply(e.pod(name, "Never", fmt.Sprintf("sleep %.1f; exit 0", 6+0.7*float64(i))), apiv1.Succeeded, podReadyTimeout)
	}
	var delays []time.Duration
	for _, name := range names {
		var arrived time.Time
		e.mq.WaitFor(0, 60*time.Second, name+" Succeeded", func(m Msg) bool {
			if m.Topic != e.podTopic(name) || len(m.Payload) == 0 {
				return false
			}
			var p v1.Pod
			if json.Unmarshal(m.Payload, &p) != nil || p.Status.Phase != v1.PodSucceeded {
				return false
			}
			arrived = m.At
			cs, ok := containerStatus(&p, "main", false)
			if !ok || cs.State.Terminated == nil {
				t.Errorf("%s Succeeded without a terminated main: %s", name, dump(p.Status))
			}
			return true
		})
		list := e.cri.Containers(e.ns, name)
		if len(list) != 1 {
			t.Fatalf("%s has %d containers in CRI, want 1", name, len(list))
		}
		ctx, cancel := criCtx()
		st, err := e.rt.ContainerStatus(ctx, list[0].Id, false)
		cancel()
		if err != nil {
			t.Fatalf("CRI status of %s: %v", name, err)
		}
		finished := time.Unix(0, st.GetStatus().GetFinishedAt())
		d := arrived.Sub(finished)
		t.Logf("%s: exited %s, Succeeded at the subscriber %v later", name, finished.Format("15:04:05.000"), d)
		delays = append(delays, d)
	}
	p50, p99 := percentile(delays, 50), percentile(delays, 99)
	t.Logf("exit → Succeeded status at subscriber over %d pods (PLEG 300ms): p50 %v, p99 %v", pods, p50, p99)
	for i, d := range delays {
		// Nothing absurd: after the exit, and well within a few relists.
		if d <= 0 || d > 5*time.Second {
			t.Errorf("%s: delay %v, want between 0 and 5s", names[i], d)
		}
	}
}
