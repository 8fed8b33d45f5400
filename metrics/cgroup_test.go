package metrics

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// busyAllocBytes is what the busy process puts in a tmpfs file after it has
// been moved into its cgroup, so the memory is charged there (cgroup v1 does
// not move existing charges by default).
const busyAllocBytes = 32 << 20

// busyScript waits for a line on stdin (sent once it sits in its cgroup),
// fills a tmpfs file (shmem counts in the working set) and spins.
const busyScript = `read go; head -c "$1" /dev/zero > "$2"; while :; do :; done`

// testCgroup is a pod cgroup with one container cgroup in the cpu,cpuacct and
// memory v1 hierarchies, holding one busy process.
type testCgroup struct {
	podUID      string
	containerID string
	dirs        []string // container dirs first, then pod dirs: removal order
	shmFile     string
	cmd         *exec.Cmd
}

func randomHex(t testing.TB, n int) string {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatalf("random: %v", err)
	}
	return hex.EncodeToString(b)
}

// newBusyCgroup creates <root>/podtest-<rand>/<id> under the cpu, cpuacct
// and memory controllers the collector found, moves a busy child into it and
// lets it fill memory. Everything is removed at test cleanup.
func newBusyCgroup(t testing.TB, c *Collector) *testCgroup {
	t.Helper()
	cpuMount, cpuacctMount, memMount := c.cgroupMounts["cpu"], c.cgroupMounts["cpuacct"], c.cgroupMounts["memory"]
	if cpuMount == "" || cpuacctMount == "" || memMount == "" {
		t.Fatalf("this test needs the cpu, cpuacct and memory cgroup v1 controllers; found mounts %v", c.cgroupMounts)
	}
	tc := &testCgroup{podUID: "test-" + randomHex(t, 6), containerID: randomHex(t, 32)}
	tc.shmFile = filepath.Join("/dev/shm", "mqlet-metrics-test-"+tc.podUID)
	podCgroup := c.PodCgroup(tc.podUID)
	var podDirs []string
	for _, mount := range uniqueStrings(cpuMount, cpuacctMount, memMount) {
		containerDir := filepath.Join(mount, podCgroup, tc.containerID)
		if err := os.MkdirAll(containerDir, 0o755); err != nil {
			t.Fatalf("creating cgroup %s (this test needs root): %v", containerDir, err)
		}
		tc.dirs = append(tc.dirs, containerDir)
		podDirs = append(podDirs, filepath.Join(mount, podCgroup))
	}
	tc.dirs = append(tc.dirs, podDirs...)
	t.Cleanup(func() { tc.remove(t) })

	tc.cmd = exec.Command("sh", "-c", busyScript, "busy", strconv.Itoa(busyAllocBytes), tc.shmFile)
	tc.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // so cleanup kills head too
	stdin, err := tc.cmd.StdinPipe()
	if err != nil {
		t.Fatalf("stdin pipe: %v", err)
	}
	if err := tc.cmd.Start(); err != nil {
		t.Fatalf("starting the busy process: %v", err)
	}
	pid := strconv.Itoa(tc.cmd.Process.Pid)
	for _, dir := range tc.dirs[:len(tc.dirs)/2] {
		if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(pid), 0o644); err != nil {
			t.Fatalf("moving pid %s into %s: %v", pid, dir, err)
		}
	}
	if _, err := io.WriteString(stdin, "go\n"); err != nil {
		t.Fatalf("starting the busy loop: %v", err)
	}
	return tc
}

func uniqueStrings(values ...string) []string {
	var out []string
	seen := map[string]bool{}
	for _, v := range values {
		if !seen[v] {
			seen[v] = true
			out = append(out, v)
		}
	}
	return out
}

// remove kills the busy process group, then deletes the file and the
// cgroups (retrying while the killed processes are still leaving them).
func (tc *testCgroup) remove(t testing.TB) {
	if tc.cmd != nil && tc.cmd.Process != nil {
		_ = syscall.Kill(-tc.cmd.Process.Pid, syscall.SIGKILL)
		_ = tc.cmd.Wait()
	}
	deadline := time.Now().Add(5 * time.Second)
	var errs []error
	if err := os.Remove(tc.shmFile); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, fmt.Errorf("removing %s: %w", tc.shmFile, err))
	}
	for _, dir := range tc.dirs {
		for {
			err := os.Remove(dir)
			if err == nil || errors.Is(err, os.ErrNotExist) {
				break
			}
			if !errors.Is(err, syscall.EBUSY) || time.Now().After(deadline) {
				errs = append(errs, fmt.Errorf("removing cgroup %s: %w", dir, err))
				break
			}
			waitEmpty(dir)
		}
	}
	if err := errors.Join(errs...); err != nil {
		t.Errorf("cleanup: %v", err)
	}
}

// waitEmpty gives killed processes a moment to leave a cgroup.
func waitEmpty(dir string) {
	timer := time.NewTimer(20 * time.Millisecond)
	defer timer.Stop()
	<-timer.C
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t testing.TB, timeout, every time.Duration, cond func() (bool, string)) {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		ok, why := cond()
		if ok {
			return
		}
		select {
		case <-deadline.C:
			t.Fatalf("condition not met within %s: %s", timeout, why)
		case <-tick.C:
		}
	}
}
