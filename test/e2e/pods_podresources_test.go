package e2e

import (
	"os"
	"path/filepath"
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
}
