package cri

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// podCgroupDirs lists the directories of the pod's cgroup under every
// mounted hierarchy (each cgroup v1 controller, and the v2 tree).
func (m *Manager) podCgroupDirs(uid string) []string {
	parent, err := m.podCgroupParent(uid)
	if err != nil {
		return nil
	}
	dirs, _ := filepath.Glob(filepath.Join(m.cfg.CgroupFS, "*", parent))
	if st, err := os.Stat(filepath.Join(m.cfg.CgroupFS, parent)); err == nil && st.IsDir() {
		dirs = append(dirs, filepath.Join(m.cfg.CgroupFS, parent))
	}
	return dirs
}

// removePodCgroup removes the pod's cgroup directories once its containers
// are gone; the runtime removes the containers' cgroups but not the parent
// that mqlet named, which would otherwise pile up on a long-lived gateway.
// A cgroup still in use cannot be removed (rmdir fails), so this never
// disturbs a running pod.
func (m *Manager) removePodCgroup(uid string) error {
	if err := checkUID(uid); err != nil {
		return err
	}
	var errs []error
	for _, dir := range m.podCgroupDirs(uid) {
		if err := removeCgroupTree(dir); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// removeCgroupTree rmdirs dir and its sub-cgroups, deepest first. cgroupfs
// directories hold only kernel files, which go with the rmdir.
func removeCgroupTree(dir string) error {
	var subdirs []string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			subdirs = append(subdirs, path)
		}
		return nil
	})
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for i := len(subdirs) - 1; i >= 0; i-- {
		if err := os.Remove(subdirs[i]); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	return nil
}

// podCgroupUIDs lists the uids of pod cgroups under the cgroup root in
// every hierarchy: each cgroup v1 controller (a pod without pod-level
// resources has a cgroup of its own only in the pids hierarchy until its
// sandbox exists), the v2 'unified' mount beside them, and a v2 tree.
func (m *Manager) podCgroupUIDs() []string {
	bases, _ := filepath.Glob(filepath.Join(m.cfg.CgroupFS, "*", m.cfg.CgroupRoot))
	bases = append(bases, filepath.Join(m.cfg.CgroupFS, m.cfg.CgroupRoot))
	seen := map[string]bool{}
	var uids []string
	for _, base := range bases {
		entries, err := os.ReadDir(base)
		if err != nil {
			continue
		}
		for _, e := range entries {
			if uid, ok := strings.CutPrefix(e.Name(), "pod"); ok && e.IsDir() && IsUID(uid) && !seen[uid] {
				seen[uid] = true
				uids = append(uids, uid)
			}
		}
	}
	slices.Sort(uids)
	return uids
}

// podCgroupYoungerThan reports whether any of the pod's cgroup directories
// changed within age.
func (m *Manager) podCgroupYoungerThan(uid string, age time.Duration) bool {
	if age <= 0 {
		return false
	}
	for _, dir := range m.podCgroupDirs(uid) {
		if st, err := os.Stat(dir); err == nil && time.Since(st.ModTime()) < age {
			return true
		}
	}
	return false
}

// limitPodPids makes the pod's cgroup in the pids hierarchy before its
// sandbox exists and caps the processes all its containers hold together
// (the runtime creates theirs beneath it). Without a cap one container's
// fork bomb takes every pid of the node; mqlet, unable to start a thread,
// dies, and dies again after each restart, since the processes outlive it.
func (m *Manager) limitPodPids(uid string) error {
	if m.cfg.PodPidsLimit <= 0 {
		return nil
	}
	parent, err := m.podCgroupParent(uid)
	if err != nil {
		return err
	}
	limit := []byte(strconv.FormatInt(m.cfg.PodPidsLimit, 10))
	// cgroup v1: a pids hierarchy of its own.
	if v1 := filepath.Join(m.cfg.CgroupFS, "pids"); isCgroup(v1) {
		dir := filepath.Join(v1, parent)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dir, "pids.max"), limit, 0o644)
	}
	// cgroup v2: the controller must be enabled down to the pod's parent.
	if controllers, err := os.ReadFile(filepath.Join(m.cfg.CgroupFS, "cgroup.controllers")); err == nil && slices.Contains(strings.Fields(string(controllers)), "pids") {
		dir := m.cfg.CgroupFS
		for _, part := range strings.Split(strings.Trim(parent, "/"), "/") {
			if err := os.WriteFile(filepath.Join(dir, "cgroup.subtree_control"), []byte("+pids"), 0o644); err != nil {
				return err
			}
			dir = filepath.Join(dir, part)
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return err
			}
		}
		return os.WriteFile(filepath.Join(dir, "pids.max"), limit, 0o644)
	}
	return errors.New("no pids cgroup controller: cannot limit the pod's processes (set pods.pidsLimit: 0 to run without a limit)")
}

func isCgroup(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, "cgroup.procs"))
	return err == nil
}
