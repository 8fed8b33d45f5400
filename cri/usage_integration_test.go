package cri

import (
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
)

// storagePod is a pod whose container writes kib KiB into an emptyDir
// named scratch and sleeps.
func (e *env) storagePod(kib int) *v1.Pod {
	pod := e.newPod(v1.RestartPolicyAlways, v1.Container{Name: "writer",
		Command:      []string{"sh", "-c", "dd if=/dev/zero of=/scratch/f bs=1024 count=" + strconv.Itoa(kib) + " 2>/dev/null; sleep 3600"},
		VolumeMounts: []v1.VolumeMount{{Name: "scratch", MountPath: "/scratch"}}})
	pod.Spec.Volumes = []v1.Volume{{Name: "scratch", VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}}}
	return pod
}

// PodUsage reports a pod's emptyDir (bytes, as du counts them), its
// container's logs and working set and its processes; once the pod is
// stopped, ReleasePodStorage empties the emptyDir.
func TestPodUsageAndReleasePodStorage(t *testing.T) {
	e := newEnv(t)
	pod := e.storagePod(2048)
	uid := string(pod.UID)
	e.syncUntil(pod, 30*time.Second, "writer running", isRunning("writer"))
	var u PodUsage
	deadline := time.Now().Add(20 * time.Second)
	for {
		all, err := e.m.PodUsage(e.ctx, map[string]bool{uid: true})
		if err != nil {
			t.Fatal(err)
		}
		u = all[uid]
		if u.EmptyDirs["scratch"].Bytes >= 2048<<10 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the emptyDir's 2 MiB never showed: %+v", u)
		}
		<-time.After(200 * time.Millisecond) // polling the writer with a deadline
	}
	if u.EmptyDirs["scratch"].Inodes < 2 || u.MemoryWorkingSetBytes == 0 {
		t.Errorf("usage %+v: want the dir and its file counted, a working set", u)
	}
	if _, ok := u.Containers["writer"]; !ok {
		t.Errorf("no usage of the writer container: %+v", u)
	}
	if err := e.m.StopPod(e.ctx, pod, nil); err != nil {
		t.Fatal(err)
	}
	if err := e.m.ReleasePodStorage(uid); err != nil {
		t.Fatal(err)
	}
	dir, _ := e.m.podVolumeDir(uid, "kubernetes.io~empty-dir", "scratch")
	entries, err := os.ReadDir(dir)
	if err != nil || len(entries) != 0 {
		t.Fatalf("emptyDir after release: %v entries, err %v", len(entries), err)
	}
}

// The cost of reading 20 running pods' usage (what an eviction pass asks
// of the runtime, the disk and the cgroups): MQLET_EVICTION_COST=1.
func TestPodUsageCost20Pods(t *testing.T) {
	if os.Getenv("MQLET_EVICTION_COST") == "" {
		t.Skip("set MQLET_EVICTION_COST=1 to measure")
	}
	e := newEnv(t)
	uids := map[string]bool{}
	for range 20 {
		pod := e.storagePod(512)
		uids[string(pod.UID)] = true
		e.syncUntil(pod, 60*time.Second, "writer running", isRunning("writer"))
	}
	const rounds = 50
	var before, after syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &before)
	start := time.Now()
	for range rounds {
		all, err := e.m.PodUsage(e.ctx, uids)
		if err != nil || len(all) != 20 {
			t.Fatalf("%d pods, %v", len(all), err)
		}
	}
	wall := time.Since(start)
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &after)
	cpu := time.Duration(after.Utime.Nano()+after.Stime.Nano()-before.Utime.Nano()-before.Stime.Nano()) / rounds
	t.Logf("PodUsage of 20 pods: %v CPU (mqlet's side), %v wall per read; at one pass per 10 s: %.3f%% of a core",
		cpu, wall/rounds, 100*cpu.Seconds()/10)
}
