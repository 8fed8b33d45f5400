package metrics

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

func TestPodNetPIDSkipsHostNetworkAndEmptyPods(t *testing.T) {
	mount := t.TempDir()
	c := &Collector{opts: Options{CgroupRoot: "/mqlet"}, cgroupMounts: map[string]string{"pids": mount}}
	if pid := c.podNetPID("none"); pid != 0 {
		t.Fatalf("a pod without cgroups gave pid %d", pid)
	}
	// A pod whose only process is this test: it shares the host's network
	// namespace, like a hostNetwork pod, so there is no pod network to read.
	dir := filepath.Join(mount, "mqlet", "podu1", "sandbox")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if pid := c.podNetPID("u1"); pid != 0 {
		t.Fatalf("a host-network pod gave pid %d", pid)
	}
	if !sameNetNS(os.Getpid(), os.Getpid()) {
		t.Fatal("a process must share its own network namespace")
	}
}
