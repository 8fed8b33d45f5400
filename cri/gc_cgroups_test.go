package cri

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
)

// An agent killed after making a pod's cgroups (pids.max is set before the
// sandbox) and directories, but before its sandbox, leaves them with
// nothing in the runtime for a delete to kill: the garbage collector
// removes them in every hierarchy once the pod is not desired, and keeps
// those of a running pod and of a pod whose sync is under way.
func TestGarbageCollectRemovesCgroupsLeftBeforeTheSandbox(t *testing.T) {
	root := "/mqlet-gc-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	e := newEnvConfig(t, func(c *Config) { c.CgroupRoot, c.PodPidsLimit = root, 64 })
	t.Cleanup(func() {
		dirs, _ := filepath.Glob(filepath.Join(e.m.cfg.CgroupFS, "*", root))
		for _, d := range dirs {
			_ = removeCgroupTree(d)
		}
	})
	running := e.newPod(v1.RestartPolicyAlways, sleeper("main"))
	e.syncUntil(running, 30*time.Second, "running", isRunning("main"))

	// What a sync makes before RunPodSandbox, as a kill there leaves it.
	leftBehind := func() *v1.Pod {
		pod := e.newPod(v1.RestartPolicyAlways, sleeper("main"))
		must(t, e.m.limitPodPids(string(pod.UID)))
		must(t, e.m.createPodDirs(pod))
		if dirs := e.m.podCgroupDirs(string(pod.UID)); len(dirs) == 0 {
			t.Fatal("no cgroup made for the pod before its sandbox")
		}
		return pod
	}
	orphan, syncing := leftBehind(), leftBehind()
	endSync := e.m.syncing.begin(string(syncing.UID))
	defer endSync()

	desired := func(uid string) bool { return uid == string(running.UID) }
	// A cgroup younger than the minimum age may be another process's pod
	// about to get its sandbox (two agents on one cgroup root): kept.
	must(t, e.m.GarbageCollect(e.ctx, GCPolicy{MaxPerPodContainer: 1, MinAge: time.Hour}, desired))
	if dirs := e.m.podCgroupDirs(string(orphan.UID)); len(dirs) == 0 {
		t.Error("GC removed a pod cgroup younger than the minimum age")
	}
	must(t, e.m.GarbageCollect(e.ctx, GCPolicy{MaxPerPodContainer: 1}, desired))

	if dirs := e.m.podCgroupDirs(string(orphan.UID)); len(dirs) != 0 {
		t.Errorf("cgroups of a pod killed before its sandbox survived GC: %v", dirs)
	}
	if _, err := os.Stat(filepath.Join(e.m.cfg.PodDir, string(orphan.UID))); !os.IsNotExist(err) {
		t.Errorf("pod dir of a pod killed before its sandbox survived GC: %v", err)
	}
	if dirs := e.m.podCgroupDirs(string(syncing.UID)); len(dirs) == 0 {
		t.Error("GC removed the cgroups of a pod whose sync is under way")
	}
	if _, err := os.Stat(filepath.Join(e.m.cfg.PodDir, string(syncing.UID))); err != nil {
		t.Errorf("GC removed the pod dir of a pod whose sync is under way: %v", err)
	}
	dirs := e.m.podCgroupDirs(string(running.UID))
	if len(dirs) < 2 {
		t.Fatalf("a running pod's cgroups: %v, want one per hierarchy", dirs)
	}
	for _, d := range dirs {
		if _, err := os.Stat(d); err != nil {
			t.Errorf("GC touched a running pod's cgroup %s: %v", d, err)
		}
	}
	if st := e.status(running); !isRunning("main")(st) {
		t.Fatalf("GC stopped a desired running pod: %+v", st)
	}
}
