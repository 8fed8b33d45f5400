package metrics

import (
	"bufio"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// podNetPID picks a process of the pod whose network namespace is the pod's
// own: the smallest pid in the pod's cgroup tree (the sandbox's pause
// process starts first). It returns 0 when the pod has no process or shares
// the host's network namespace (hostNetwork pods have no pod network).
func (c *Collector) podNetPID(uid string) int {
	mount := c.cgroupMounts["pids"]
	if mount == "" {
		mount = c.cgroupMounts["memory"]
	}
	if mount == "" {
		return 0
	}
	best := 0
	root := filepath.Join(mount, c.PodCgroup(uid))
	_ = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() != "cgroup.procs" {
			return nil // a vanishing cgroup is not an error here
		}
		f, err := os.Open(path)
		if err != nil {
			return nil
		}
		defer f.Close()
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if pid, err := strconv.Atoi(strings.TrimSpace(sc.Text())); err == nil && pid > 0 && (best == 0 || pid < best) {
				best = pid
			}
		}
		return nil
	})
	if best == 0 || sameNetNS(best, os.Getpid()) {
		return 0
	}
	return best
}

// sameNetNS reports whether two processes share a network namespace.
func sameNetNS(a, b int) bool {
	na, errA := os.Readlink("/proc/" + strconv.Itoa(a) + "/ns/net")
	nb, errB := os.Readlink("/proc/" + strconv.Itoa(b) + "/ns/net")
	return errA == nil && errB == nil && na == nb
}
