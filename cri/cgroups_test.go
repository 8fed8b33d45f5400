package cri

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

// Every pod's cgroup caps its processes before the sandbox exists, on a
// cgroup v1 pids hierarchy and on a v2 tree (the controller enabled down
// to the pod); a node without the controller refuses rather than run
// unlimited.
func TestPodPidsLimit(t *testing.T) {
	const uid = "0b7e4b4e-3c1c-4f0a-9d65-6a3b1e2f4c5d"
	v1 := t.TempDir()
	must(t, os.MkdirAll(filepath.Join(v1, "pids"), 0o755))
	must(t, os.WriteFile(filepath.Join(v1, "pids", "cgroup.procs"), nil, 0o644))
	m := NewManager(Config{CgroupFS: v1, PodPidsLimit: 321}, zerolog.Nop())
	must(t, m.limitPodPids(uid))
	if got, err := os.ReadFile(filepath.Join(v1, "pids", "mqlet", "pod"+uid, "pids.max")); err != nil || string(got) != "321" {
		t.Fatalf("v1 pids.max: %q, %v", got, err)
	}

	v2 := t.TempDir()
	must(t, os.WriteFile(filepath.Join(v2, "cgroup.controllers"), []byte("cpu memory pids\n"), 0o644))
	m = NewManager(Config{CgroupFS: v2, PodPidsLimit: 321}, zerolog.Nop())
	must(t, m.limitPodPids(uid))
	for _, f := range []string{"cgroup.subtree_control", "mqlet/cgroup.subtree_control"} {
		if got, err := os.ReadFile(filepath.Join(v2, f)); err != nil || string(got) != "+pids" {
			t.Fatalf("v2 %s: %q, %v", f, got, err)
		}
	}
	if got, err := os.ReadFile(filepath.Join(v2, "mqlet", "pod"+uid, "pids.max")); err != nil || string(got) != "321" {
		t.Fatalf("v2 pids.max: %q, %v", got, err)
	}

	if err := NewManager(Config{CgroupFS: t.TempDir(), PodPidsLimit: 321}, zerolog.Nop()).limitPodPids(uid); err == nil {
		t.Fatal("no pids controller, yet no error")
	}
	if err := NewManager(Config{CgroupFS: t.TempDir()}, zerolog.Nop()).limitPodPids(uid); err != nil {
		t.Fatalf("no limit configured: %v", err)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// The collector lists pod cgroups in every hierarchy mqlet or the runtime
// writes: a pod killed before its sandbox has one only in the pids
// hierarchy (cgroup v1), and the v2 'unified' mount of a hybrid host holds
// others; each uid is listed once.
func TestPodCgroupUIDsListsEveryHierarchy(t *testing.T) {
	const (
		pidsOnly = "0b6c1a52-7d1e-4c55-9a3e-2f1d8e4b7a11"
		unified  = "0b6c1a52-7d1e-4c55-9a3e-2f1d8e4b7a12"
		everyV1  = "0b6c1a52-7d1e-4c55-9a3e-2f1d8e4b7a13"
		v2Tree   = "0b6c1a52-7d1e-4c55-9a3e-2f1d8e4b7a14"
	)
	root := t.TempDir()
	m := NewManager(Config{CgroupFS: root, CgroupRoot: "/edge"}, zerolog.Nop())
	for _, d := range []string{
		"pids/edge/pod" + pidsOnly,
		"unified/edge/pod" + unified,
		"memory/edge/pod" + everyV1, "pids/edge/pod" + everyV1, "cpu,cpuacct/edge/pod" + everyV1, "unified/edge/pod" + everyV1,
		"edge/pod" + v2Tree,
		"memory/mqlet/pod0b6c1a52-7d1e-4c55-9a3e-2f1d8e4b7a15", // another root: not ours
		"pids/edge/podnot-a-uid",
	} {
		must(t, os.MkdirAll(filepath.Join(root, d), 0o755))
	}
	got := m.podCgroupUIDs()
	want := []string{pidsOnly, unified, everyV1, v2Tree}
	if len(got) != len(want) {
		t.Fatalf("pod cgroup uids %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("pod cgroup uids %v, want %v", got, want)
		}
	}
	for _, uid := range want {
		must(t, m.removePodCgroup(uid))
	}
	if left := m.podCgroupUIDs(); len(left) != 0 {
		t.Fatalf("left after removal: %v", left)
	}
	for _, h := range []string{"pids", "unified", "memory", "cpu,cpuacct"} {
		if _, err := os.Stat(filepath.Join(root, h, "edge")); err != nil {
			t.Fatalf("the cgroup root of %s went with its pods: %v", h, err)
		}
	}
}
