package cri

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
)

// hostPath volumes are checked again here, at mount time, on the real
// path: admission saw only the string, and a pod can plant
// "<allowed>/pivot -> /" for a later pod to mount. The path is resolved,
// re-checked against the node's allowed directories, opened beneath the
// allowed directory it lies in (openat2 RESOLVE_BENEATH, so a symlink
// swapped in after the check cannot lead out), and that open file is
// bind-mounted under the pod directory for the CRI: what the container
// gets is exactly what was checked. Directories or files the volume's type
// creates are made beneath the resolved parent, never through a symlink.

// allowedRoot returns the allowed directory (resolved) that real lies in.
func (m *Manager) allowedRoot(real string) (string, bool) {
	for _, a := range m.cfg.AllowedHostPaths {
		if !filepath.IsAbs(a) {
			continue
		}
		c, err := filepath.EvalSymlinks(a)
		if err != nil {
			c = filepath.Clean(a)
		}
		if c == "/" || real == c || strings.HasPrefix(real, c+"/") {
			return c, true
		}
	}
	return "", false
}

// hostPathAllowed reports whether p lies in one of the allowed
// directories, each taken as written and resolved.
func (m *Manager) hostPathAllowed(p string) bool {
	for _, a := range m.cfg.AllowedHostPaths {
		if !filepath.IsAbs(a) {
			continue
		}
		if c := filepath.Clean(a); c == "/" || p == c || strings.HasPrefix(p, c+"/") {
			return true
		}
	}
	_, ok := m.allowedRoot(p)
	return ok
}

// errRefused marks a volume the node's policy refuses: retrying cannot
// help, so the pod's containers report CreateContainerConfigError.
var errRefused = errors.New("refused by the node's policy")

func (m *Manager) refuseHostPath(path, real string) error {
	if len(m.cfg.AllowedHostPaths) == 0 {
		return fmt.Errorf("hostPath %s: no host paths are allowed on this node: %w", path, errRefused)
	}
	if real != path {
		return fmt.Errorf("hostPath %s resolves to %s, outside the allowed host paths (%s): %w", path, real, strings.Join(m.cfg.AllowedHostPaths, ", "), errRefused)
	}
	return fmt.Errorf("hostPath %s is outside the allowed host paths (%s): %w", path, strings.Join(m.cfg.AllowedHostPaths, ", "), errRefused)
}

// prepareHostPath creates what the volume's type asks for, checks the
// resolved path and its type, and returns the bind mount of it under the
// pod directory for the CRI to mount.
func (m *Manager) prepareHostPath(uid, volume string, hp *v1.HostPathVolumeSource) (string, error) {
	podDir, err := m.podDir(uid)
	if err != nil {
		return "", err
	}
	if err := checkLabelName("volume", volume); err != nil {
		return "", err
	}
	if !filepath.IsAbs(hp.Path) {
		return "", fmt.Errorf("hostPath %q is not absolute", hp.Path)
	}
	p := filepath.Clean(hp.Path)
	if !m.hostPathAllowed(p) {
		return "", m.refuseHostPath(p, p)
	}
	t := v1.HostPathUnset
	if hp.Type != nil {
		t = *hp.Type
	}
	switch t {
	case v1.HostPathDirectoryOrCreate, v1.HostPathFileOrCreate:
		if err := m.createHostPath(p, t == v1.HostPathFileOrCreate); err != nil {
			return "", err
		}
	case v1.HostPathUnset:
		// The runtime would create a missing path as a directory; do it
		// here, safely, instead.
		if _, err := os.Lstat(p); errors.Is(err, os.ErrNotExist) {
			if err := m.createHostPath(p, false); err != nil {
				return "", err
			}
		}
	}
	real, err := filepath.EvalSymlinks(p)
	if err != nil {
		return "", fmt.Errorf("hostPath %s: %w", p, err)
	}
	root, ok := m.allowedRoot(real)
	if !ok {
		return "", m.refuseHostPath(p, real)
	}
	rel, err := filepath.Rel(root, real)
	if err != nil {
		return "", fmt.Errorf("hostPath %s: %w", p, err)
	}
	var o beneathOpener
	fd, err := o.openSubpath(root, rel, false)
	if errors.Is(err, errEscapes) {
		return "", fmt.Errorf("hostPath %s changed while it was checked (%w): %w", p, err, errRefused)
	}
	if err != nil {
		return "", fmt.Errorf("hostPath %s: %w", p, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return "", fmt.Errorf("hostPath %s: %w", p, err)
	}
	if err := checkHostPathType(p, t, st.Mode&unix.S_IFMT); err != nil {
		return "", err
	}
	target := filepath.Join(podDir, hostPathsDir, volume)
	// Recursive, as the runtime binds hostPaths: mounts below stay visible.
	if err := bindFd(fd, target, true); err != nil {
		return "", fmt.Errorf("hostPath %s: %w", p, err)
	}
	return target, nil
}

// checkHostPathType checks the file type (S_IFMT bits) the volume's type
// asks for.
func checkHostPathType(p string, t v1.HostPathType, mode uint32) error {
	switch {
	case (t == v1.HostPathDirectory || t == v1.HostPathDirectoryOrCreate) && mode != unix.S_IFDIR:
		return fmt.Errorf("hostPath %s is not a directory", p)
	case (t == v1.HostPathFile || t == v1.HostPathFileOrCreate) && mode != unix.S_IFREG:
		return fmt.Errorf("hostPath %s is not a file", p)
	case t == v1.HostPathSocket && mode != unix.S_IFSOCK:
		return fmt.Errorf("hostPath %s is not a socket", p)
	case t == v1.HostPathCharDev && mode != unix.S_IFCHR:
		return fmt.Errorf("hostPath %s is not a character device", p)
	case t == v1.HostPathBlockDev && mode != unix.S_IFBLK:
		return fmt.Errorf("hostPath %s is not a block device", p)
	}
	return nil
}

// createHostPath makes the missing part of p beneath its deepest existing
// ancestor, resolved and checked against the allowlist first, so a
// planted symlink cannot point the creation elsewhere.
func (m *Manager) createHostPath(p string, file bool) error {
	existing := p
	for {
		if _, err := os.Lstat(existing); err == nil {
			break
		}
		parent := filepath.Dir(existing)
		if parent == existing {
			return fmt.Errorf("hostPath %s: no existing ancestor", p)
		}
		existing = parent
	}
	if existing == p {
		return nil // exists; its resolution is checked by the caller
	}
	base, err := filepath.EvalSymlinks(existing)
	if err != nil {
		return fmt.Errorf("hostPath %s: %w", p, err)
	}
	rest, err := filepath.Rel(existing, p)
	if err != nil {
		return fmt.Errorf("hostPath %s: %w", p, err)
	}
	target := filepath.Join(base, rest)
	root, ok := m.allowedRoot(target)
	if !ok {
		return m.refuseHostPath(p, target)
	}
	// Created beneath the allowed directory, never by the resolved path:
	// a pod writing there can swap a directory of it for a symlink out
	// between the resolution and the creation.
	beneath, err := filepath.Rel(root, target)
	if err != nil {
		return fmt.Errorf("hostPath %s: %w", p, err)
	}
	if m.afterResolve != nil {
		m.afterResolve()
	}
	var o beneathOpener
	dirs, name := beneath, ""
	if file {
		dirs, name = filepath.Dir(beneath), filepath.Base(beneath)
	}
	fd, err := o.openSubpathMode(root, dirs, true, 0o755)
	if errors.Is(err, errEscapes) {
		return fmt.Errorf("hostPath %s changed while it was created (%w): %w", p, err, errRefused)
	}
	if err != nil {
		return fmt.Errorf("create hostPath %s: %w", p, err)
	}
	defer unix.Close(fd)
	if !file {
		return nil
	}
	f, err := unix.Openat(fd, name, unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_RDONLY|unix.O_CLOEXEC, 0o644)
	if err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("create hostPath %s: %w", p, err)
	}
	if err == nil {
		unix.Close(f)
	}
	return nil
}
