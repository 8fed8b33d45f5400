package runtime

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
// "<allowed>/pivot -> /" for a later pod to mount. The CRI gets the
// resolved path, and directories or files the pod's type creates are made
// beneath the resolved parent, never through a symlink.

// hostPathAllowed reports whether the resolved path real lies in one of
// the allowed directories (each taken as written and resolved).
func (m *Manager) hostPathAllowed(real string) bool {
	for _, a := range m.cfg.AllowedHostPaths {
		if !filepath.IsAbs(a) {
			continue
		}
		candidates := []string{filepath.Clean(a)}
		if r, err := filepath.EvalSymlinks(a); err == nil {
			candidates = append(candidates, r)
		}
		for _, c := range candidates {
			if c == "/" || real == c || strings.HasPrefix(real, c+"/") {
				return true
			}
		}
	}
	return false
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
// type, and returns the real path to mount.
func (m *Manager) prepareHostPath(hp *v1.HostPathVolumeSource) (string, error) {
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
	if t == v1.HostPathDirectoryOrCreate || t == v1.HostPathFileOrCreate {
		if err := m.createHostPath(p, t == v1.HostPathFileOrCreate); err != nil {
			return "", err
		}
	}
	real, err := filepath.EvalSymlinks(p)
	if err != nil {
		return "", fmt.Errorf("hostPath %s: %w", p, err)
	}
	if !m.hostPathAllowed(real) {
		return "", m.refuseHostPath(p, real)
	}
	info, err := os.Stat(real)
	if err != nil {
		return "", fmt.Errorf("hostPath %s: %w", p, err)
	}
	switch {
	case (t == v1.HostPathDirectory || t == v1.HostPathDirectoryOrCreate) && !info.IsDir():
		return "", fmt.Errorf("hostPath %s is not a directory", p)
	case (t == v1.HostPathFile || t == v1.HostPathFileOrCreate) && !info.Mode().IsRegular():
		return "", fmt.Errorf("hostPath %s is not a file", p)
	case t == v1.HostPathSocket && info.Mode()&os.ModeSocket == 0:
		return "", fmt.Errorf("hostPath %s is not a socket", p)
	case t == v1.HostPathCharDev && (info.Mode()&os.ModeDevice == 0 || info.Mode()&os.ModeCharDevice == 0):
		return "", fmt.Errorf("hostPath %s is not a character device", p)
	case t == v1.HostPathBlockDev && (info.Mode()&os.ModeDevice == 0 || info.Mode()&os.ModeCharDevice != 0):
		return "", fmt.Errorf("hostPath %s is not a block device", p)
	}
	return real, nil
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
	if target := filepath.Join(base, rest); !m.hostPathAllowed(target) {
		return m.refuseHostPath(p, target)
	}
	var o beneathOpener
	dirs, name := rest, ""
	if file {
		dirs, name = filepath.Dir(rest), filepath.Base(rest)
	}
	fd, err := o.openSubpathMode(base, dirs, true, 0o755)
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
