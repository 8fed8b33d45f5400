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
	for _, d := range []string{"memory/mqlet/pod0b6c1a52-7d1e-4c55-9a3e-2f1d8e4b7a01/ctr-a", "cpu,cpuacct/mqlet/pod0b6c1a52-7d1e-4c55-9a3e-2f1d8e4b7a01", "mqlet/pod0b6c1a52-7d1e-4c55-9a3e-2f1d8e4b7a01/ctr-b", "memory/mqlet/pod0b6c1a52-7d1e-4c55-9a3e-2f1d8e4b7a02"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if got := m.podCgroupDirs("0b6c1a52-7d1e-4c55-9a3e-2f1d8e4b7a01"); len(got) != 3 {
		t.Fatalf("found %v, want the memory, cpu,cpuacct and v2 dirs", got)
	}
	// A cgroup whose name is not pod<UUID> is not ours to list (or remove).
	if err := os.MkdirAll(filepath.Join(root, "memory/mqlet/pod..-x"), 0o755); err != nil {
		t.Fatal(err)
	}
	if uids := m.podCgroupUIDs(); len(uids) != 2 {
		t.Fatalf("pod cgroup uids %v", uids)
	}
	if err := m.removePodCgroup("0b6c1a52-7d1e-4c55-9a3e-2f1d8e4b7a01"); err != nil {
		t.Fatal(err)
	}
	if got := m.podCgroupDirs("0b6c1a52-7d1e-4c55-9a3e-2f1d8e4b7a01"); len(got) != 0 {
		t.Fatalf("left %v", got)
	}
	if _, err := os.Stat(filepath.Join(root, "memory/mqlet/pod0b6c1a52-7d1e-4c55-9a3e-2f1d8e4b7a02")); err != nil {
		t.Fatal("another pod's cgroup was removed")
	}
	if err := m.removePodCgroup("0b6c1a52-7d1e-4c55-9a3e-2f1d8e4b7aff"); err != nil {
		t.Fatalf("a pod without cgroups: %v", err)
	}
	if err := m.removePodCgroup("../../memory"); err == nil {
		t.Fatal("a uid that is not a UUID was accepted for a cgroup path")
	}
}
