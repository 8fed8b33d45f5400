package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	apiv1 "github.com/mqlet/mqlet/api/v1"
)

// evictionConfig makes eviction passes every second.
const evictionConfig = `eviction:
  interval: 1s
`

// storagePod is a busybox pod whose containers run cmds (name → command)
// with the given extra container fields, and whose extra pod spec
// (volumes) is added as written.
func (e *podEnv) storagePod(name, volumes string, containers ...string) []byte {
	return []byte(fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: %s
  namespace: %s
spec:
  restartPolicy: Always
  terminationGracePeriodSeconds: 2
%s  containers:
%s`, name, e.ns, volumes, strings.Join(containers, "")))
}

// storageContainer is one busybox container running cmd, with resources
// (YAML under resources:, may be empty) and mounts (YAML list, may be empty).
func storageContainer(name, cmd, resources, mounts string) string {
	out := fmt.Sprintf(`  - name: %s
    image: docker.io/mqlet/busybox:test
    imagePullPolicy: Never
    command: ["sh", "-c", %q]
`, name, cmd)
	if resources != "" {
		out += "    resources:\n" + resources
	}
	if mounts != "" {
		out += "    volumeMounts:\n" + mounts
	}
	return out
}

// waitEvicted waits for the pod's status Failed with reason Evicted and
// a message starting with message, and for one Warning Evicted event
// with it.
func (e *podEnv) waitEvicted(from int, name, message string, timeout time.Duration) {
	e.t.Helper()
	p := e.waitStatus(name, timeout, "Failed/Evicted", func(p *v1.Pod) bool {
		return p.Status.Phase == v1.PodFailed && p.Status.Reason == "Evicted"
	})
	if !strings.HasPrefix(p.Status.Message, message) {
		e.t.Errorf("pod %s evicted with message %q, want %q", name, p.Status.Message, message)
	}
	Eventually(e.t, 20*time.Second, "the Evicted event of "+name, func() bool { return len(e.eventsOf(from, name, "Evicted")) > 0 })
	evs := e.eventsOf(from, name, "Evicted")
	if len(evs) != 1 || evs[0].Type != v1.EventTypeWarning || evs[0].Message != p.Status.Message {
		e.t.Errorf("Evicted events of %s: %s", name, dump(evs))
	}
	Eventually(e.t, 30*time.Second, name+"'s containers stopped", func() bool { return len(e.cri.Running(e.ns, name)) == 0 })
}

// A pod writing past its emptyDir's sizeLimit is evicted with the
// kubelet's message and event, its containers stopped and not restarted,
// its emptyDir emptied; a pod beside it keeps running untouched.
func TestEvictionEmptyDirSizeLimit(t *testing.T) {
	e := startPodEnv(t, func(logDir string) string { return podTestConfig(logDir, evictionConfig) })
	e.cleanupPods("filler", "bystander")
	e.apply(e.pod("bystander", "Always", "sleep 3600"), apiv1.Succeeded, podReadyTimeout)
	before := e.runningIDs("bystander")
	from := e.mq.Mark()
	filler := e.storagePod("filler", `  volumes:
  - name: scratch
    emptyDir:
      sizeLimit: 1Mi
`, storageContainer("main", "dd if=/dev/zero of=/scratch/f bs=1024 count=4096; sleep 3600", "", `    - name: scratch
      mountPath: /scratch
`))
	e.apply(filler, apiv1.Succeeded, podReadyTimeout)
	e.waitEvicted(from, "filler", `Usage of EmptyDir volume "scratch" exceeds the limit "1Mi". `, 60*time.Second)
	// Stays failed: not started again by a resync or a sync.
	time.Sleep(3 * time.Second) // a window for a wrongful restart to show
	if n := len(e.cri.Running(e.ns, "filler")); n != 0 {
		t.Errorf("the evicted pod runs %d containers again", n)
	}
	if after := e.runningIDs("bystander"); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("the bystander's containers changed: %v → %v", before, after)
	}
	if p, ok := e.status("bystander"); !ok || p.Status.Phase != v1.PodRunning {
		t.Errorf("bystander: %+v", p)
	}
}

// A container past its own ephemeral-storage limit (its writable layer,
// as containerd reports it) is evicted with the kubelet's message naming
// it, while the pod's total is within the sum of its containers' limits.
func TestEvictionContainerEphemeralStorageLimit(t *testing.T) {
	e := startPodEnv(t, func(logDir string) string { return podTestConfig(logDir, evictionConfig) })
	e.cleanupPods("writer")
	from := e.mq.Mark()
	pod := e.storagePod("writer", "",
		storageContainer("writer", "dd if=/dev/zero of=/tmp/f bs=1024 count=8192; sleep 3600", `      requests: {ephemeral-storage: 1Mi}
      limits: {ephemeral-storage: 2Mi}
`, ""),
		storageContainer("idle", "sleep 3600", `      limits: {ephemeral-storage: 100Mi}
`, ""))
	e.apply(pod, apiv1.Succeeded, podReadyTimeout)
	// containerd refreshes the writable layers' usage every few seconds.
	e.waitEvicted(from, "writer", `Container writer exceeded its local ephemeral storage limit "2Mi". `, 90*time.Second)
}

// A node whose state directory's filesystem (a 64 MiB tmpfs here) falls
// under nodefs.available: DiskPressure on the node, the pod ranked first
// by the kubelet's order (usage above its requests: the BestEffort filler,
// not the one within its ephemeral-storage request) evicted and its
// emptyDir given back, a new pod refused with the kubelet's reason while
// the pressure lasts (the command answered: the store works), admitted
// once it clears.
func TestEvictionDiskPressure(t *testing.T) {
	stateDir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=64m,mode=0700", "tmpfs", stateDir).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs for the state directory: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("umount", "-l", stateDir).Run() })
	// nodefs.available < 30 % of 64 MiB (19.2 MiB), with 8 MiB reserved
	// for mqlet: pressure once less than 27.2 MiB is free.
	cfg := evictionConfig + `  reservedStorage: 8Mi
  pressureTransitionPeriod: 20s
`
	e := startPodEnvIn(t, stateDir, func(logDir string) string {
		return strings.Replace(podTestConfig(logDir, cfg), "telemetry:\n", "telemetry:\n  diskAvailablePercent: 30\n", 1)
	})
	e.cleanupPods("hog", "modest", "late")
	scratch := `  volumes:
  - name: scratch
    emptyDir: {}
`
	mount := `    - name: scratch
      mountPath: /scratch
`
	// Within its 20Mi request.
	e.apply(e.storagePod("modest", scratch, storageContainer("main", "dd if=/dev/zero of=/scratch/f bs=1M count=8; sleep 3600",
		"      requests: {ephemeral-storage: 20Mi}\n", mount)), apiv1.Succeeded, podReadyTimeout)
	e.waitNode(0, 40*time.Second, "without DiskPressure", func(n *v1.Node) bool { return pressureIs(n, v1.NodeDiskPressure, v1.ConditionFalse) })
	from := e.mq.Mark()
	// 30 MiB, requesting nothing: above its requests, ranked first.
	e.apply(e.storagePod("hog", scratch, storageContainer("main", "dd if=/dev/zero of=/scratch/f bs=1M count=30; sleep 3600", "", mount)),
		apiv1.Succeeded, podReadyTimeout)
	e.waitEvicted(from, "hog", "The node was low on resource: ephemeral-storage. Threshold quantity: 30%, available: ", 60*time.Second)
	n, _ := e.waitNode(from, 30*time.Second, "with DiskPressure", func(n *v1.Node) bool { return pressureIs(n, v1.NodeDiskPressure, v1.ConditionTrue) })
	if c := nodeCondition(n, v1.NodeDiskPressure); c == nil || !strings.Contains(c.Message, "nodefs.available") {
		t.Errorf("DiskPressure %+v, want its message to name nodefs.available", c)
	}
	// Under pressure (held 20 s after it cleared): a new pod is refused,
	// and the refusal is answered.
	got := e.apply(e.pod("late", "Always", "sleep 3600"), apiv1.Failed, 30*time.Second)
	if want := "Evicted: Pod " + e.ns + "/late: The node had condition: [DiskPressure]. "; !strings.HasPrefix(got.Message, want) {
		t.Errorf("apply under pressure answered %q, want prefix %q", got.Message, want)
	}
	if p, ok := e.status("modest"); !ok || p.Status.Phase != v1.PodRunning {
		t.Errorf("the pod within its request was not kept running: %+v", p)
	}
	// The hog's emptyDir is given back: the pressure clears.
	e.waitNode(from, 90*time.Second, "DiskPressure cleared", func(n *v1.Node) bool { return pressureIs(n, v1.NodeDiskPressure, v1.ConditionFalse) })
	e.apply(e.pod("late", "Always", "sleep 3600"), apiv1.Succeeded, podReadyTimeout)
}

func pressureIs(n *v1.Node, t v1.NodeConditionType, s v1.ConditionStatus) bool {
	c := nodeCondition(n, t)
	return c != nil && c.Status == s
}

// The latency of an eviction (MQLET_EVICTION_LATENCY=1): from the moment
// a container has written past its emptyDir's sizeLimit (the CRI log
// line it writes right after, timestamped by the runtime) to its status
// Failed/Evicted at the operator, and to its containers stopped, with
// eviction.interval 1s; rounds of MQLET_EVICTION_ROUNDS (10) pods.
func TestEvictionLatency(t *testing.T) {
	if os.Getenv("MQLET_EVICTION_LATENCY") == "" {
		t.Skip("set MQLET_EVICTION_LATENCY=1 to measure")
	}
	rounds := 10
	if n, err := strconv.Atoi(os.Getenv("MQLET_EVICTION_ROUNDS")); err == nil && n > 0 {
		rounds = n
	}
	var logDir string
	e := startPodEnv(t, func(dir string) string { logDir = dir; return podTestConfig(dir, evictionConfig) })
	var toStatus, toStopped []time.Duration
	for i := range rounds {
		name := fmt.Sprintf("lat%d", i)
		from := e.mq.Mark()
		pod := e.storagePod(name, `  volumes:
  - name: scratch
    emptyDir:
      sizeLimit: 1Mi
`, storageContainer("main", "sleep 1; dd if=/dev/zero of=/scratch/f bs=1024 count=2048 2>/dev/null; echo crossed; sleep 3600", "", `    - name: scratch
      mountPath: /scratch
`))
		e.apply(pod, apiv1.Succeeded, podReadyTimeout)
		m := e.mq.WaitFor(from, 60*time.Second, name+" evicted", func(m Msg) bool {
			var p v1.Pod
			return m.Topic == e.podTopic(name) && json.Unmarshal(m.Payload, &p) == nil && p.Status.Reason == "Evicted"
		})
		var stopped time.Time
		Eventually(t, 30*time.Second, name+" stopped", func() bool {
			if len(e.cri.Running(e.ns, name)) == 0 {
				stopped = time.Now()
				return true
			}
			return false
		})
		crossed := crossedAt(t, logDir, e.ns, name)
		toStatus = append(toStatus, m.At.Sub(crossed))
		toStopped = append(toStopped, stopped.Sub(crossed))
		e.deletePod(name)
	}
	t.Logf("eviction latency over %d pods (interval 1s): to Failed/Evicted at the operator p50 %v p99 %v; to containers stopped p50 %v p99 %v",
		rounds, percentile(toStatus, 50), percentile(toStatus, 99), percentile(toStopped, 50), percentile(toStopped, 99))
}

// crossedAt is the runtime's timestamp of the pod's "crossed" log line.
func crossedAt(t *testing.T, logDir, ns, name string) time.Time {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(logDir, ns+"_"+name+"_*", "main", "*.log"))
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(raw), "\n") {
			if strings.HasSuffix(line, " crossed") {
				ts, _, _ := strings.Cut(line, " ")
				if at, err := time.Parse(time.RFC3339Nano, ts); err == nil {
					return at
				}
			}
		}
	}
	t.Fatalf("no crossed line in the logs of %s (%v)", name, files)
	return time.Time{}
}

// A memory hog under a memory-capped cgroup (runtime.cgroupRoot and
// eviction.memoryCgroup, limited to 300 MiB, memory.available hard at
// 150 MiB): MemoryPressure on the node, the BestEffort hog evicted (its
// Memory emptyDir given back), the Guaranteed pod kept running; under the
// pressure a BestEffort pod is refused, a Guaranteed one admitted.
func TestEvictionMemoryPressure(t *testing.T) {
	root := fmt.Sprintf("/mqlet-e2e-mem-%d", time.Now().UnixNano()%1e9)
	dir := "/sys/fs/cgroup/memory" + root
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Skipf("no cgroup v1 memory hierarchy to cap: %v", err)
	}
	// After mqlet and the sweep (registered first, runs last): the
	// root's cgroups in every hierarchy, children first.
	t.Cleanup(func() { removeCgroupTrees(root) })
	if err := os.WriteFile(filepath.Join(dir, "memory.limit_in_bytes"), []byte("314572800"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := evictionConfig + fmt.Sprintf("  memoryCgroup: %s\n  reservedMemory: \"0\"\n  pressureTransitionPeriod: 20s\n", root)
	e := startPodEnv(t, func(logDir string) string {
		c := strings.Replace(podTestConfig(logDir, cfg), "telemetry:\n", "telemetry:\n  memoryAvailable: 150Mi\n", 1)
		return strings.Replace(c, "runtime:\n", "runtime:\n  cgroupRoot: "+root+"\n", 1)
	})
	e.cleanupPods("hog", "guaranteed", "guaranteed2")
	guaranteed := func(name string) []byte {
		return e.storagePod(name, "", storageContainer("main", "sleep 3600", "      requests: {cpu: 100m, memory: 64Mi}\n      limits: {cpu: 100m, memory: 64Mi}\n", ""))
	}
	e.apply(guaranteed("guaranteed"), apiv1.Succeeded, podReadyTimeout)
	e.waitNode(0, 40*time.Second, "without MemoryPressure", func(n *v1.Node) bool { return pressureIs(n, v1.NodeMemoryPressure, v1.ConditionFalse) })
	before := e.runningIDs("guaranteed")
	from := e.mq.Mark()
	e.apply(e.storagePod("hog", `  volumes:
  - name: mem
    emptyDir: {medium: Memory, sizeLimit: 250Mi}
`, storageContainer("main", "dd if=/dev/zero of=/mem/f bs=1M count=200; sleep 3600", "", `    - name: mem
      mountPath: /mem
`)), apiv1.Succeeded, podReadyTimeout)
	e.waitEvicted(from, "hog", "The node was low on resource: memory. Threshold quantity: 150Mi, available: ", 60*time.Second)
	e.waitNode(from, 30*time.Second, "with MemoryPressure", func(n *v1.Node) bool { return pressureIs(n, v1.NodeMemoryPressure, v1.ConditionTrue) })
	got := e.apply(e.pod("besteffort", "Always", "sleep 3600"), apiv1.Failed, 30*time.Second)
	if want := "Evicted: Pod " + e.ns + "/besteffort: The node had condition: [MemoryPressure]. "; !strings.HasPrefix(got.Message, want) {
		t.Errorf("BestEffort under memory pressure answered %q, want prefix %q", got.Message, want)
	}
	e.apply(guaranteed("guaranteed2"), apiv1.Succeeded, podReadyTimeout)
	if after := e.runningIDs("guaranteed"); fmt.Sprint(after) != fmt.Sprint(before) {
		p, _ := e.status("guaranteed")
		t.Errorf("the Guaranteed pod's containers changed: %v → %v; status %s; events %s", before, after, dump(p.Status), dump(e.events(from)))
	}
	e.waitNode(from, 90*time.Second, "MemoryPressure cleared", func(n *v1.Node) bool { return pressureIs(n, v1.NodeMemoryPressure, v1.ConditionFalse) })
}

// removeCgroupTrees removes the cgroup root (and the empty cgroups below
// it) from every hierarchy.
func removeCgroupTrees(root string) {
	dirs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", root))
	for _, d := range dirs {
		var all []string
		_ = filepath.WalkDir(d, func(p string, de os.DirEntry, err error) error {
			if err == nil && de.IsDir() {
				all = append(all, p)
			}
			return nil
		})
		for i := len(all) - 1; i >= 0; i-- {
			_ = os.Remove(all[i]) // a cgroup goes with rmdir once it holds no task
		}
	}
}
