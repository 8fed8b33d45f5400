package e2e

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	apiv1 "github.com/mqlet/mqlet/api/v1"
)

// Pod-level resources (spec.resources) limit the pod's cgroup, which the
// runtime puts the containers' cgroups beneath: 64Mi is the pod's
// memory.limit_in_bytes, 500m a CFS quota of 50000 per 100000 µs, and
// the requests defaulted from the limits give cpu.shares 512.
func TestPodLevelResourcesLimitThePodCgroup(t *testing.T) {
	e := startPodEnv(t, func(logDir string) string { return podTestConfig(logDir, "") })
	e.cleanupPods("podres")
	manifest := strings.Replace(string(e.pod("podres", "Always", "sleep 3600")), "spec:\n",
		"spec:\n  resources:\n    limits:\n      memory: 64Mi\n      cpu: 500m\n", 1)
	e.apply([]byte(manifest), apiv1.Succeeded, podReadyTimeout)
	p := e.waitStatus("podres", 30*time.Second, "the pod running", func(p *v1.Pod) bool {
		return p.UID != "" && p.Status.Phase == v1.PodRunning
	})
	read := func(hierarchy, file string) string {
		b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup", hierarchy, "mqlet", "pod"+string(p.UID), file))
		if err != nil {
			t.Fatalf("pod cgroup: %v", err)
		}
		return strings.TrimSpace(string(b))
	}
	for _, c := range []struct{ hierarchy, file, want string }{
		{"memory", "memory.limit_in_bytes", "67108864"},
		{"cpu", "cpu.cfs_quota_us", "50000"},
		{"cpu", "cpu.cfs_period_us", "100000"},
		{"cpu", "cpu.shares", "512"},
	} {
		if got := read(c.hierarchy, c.file); got != c.want {
			t.Errorf("pod cgroup %s/%s = %q, want %q", c.hierarchy, c.file, got, c.want)
		}
	}
	// The containers' cgroups are beneath the limited one.
	entries, err := os.ReadDir(filepath.Join("/sys/fs/cgroup/memory/mqlet", "pod"+string(p.UID)))
	if err != nil {
		t.Fatal(err)
	}
	var subs int
	for _, en := range entries {
		if en.IsDir() {
			subs++
		}
	}
	if subs == 0 {
		t.Fatal("no container cgroup beneath the pod's memory cgroup")
	}
	if p.Status.QOSClass != v1.PodQOSGuaranteed {
		t.Errorf("qosClass %q, want Guaranteed (pod requests defaulted to its limits)", p.Status.QOSClass)
	}

	// The same pod applied without pod-level resources keeps its uid and
	// gets a new sandbox; its cgroup keeps no limit of the earlier spec.
	e.apply(e.pod("podres", "Always", "sleep 3600"), apiv1.Succeeded, podReadyTimeout)
	q := e.waitStatus("podres", 60*time.Second, "running in a new sandbox", func(q *v1.Pod) bool {
		cs, ok := containerStatus(q, "main", false)
		old, _ := containerStatus(p, "main", false)
		return q.Status.Phase == v1.PodRunning && ok && cs.State.Running != nil && cs.ContainerID != old.ContainerID
	})
	if q.UID != p.UID {
		t.Fatalf("uid changed from %s to %s: the test needs the same pod cgroup", p.UID, q.UID)
	}
	// No limit reads as the largest page-aligned value.
	if got, err := strconv.ParseUint(read("memory", "memory.limit_in_bytes"), 10, 64); err != nil || got < 1<<62 {
		t.Errorf("after the limits were removed: memory.limit_in_bytes = %d (%v), want no limit", got, err)
	}
	for _, c := range []struct{ hierarchy, file, want string }{
		{"cpu", "cpu.cfs_quota_us", "-1"},
		{"cpu", "cpu.shares", "1024"},
	} {
		if got := read(c.hierarchy, c.file); got != c.want {
			t.Errorf("after the limits were removed: pod cgroup %s/%s = %q, want %q", c.hierarchy, c.file, got, c.want)
		}
	}
}
