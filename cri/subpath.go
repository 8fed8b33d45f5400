package cri

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Safe subpaths, the kubelet's way: a container can plant symlinks inside a
// volume it writes, so "subPath: x" must never be resolved by path on the
// host. The subpath is opened component by component beneath the volume
// (openat2 RESOLVE_BENEATH, or an O_NOFOLLOW walk where openat2 is
// missing), the open file is bind-mounted onto a stable path under the pod
// directory, and that path is what the CRI mounts. The runtime never looks
// at the subpath by name again, so a symlink swapped in later changes
// nothing.

// errEscapes marks a subpath that leaves its volume.
var errEscapes = errors.New("escapes the volume")

// checkRelative accepts a relative, clean-able path without ".." components.
func checkRelative(p string) error {
	if p == "" || filepath.IsAbs(p) {
		return fmt.Errorf("%q must be a relative path", p)
	}
	for _, part := range strings.Split(p, "/") {
		if part == ".." {
			return fmt.Errorf("%q must not contain '..'", p)
		}
	}
	return nil
}

// subpathComponents splits a checked relative path into its non-empty,
// non-"." components.
func subpathComponents(p string) []string {
	var out []string
	for _, part := range strings.Split(p, "/") {
		if part != "" && part != "." {
			out = append(out, part)
		}
	}
	return out
}

// beneathOpener opens a relative path under a directory fd without leaving
// it; openat2 is tried first and the O_NOFOLLOW walk when the kernel lacks
// it.
type beneathOpener struct {
	noOpenat2 bool
}

func (o *beneathOpener) open(rootFd int, comps []string, flags int) (int, error) {
	rel := "."
	if len(comps) > 0 {
		rel = strings.Join(comps, "/")
	}
	if !o.noOpenat2 {
		how := &unix.OpenHow{
			Flags:   uint64(flags | unix.O_CLOEXEC),
			Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_MAGICLINKS,
		}
		for {
			fd, err := unix.Openat2(rootFd, rel, how)
			switch {
			case err == nil:
				return fd, nil
			case errors.Is(err, unix.EINTR), errors.Is(err, unix.EAGAIN): // EAGAIN: a rename raced the lookup
				continue
			case errors.Is(err, unix.ENOSYS), errors.Is(err, unix.EPERM):
				// No openat2 (old kernel, or a seccomp filter answering
				// EPERM): the stricter walk below decides.
				o.noOpenat2 = true
			case errors.Is(err, unix.EXDEV), errors.Is(err, unix.ELOOP):
				return -1, errEscapes
			default:
				return -1, err
			}
			break
		}
	}
	return openNoFollow(rootFd, comps, flags)
}

// openNoFollow walks comps from rootFd refusing every symlink; stricter
// than openat2 (even symlinks that stay inside are refused) but safe on
// old kernels.
func openNoFollow(rootFd int, comps []string, flags int) (int, error) {
	fd, err := unix.Dup(rootFd)
	if err != nil {
		return -1, err
	}
	for i, comp := range comps {
		f := unix.O_PATH | unix.O_NOFOLLOW | unix.O_CLOEXEC
		if i == len(comps)-1 {
			f = flags | unix.O_NOFOLLOW | unix.O_CLOEXEC
		}
		next, err := unix.Openat(fd, comp, f, 0)
		unix.Close(fd)
		if errors.Is(err, unix.ELOOP) {
			return -1, errEscapes
		}
		if err != nil {
			return -1, err
		}
		var st unix.Stat_t
		if err := unix.Fstat(next, &st); err != nil {
			unix.Close(next)
			return -1, err
		}
		if st.Mode&unix.S_IFMT == unix.S_IFLNK {
			unix.Close(next)
			return -1, fmt.Errorf("%s is a symlink: %w", strings.Join(comps[:i+1], "/"), errEscapes)
		}
		fd = next
	}
	return fd, nil
}

// openSubpath opens sub beneath the directory root (an O_PATH fd to
// return), creating missing directories with the mode of root, never
// through a symlink that leaves root.
func (o *beneathOpener) openSubpath(root string, sub string, create bool) (int, error) {
	return o.openSubpathMode(root, sub, create, 0)
}

// openSubpathMode is openSubpath creating directories with mode (0: the
// mode of root).
func (o *beneathOpener) openSubpathMode(root string, sub string, create bool, mode uint32) (int, error) {
	if err := checkRelative(sub); err != nil {
		return -1, err
	}
	rootFd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("open volume: %w", err)
	}
	defer unix.Close(rootFd)
	var rootSt unix.Stat_t
	if err := unix.Fstat(rootFd, &rootSt); err != nil {
		return -1, fmt.Errorf("stat volume: %w", err)
	}
	comps := subpathComponents(sub)
	fd, err := o.open(rootFd, comps, unix.O_PATH)
	if err == nil || !create || !errors.Is(err, unix.ENOENT) {
		return fd, err
	}
	for i := range comps {
		fd, err := o.open(rootFd, comps[:i+1], unix.O_PATH)
		if err == nil {
			unix.Close(fd)
			continue
		}
		if !errors.Is(err, unix.ENOENT) {
			return -1, err
		}
		m := mode
		if m == 0 {
			m = rootSt.Mode & 0o7777
		}
		if err := o.mkdirBeneath(rootFd, comps[:i], comps[i], m); err != nil {
			return -1, err
		}
	}
	return o.open(rootFd, comps, unix.O_PATH)
}

// mkdirBeneath makes dir name in the directory parent (beneath rootFd)
// and gives it mode; the chmod goes through an fd, never a path.
func (o *beneathOpener) mkdirBeneath(rootFd int, parent []string, name string, mode uint32) error {
	pfd, err := o.open(rootFd, parent, unix.O_PATH|unix.O_DIRECTORY)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	if err := unix.Mkdirat(pfd, name, mode); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("create %s: %w", name, err)
	}
	dfd, err := o.open(rootFd, append(slices.Clone(parent), name), unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return err
	}
	defer unix.Close(dfd)
	return unix.Fchmod(dfd, mode)
}

// bindFd bind-mounts the file open as fd onto target (recursively, with
// the mounts below it, when recursive), replacing what an earlier attempt
// mounted there unless that already is the same file. target is created
// as a directory or an empty file to match. The new mount is made private
// at once, so unmounting it later can never propagate into the host's own
// mounts.
func bindFd(fd int, target string, recursive bool) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(target), 0o750); err != nil {
		return err
	}
	mounted, err := mountPointsUnder(target)
	if err != nil {
		return err
	}
	if len(mounted) > 0 {
		var cur unix.Stat_t
		if err := unix.Stat(target, &cur); err == nil && cur.Dev == st.Dev && cur.Ino == st.Ino {
			return nil // still the same file: keep the mount running containers share
		}
		for _, mp := range mounted {
			if err := unix.Unmount(mp, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
				return fmt.Errorf("unmount previous %s: %w", mp, err)
			}
		}
	}
	isDir := st.Mode&unix.S_IFMT == unix.S_IFDIR
	if info, err := os.Lstat(target); err == nil && info.IsDir() != isDir {
		if err := os.Remove(target); err != nil {
			return err
		}
	}
	if isDir {
		if err := os.Mkdir(target, 0o750); err != nil && !errors.Is(err, os.ErrExist) {
			return err
		}
	} else {
		f, err := os.OpenFile(target, os.O_CREATE|os.O_RDONLY, 0o640)
		if err != nil {
			return err
		}
		f.Close()
	}
	flags := uintptr(unix.MS_BIND)
	if recursive {
		flags |= unix.MS_REC
	}
	src := "/proc/self/fd/" + strconv.Itoa(fd)
	if err := unix.Mount(src, target, "", flags, ""); err != nil {
		return fmt.Errorf("bind mount onto %s: %w", target, err)
	}
	if err := unix.Mount("", target, "", unix.MS_PRIVATE|unix.MS_REC, ""); err != nil {
		_ = unix.Unmount(target, unix.MNT_DETACH)
		return fmt.Errorf("make %s private: %w", target, err)
	}
	return nil
}

// mountPointsUnder lists the mount points at or below dir (deepest first),
// from this process's mountinfo.
func mountPointsUnder(dir string) ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("read mounts: %w", err)
	}
	defer f.Close()
	dir = filepath.Clean(dir)
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := unescapeMountinfo(fields[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			out = append(out, mp)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read mounts: %w", err)
	}
	slices.SortFunc(out, func(a, b string) int { return len(b) - len(a) })
	return out, nil
}

// unescapeMountinfo undoes the kernel's \NNN octal escapes (space, tab,
// newline, backslash).
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// unmountAll detaches every mount at or below dir and checks none is left,
// so a RemoveAll of dir cannot reach through a bind mount into the host.
func unmountAll(dir string) error {
	mounts, err := mountPointsUnder(dir)
	if err != nil {
		return err
	}
	for _, mp := range mounts {
		if err := unix.Unmount(mp, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("unmount %s: %w", mp, err)
		}
	}
	left, err := mountPointsUnder(dir)
	if err != nil {
		return err
	}
	if len(left) > 0 {
		return fmt.Errorf("mounts still present under %s: %s", dir, strings.Join(left, ", "))
	}
	return nil
}

// removeAllUnmounted removes dir after unmounting everything under it; it
// refuses when a mount could not be removed.
func removeAllUnmounted(dir string) error {
	if err := unmountAll(dir); err != nil {
		return fmt.Errorf("not removing %s: %w", dir, err)
	}
	return os.RemoveAll(dir)
}

func closeFd(fd int) { _ = unix.Close(fd) }
