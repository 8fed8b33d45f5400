package cri

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/rs/zerolog"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

func podWithPodResources(uid string, res *v1.ResourceRequirements) *v1.Pod {
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "default", UID: types.UID(uid)},
		Spec: v1.PodSpec{
			Resources:  res,
			Containers: []v1.Container{{Name: "a"}, {Name: "b"}},
		},
	}
}

// wantCgroupFiles checks the files below root against want (what names
// the case in a failure).
func wantCgroupFiles(t *testing.T, root, what string, want map[string]string) {
	t.Helper()
	for file, w := range want {
		if got := readCgroupFile(t, filepath.Join(root, file)); got != w {
			t.Errorf("%s: %s is %q, want %q", what, file, got, w)
		}
	}
}

func readCgroupFile(t *testing.T, path string) string {
	t.Helper()
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(got)
}

// Pod-level resources limit the pod cgroup before the sandbox exists: on
// cgroup v1 memory.limit_in_bytes, the CFS quota over a 100 ms period and
// cpu.shares from the requests; on v2 memory.max, cpu.max and cpu.weight
// (the controllers enabled down to the pod). A pod without pod-level
// resources gets no cpu or memory cgroup of its own.
func TestPodLevelResourcesLimitThePodCgroup(t *testing.T) {
	const uid = "3f6c2a1e-8b4d-4e7a-9c15-2d7e6f0a1b2c"
	res := &v1.ResourceRequirements{
		Limits:   v1.ResourceList{v1.ResourceMemory: resource.MustParse("64Mi"), v1.ResourceCPU: resource.MustParse("500m")},
		Requests: v1.ResourceList{v1.ResourceMemory: resource.MustParse("32Mi"), v1.ResourceCPU: resource.MustParse("250m")},
	}

	fs1 := t.TempDir()
	must(t, os.MkdirAll(filepath.Join(fs1, "memory"), 0o755))
	must(t, os.WriteFile(filepath.Join(fs1, "memory", "cgroup.procs"), nil, 0o644))
	must(t, os.MkdirAll(filepath.Join(fs1, "cpu"), 0o755))
	m := NewManager(Config{CgroupFS: fs1}, zerolog.Nop())
	must(t, m.limitPodResources(podWithPodResources(uid, res)))
	wantCgroupFiles(t, fs1, "v1", map[string]string{
		"memory/mqlet/pod" + uid + "/memory.limit_in_bytes": "67108864",
		"cpu/mqlet/pod" + uid + "/cpu.cfs_quota_us":         "50000",
		"cpu/mqlet/pod" + uid + "/cpu.cfs_period_us":        "100000",
		"cpu/mqlet/pod" + uid + "/cpu.shares":               "256",
	})

	// Only a cpu limit: no memory limit is written, the requests default
	// to nothing here (the API server's defaulting is validation's job),
	// so the shares are the kubelet's minimum.
	const uid2 = "3f6c2a1e-8b4d-4e7a-9c15-2d7e6f0a1b2d"
	must(t, m.limitPodResources(podWithPodResources(uid2, &v1.ResourceRequirements{Limits: v1.ResourceList{v1.ResourceCPU: resource.MustParse("2")}})))
	if got := readCgroupFile(t, filepath.Join(fs1, "cpu/mqlet/pod"+uid2+"/cpu.cfs_quota_us")); got != "200000" {
		t.Errorf("v1 quota of 2 cpus: %q", got)
	}
	if got := readCgroupFile(t, filepath.Join(fs1, "cpu/mqlet/pod"+uid2+"/cpu.shares")); got != "2" {
		t.Errorf("v1 shares without a request: %q", got)
	}
	if got := readCgroupFile(t, filepath.Join(fs1, "memory/mqlet/pod"+uid2+"/memory.limit_in_bytes")); got != "-1" {
		t.Errorf("v1 memory limit of a pod without one: %q, want -1 (none)", got)
	}
	// The same pod updated without pod-level resources: its cgroup goes
	// back to the defaults, no limit left from the earlier spec.
	must(t, m.limitPodResources(podWithPodResources(uid, nil)))
	wantCgroupFiles(t, fs1, "v1 after the limits were removed", map[string]string{
		"memory/mqlet/pod" + uid + "/memory.limit_in_bytes": "-1",
		"cpu/mqlet/pod" + uid + "/cpu.cfs_quota_us":         "-1",
		"cpu/mqlet/pod" + uid + "/cpu.shares":               "1024",
	})

	const uid3 = "3f6c2a1e-8b4d-4e7a-9c15-2d7e6f0a1b2e"
	must(t, m.limitPodResources(podWithPodResources(uid3, nil)))
	if _, err := os.Stat(filepath.Join(fs1, "cpu/mqlet/pod"+uid3)); err == nil {
		t.Error("a pod without pod-level resources got a cpu cgroup")
	}

	fs2 := t.TempDir()
	must(t, os.WriteFile(filepath.Join(fs2, "cgroup.controllers"), []byte("cpu memory pids\n"), 0o644))
	m = NewManager(Config{CgroupFS: fs2}, zerolog.Nop())
	must(t, m.limitPodResources(podWithPodResources(uid, res)))
	wantCgroupFiles(t, fs2, "v2", map[string]string{
		"cgroup.subtree_control":          "+cpu +memory",
		"mqlet/cgroup.subtree_control":    "+cpu +memory",
		"mqlet/pod" + uid + "/memory.max": "67108864",
		"mqlet/pod" + uid + "/cpu.max":    "50000 100000",
		"mqlet/pod" + uid + "/cpu.weight": "10",
	})
	must(t, m.limitPodResources(podWithPodResources(uid, nil)))
	wantCgroupFiles(t, fs2, "v2 after the limits were removed", map[string]string{
		"mqlet/pod" + uid + "/memory.max": "max",
		"mqlet/pod" + uid + "/cpu.max":    "max 100000",
		"mqlet/pod" + uid + "/cpu.weight": "100",
	})

	if err := NewManager(Config{CgroupFS: t.TempDir()}, zerolog.Nop()).limitPodResources(podWithPodResources(uid, res)); err == nil {
		t.Fatal("no cpu and memory controllers, yet no error")
	}
	if err := m.limitPodResources(podWithPodResources("../../x", res)); err == nil {
		t.Fatal("a uid that is not a UUID was accepted for a cgroup path")
	}
}

// A container without a limit reads the pod-level limit through
// resourceFieldRef (before the node's allocatable), as in the kubelet.
func TestResourceFieldValueFallsBackToPodLevelLimits(t *testing.T) {
	pod := downwardPod()
	pod.Spec.Resources = &v1.ResourceRequirements{Limits: v1.ResourceList{v1.ResourceCPU: resource.MustParse("500m"), v1.ResourceMemory: resource.MustParse("256Mi")}}
	d := downwardValues{allocatable: v1.ResourceList{v1.ResourceCPU: resource.MustParse("2"), v1.ResourceMemory: resource.MustParse("1Gi")}}
	main, side := &pod.Spec.Containers[0], &pod.Spec.Containers[1]
	for _, c := range []struct {
		c    *v1.Container
		fs   v1.ResourceFieldSelector
		want string
	}{
		{main, v1.ResourceFieldSelector{Resource: "limits.cpu", Divisor: resource.MustParse("1m")}, "500"},
		{side, v1.ResourceFieldSelector{Resource: "limits.memory", Divisor: resource.MustParse("1Mi")}, "256"},
		{main, v1.ResourceFieldSelector{Resource: "limits.memory", Divisor: resource.MustParse("1Mi")}, "64"}, // its own limit
	} {
		got, err := resourceFieldValue(pod, c.c, &c.fs, d)
		if err != nil || got != c.want {
			t.Errorf("%s %+v = %q, %v; want %q", c.c.Name, c.fs, got, err, c.want)
		}
	}
}
