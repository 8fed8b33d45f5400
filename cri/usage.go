package cri

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// ContainerUsage is what one container (all its attempts) holds of the
// node: the writable layers, as the runtime reports them, and its log
// files.
type ContainerUsage struct {
	RootfsBytes  uint64
	RootfsInodes uint64
	LogsBytes    uint64
}

// DirUsage is what one directory tree holds on its filesystem.
type DirUsage struct {
	Bytes  uint64
	Inodes uint64
}

// PodUsage is what one mqlet pod uses, as eviction reads it.
type PodUsage struct {
	// MemoryWorkingSetBytes adds up its running containers' working sets.
	MemoryWorkingSetBytes uint64
	// Processes counts the tasks in its cgroup (pids.current).
	Processes uint64
	// Containers by container name.
	Containers map[string]ContainerUsage
	// EmptyDirs on the node's disk by volume name (medium Memory ones,
	// tmpfs mounts, are left out: they hold memory, not disk).
	EmptyDirs map[string]DirUsage
}

// PodUsage reads the usage of every mqlet pod whose uid is in uids, by
// uid: one container listing and one stats listing of the runtime, a walk
// of each pod's emptyDirs and log directories, and its pids cgroup.
func (m *Manager) PodUsage(ctx context.Context, uids map[string]bool) (map[string]PodUsage, error) {
	svc, err := m.conn.get()
	if err != nil {
		return nil, err
	}
	qctx := quietContext(ctx)
	containers, byID, err := listManagedWithStats(qctx, svc, "pod usage")
	if err != nil {
		return nil, err
	}
	out := make(map[string]PodUsage, len(uids))
	logsDone := map[string]bool{}
	for _, c := range containers {
		uid, name := c.Labels[LabelPodUID], c.Labels[LabelContainerName]
		if !uids[uid] || checkLabelName("container", name) != nil {
			continue
		}
		u := out[uid]
		if u.Containers == nil {
			u.Containers = map[string]ContainerUsage{}
		}
		cu := u.Containers[name]
		if s := byID[c.Id]; s != nil {
			if wl := s.GetWritableLayer(); wl != nil {
				cu.RootfsBytes += wl.GetUsedBytes().GetValue()
				cu.RootfsInodes += wl.GetInodesUsed().GetValue()
			}
			if c.State == runtimeapi.ContainerState_CONTAINER_RUNNING {
				u.MemoryWorkingSetBytes += s.GetMemory().GetWorkingSetBytes().GetValue()
			}
		}
		if key := uid + "/" + name; !logsDone[key] {
			logsDone[key] = true
			if dir, err := m.podLogDir(c.Labels[LabelPodNamespace], c.Labels[LabelPodName], uid); err == nil {
				cu.LogsBytes = dirBytes(filepath.Join(dir, name))
			}
		}
		u.Containers[name] = cu
		out[uid] = u
	}
	for uid := range uids {
		u := out[uid]
		u.EmptyDirs = m.emptyDirUsage(uid)
		u.Processes = m.podProcesses(uid)
		out[uid] = u
	}
	return out, nil
}

// emptyDirUsage walks the pod's emptyDirs on the node's disk.
func (m *Manager) emptyDirUsage(uid string) map[string]DirUsage {
	dir, err := m.podDir(uid)
	if err != nil {
		return nil
	}
	root := filepath.Join(dir, "volumes", "kubernetes.io~empty-dir")
	entries, err := os.ReadDir(root)
	if err != nil {
		return nil
	}
	var rootStat syscall.Stat_t
	if syscall.Lstat(root, &rootStat) != nil {
		return nil
	}
	out := make(map[string]DirUsage, len(entries))
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		path := filepath.Join(root, e.Name())
		var st syscall.Stat_t
		if syscall.Lstat(path, &st) != nil || st.Dev != rootStat.Dev {
			continue // a mount (medium Memory): not the node's disk
		}
		out[e.Name()] = treeUsage(path, st.Dev)
	}
	return out
}

// treeUsage adds up the blocks and inodes under dir on device dev, as du
// does (hard links counted once; other filesystems below it skipped).
func treeUsage(dir string, dev uint64) DirUsage {
	var u DirUsage
	seen := map[uint64]bool{}
	_ = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil // gone while walking
		}
		var st syscall.Stat_t
		if syscall.Lstat(path, &st) != nil {
			return nil
		}
		if st.Dev != dev {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if st.Nlink > 1 && !d.IsDir() {
			if seen[st.Ino] {
				return nil
			}
			seen[st.Ino] = true
		}
		u.Inodes++
		u.Bytes += uint64(st.Blocks) * 512
		return nil
	})
	return u
}

// podProcesses is pids.current of the pod's cgroup (0 when unknown).
func (m *Manager) podProcesses(uid string) uint64 {
	parent, err := m.podCgroupParent(uid)
	if err != nil {
		return 0
	}
	for _, dir := range []string{filepath.Join(m.cfg.CgroupFS, "pids", parent), filepath.Join(m.cfg.CgroupFS, parent)} {
		raw, err := os.ReadFile(filepath.Join(dir, "pids.current"))
		if err != nil {
			continue
		}
		if n, err := strconv.ParseUint(strings.TrimSpace(string(raw)), 10, 64); err == nil {
			return n
		}
	}
	return 0
}

// ReleasePodStorage removes the contents of the pod's emptyDirs, on the
// node's disk and medium Memory (a stopped pod's, evicted: what it wrote
// is given back, disk or memory, as the kubelet tears down a terminated
// pod's volumes). The directories, and the tmpfs mounts, stay for the
// pod's removal.
func (m *Manager) ReleasePodStorage(uid string) error {
	if m.terminating.active(uid) {
		return fmt.Errorf("release storage of pod %s: still terminating", uid)
	}
	dir, err := m.podDir(uid)
	if err != nil {
		return err
	}
	root := filepath.Join(dir, "volumes", "kubernetes.io~empty-dir")
	entries, err := os.ReadDir(root)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("release storage of pod %s: %w", uid, err)
	}
	var firstErr error
	for _, e := range entries {
		if !e.IsDir() { // a symlink or file where a volume should be: left alone
			continue
		}
		path := filepath.Join(root, e.Name())
		inner, err := os.ReadDir(path)
		if err != nil {
			continue
		}
		for _, f := range inner {
			// RemoveAll does not follow symlinks; a mount below is busy and stays.
			if err := os.RemoveAll(filepath.Join(path, f.Name())); err != nil && firstErr == nil {
				firstErr = fmt.Errorf("release storage of pod %s: %w", uid, err)
			}
		}
	}
	return firstErr
}

// ImageFilesystem is the mount point of the filesystem the runtime keeps
// its images on ("" when it names none).
func (m *Manager) ImageFilesystem(ctx context.Context) (string, error) {
	svc, err := m.conn.get()
	if err != nil {
		return "", err
	}
	resp, err := svc.image.ImageFsInfo(quietContext(ctx))
	if err != nil {
		return "", fmt.Errorf("image filesystem info: %w", err)
	}
	if fss := resp.GetImageFilesystems(); len(fss) > 0 {
		return fss[0].GetFsId().GetMountpoint(), nil
	}
	return "", nil
}
