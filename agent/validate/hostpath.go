package validate

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// hostPathAllowed reports whether hostPath lies in an allowed directory,
// judged twice: as written (cleaned, so "/data/../etc" is "/etc" and
// "/database" is not under "/data") and with symlinks resolved on this host
// (so "<allowed>/pivot -> /" is judged as "/"). If it is denied, why says so.
// The runtime checks again when it mounts, since the host can change in
// between.
func (p Policy) hostPathAllowed(hostPath string) (ok bool, why string) {
	if !filepath.IsAbs(hostPath) {
		return false, fmt.Sprintf("hostPath %s is not absolute", quote(hostPath))
	}
	if len(hostPath) > maxHostPathBytes {
		return false, fmt.Sprintf("hostPath is longer than %d bytes", maxHostPathBytes)
	}
	if len(p.AllowedHostPaths) == 0 {
		return false, "no allowedHostPaths are configured"
	}
	cleaned := filepath.Clean(hostPath)
	real, err := resolveHostPath(cleaned)
	if err != nil {
		return false, fmt.Sprintf("hostPath %s cannot be resolved: %v", quote(hostPath), err)
	}
	for _, allowed := range p.AllowedHostPaths {
		if !filepath.IsAbs(allowed) {
			continue // a relative prefix in the config allows nothing
		}
		prefix := filepath.Clean(allowed)
		realPrefix, err := resolveHostPath(prefix)
		if err != nil {
			continue
		}
		if within(cleaned, prefix) && within(real, realPrefix) {
			return true, ""
		}
	}
	if real != cleaned {
		return false, fmt.Sprintf("hostPath %s resolves to %s, not under allowedHostPaths (%s)", quote(hostPath), quote(real), quoteAll(p.AllowedHostPaths))
	}
	return false, fmt.Sprintf("hostPath %s is not under allowedHostPaths (%s)", quote(hostPath), quoteAll(p.AllowedHostPaths))
}

// maxHostPathBytes is Linux's PATH_MAX; it also bounds the walk up a path
// that does not exist.
const maxHostPathBytes = 4096

func within(path, dir string) bool {
	return dir == "/" || path == dir || strings.HasPrefix(path, dir+"/")
}

// resolveHostPath resolves every symlink in the absolute, clean path p. A
// path that does not exist yet (DirectoryOrCreate) is its deepest existing
// ancestor resolved, plus the missing rest; a component that exists but
// cannot be resolved (a dangling or looping symlink) is an error, since
// where it will lead cannot be judged.
func resolveHostPath(p string) (string, error) {
	existing, rest := p, ""
	for {
		if _, err := os.Lstat(existing); err == nil {
			break
		} else if !errors.Is(err, fs.ErrNotExist) {
			return "", fmt.Errorf("inspecting %s: %w", existing, err)
		}
		parent := filepath.Dir(existing)
		if parent == existing {
			break // even "/" is missing: nothing to resolve
		}
		rest = filepath.Join(filepath.Base(existing), rest)
		existing = parent
	}
	real, err := filepath.EvalSymlinks(existing)
	if err != nil {
		return "", fmt.Errorf("resolving symlinks in %s: %w", existing, err)
	}
	return filepath.Join(real, rest), nil
}
