package runtime

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/rs/zerolog"
)

func TestRemovePodCgroupRemovesEveryHierarchy(t *testing.T) {
	root := t.TempDir()
	m := NewManager(Config{CgroupFS: root}, zerolog.Nop())
	for _, d := range []string{"memory/mqlet/podu1/ctr-a", "cpu,cpuacct/mqlet/podu1", "mqlet/podu1/ctr-b", "memory/mqlet/podu2"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if got := m.podCgroupDirs("u1"); len(got) != 3 {
		t.Fatalf("found %v, want the memory, cpu,cpuacct and v2 dirs", got)
	}
	if uids := m.podCgroupUIDs(); len(uids) != 2 {
		t.Fatalf("pod cgroup uids %v", uids)
	}
	if err := m.removePodCgroup("u1"); err != nil {
		t.Fatal(err)
	}
	if got := m.podCgroupDirs("u1"); len(got) != 0 {
		t.Fatalf("left %v", got)
	}
	if _, err := os.Stat(filepath.Join(root, "memory/mqlet/podu2")); err != nil {
		t.Fatal("another pod's cgroup was removed")
	}
	if err := m.removePodCgroup("missing"); err != nil {
		t.Fatalf("a pod without cgroups: %v", err)
	}
}
