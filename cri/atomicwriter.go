package cri

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// The atomic writer publishes a configMap, secret, downwardAPI or
// projected volume the kubelet's way, so a running container always sees
// one consistent generation: the files go into a fresh hidden directory
// "..<timestamp>", the "..data" symlink is swapped to it by one rename,
// and each visible name is a symlink through ..data. Every operation is
// relative to an fd of the volume directory and refuses symlinks, so
// nothing planted in the volume is ever followed out of it; what stands in
// the way of a visible name is removed, not written through.

const (
	dataLink    = "..data"
	dataLinkTmp = "..data_tmp"
	// Bounds on one volume: a stored object is as hostile as the command
	// that sent it.
	maxVolumeFiles     = 1024
	maxVolumeBytes     = 8 << 20 // every file's data together
	maxVolumePathBytes = 1024    // one item path
	maxVolumeNameBytes = 255     // one path component
)

// volumeFile is one file of a volume: a relative path, its content and
// its exact mode (permission bits with setuid, setgid and sticky).
type volumeFile struct {
	path string
	data []byte
	mode uint32
}

// checkVolumeFiles enforces the bounds and refuses paths that would leave
// the volume, hide in its hidden names, or collide.
func checkVolumeFiles(files []volumeFile) error {
	if len(files) > maxVolumeFiles {
		return fmt.Errorf("%d files, more than the %d a volume may hold", len(files), maxVolumeFiles)
	}
	total := 0
	paths := make(map[string]bool, len(files))
	for _, f := range files {
		if len(f.path) > maxVolumePathBytes {
			return fmt.Errorf("path of %d bytes, more than %d", len(f.path), maxVolumePathBytes)
		}
		if f.mode&^uint32(0o7777) != 0 {
			return fmt.Errorf("file %q: mode %#o is not a file mode", f.path, f.mode)
		}
		if err := checkRelative(f.path); err != nil {
			return err
		}
		comps := subpathComponents(f.path)
		if len(comps) == 0 {
			return fmt.Errorf("file path %q names no file", f.path)
		}
		if strings.HasPrefix(comps[0], "..") {
			return fmt.Errorf("file path %q starts with '..'", f.path)
		}
		for _, c := range comps {
			if len(c) > maxVolumeNameBytes {
				return fmt.Errorf("file path %q has a component longer than %d bytes", f.path, maxVolumeNameBytes)
			}
		}
		clean := strings.Join(comps, "/")
		if paths[clean] {
			return fmt.Errorf("file path %q is given twice", f.path)
		}
		paths[clean] = true
		if total += len(f.data); total > maxVolumeBytes {
			return fmt.Errorf("files hold more than %d bytes", maxVolumeBytes)
		}
	}
	// A file may not also be a directory of another ("a" and "a/b").
	for p := range paths {
		for dir := filepath.Dir(p); dir != "."; dir = filepath.Dir(dir) {
			if paths[dir] {
				return fmt.Errorf("file path %q is also the directory of %q", dir, p)
			}
		}
	}
	return nil
}

// writeAtomic publishes files under dir (created if missing), replacing
// the generation it holds unless that already is exactly files.
func writeAtomic(dir string, files []volumeFile) error {
	return writeAtomicGroup(dir, files, -1)
}

// writeAtomicGroup is writeAtomic giving the volume to the pod's fsGroup
// gid (-1: none) as the kubelet does for these read-only volumes: group
// read on every file, setgid directories. A new generation gets the group
// before it is swapped in, so a container never sees it unreadable.
func writeAtomicGroup(dir string, files []volumeFile, gid int) (err error) {
	if err := checkVolumeFiles(files); err != nil {
		return err
	}
	if gid >= 0 {
		grouped := make([]volumeFile, len(files))
		for i, f := range files {
			f.mode |= fsGroupROMask
			grouped[i] = f
		}
		files = grouped
		defer func() {
			if err == nil {
				err = setVolumeGroup(dir, gid, true, false)
			}
		}()
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	dirFd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open volume %s: %w", dir, err)
	}
	defer closeFd(dirFd)
	old := currentGeneration(dirFd)
	if old != "" && sameGeneration(dirFd, old, files) {
		return nil
	}
	gen, err := writeGeneration(dirFd, files)
	if err != nil {
		return fmt.Errorf("write volume %s: %w", dir, err)
	}
	if gid >= 0 {
		if err := groupGeneration(dirFd, gen, gid); err != nil {
			_ = removeBeneath(dirFd, gen)
			return fmt.Errorf("write volume %s: %w", dir, err)
		}
	}
	if err := swapDataLink(dirFd, gen); err != nil {
		_ = removeBeneath(dirFd, gen)
		return fmt.Errorf("publish volume %s: %w", dir, err)
	}
	if err := linkVisible(dirFd, files); err != nil {
		return fmt.Errorf("publish volume %s: %w", dir, err)
	}
	// Older generations (and any left by an interrupted write) go last,
	// once nothing points into them.
	entries, err := readDirFd(dirFd)
	if err != nil {
		return err
	}
	for _, name := range entries {
		if strings.HasPrefix(name, "..") && name != dataLink && name != gen {
			if err := removeBeneath(dirFd, name); err != nil {
				return fmt.Errorf("remove old generation of volume %s: %w", dir, err)
			}
		}
	}
	return nil
}

// currentGeneration is the hidden directory ..data points to ("" when
// there is none or it is not one of ours).
func currentGeneration(dirFd int) string {
	target, err := readlinkat(dirFd, dataLink)
	if err != nil || !isGenerationName(target) {
		return ""
	}
	return target
}

func isGenerationName(name string) bool {
	return strings.HasPrefix(name, "..") && !strings.Contains(name, "/") &&
		name != dataLink && name != dataLinkTmp && name != ".."
}

// sameGeneration reports whether generation gen holds exactly files.
func sameGeneration(dirFd int, gen string, files []volumeFile) bool {
	genFd, err := unix.Openat(dirFd, gen, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	defer closeFd(genFd)
	count, err := countFiles(genFd, 0)
	if err != nil || count != len(files) {
		return false
	}
	for _, f := range files {
		fd, err := openNoFollow(genFd, subpathComponents(f.path), unix.O_RDONLY)
		if err != nil {
			return false
		}
		var st unix.Stat_t
		same := unix.Fstat(fd, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFREG &&
			st.Mode&0o7777 == f.mode && st.Size == int64(len(f.data)) && sameContent(fd, f.data)
		closeFd(fd)
		if !same {
			return false
		}
	}
	return true
}

func sameContent(fd int, want []byte) bool {
	got := make([]byte, len(want)+1)
	n, err := unix.Pread(fd, got, 0)
	return err == nil && n == len(want) && string(got[:n]) == string(want)
}

// countFiles counts the regular files beneath the directory fd; anything
// else but directories makes it fail.
func countFiles(fd int, depth int) (int, error) {
	if depth > maxVolumePathBytes/2 {
		return 0, fmt.Errorf("directories nested too deep")
	}
	names, err := readDirFd(fd)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, name := range names {
		var st unix.Stat_t
		if err := unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return 0, err
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFREG:
			n++
		case unix.S_IFDIR:
			sub, err := unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if err != nil {
				return 0, err
			}
			m, err := countFiles(sub, depth+1)
			closeFd(sub)
			if err != nil {
				return 0, err
			}
			n += m
		default:
			return 0, fmt.Errorf("%s is neither a file nor a directory", name)
		}
		if n > maxVolumeFiles {
			return n, nil
		}
	}
	return n, nil
}

// writeGeneration writes files into a new hidden directory and returns
// its name.
func writeGeneration(dirFd int, files []volumeFile) (string, error) {
	var gen string
	for i := 0; ; i++ {
		gen = ".." + time.Now().UTC().Format("2006_01_02_15_04_05.000000000")
		err := unix.Mkdirat(dirFd, gen, 0o755)
		if err == nil {
			break
		}
		if !errors.Is(err, unix.EEXIST) || i > 100 {
			return "", fmt.Errorf("create generation directory: %w", err)
		}
	}
	genFd, err := unix.Openat(dirFd, gen, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", err
	}
	defer closeFd(genFd)
	if err := unix.Fchmod(genFd, 0o755); err != nil { // the umask trimmed Mkdirat's mode
		return "", err
	}
	for _, f := range files {
		if err := writeFileBeneath(genFd, subpathComponents(f.path), f.data, f.mode); err != nil {
			_ = removeBeneath(dirFd, gen)
			return "", fmt.Errorf("file %q: %w", f.path, err)
		}
	}
	return gen, nil
}

// writeFileBeneath creates comps (parent directories as needed) in the
// fresh directory rootFd, never through a symlink.
func writeFileBeneath(rootFd int, comps []string, data []byte, mode uint32) error {
	parent, err := unix.Dup(rootFd)
	if err != nil {
		return err
	}
	for _, c := range comps[:len(comps)-1] {
		if err := unix.Mkdirat(parent, c, 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
			closeFd(parent)
			return err
		}
		next, err := unix.Openat(parent, c, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		closeFd(parent)
		if err != nil {
			return err
		}
		if err := unix.Fchmod(next, 0o755); err != nil {
			closeFd(next)
			return err
		}
		parent = next
	}
	defer closeFd(parent)
	fd, err := unix.Openat(parent, comps[len(comps)-1], unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	defer closeFd(fd)
	for rest := data; len(rest) > 0; {
		n, err := unix.Write(fd, rest)
		if err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			return err
		}
		rest = rest[n:]
	}
	// Exact bits, set through the fd: the umask and os.FileMode's own
	// encoding of setuid/setgid/sticky would both change them.
	return unix.Fchmod(fd, mode)
}

// swapDataLink points ..data at gen with one rename.
func swapDataLink(dirFd int, gen string) error {
	if err := removeBeneath(dirFd, dataLinkTmp); err != nil {
		return err
	}
	if err := unix.Symlinkat(gen, dirFd, dataLinkTmp); err != nil {
		return fmt.Errorf("link %s: %w", dataLinkTmp, err)
	}
	var st unix.Stat_t
	if err := unix.Fstatat(dirFd, dataLink, &st, unix.AT_SYMLINK_NOFOLLOW); err == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR {
		// rename cannot replace a directory with a symlink.
		if err := removeBeneath(dirFd, dataLink); err != nil {
			return err
		}
	}
	if err := unix.Renameat(dirFd, dataLinkTmp, dirFd, dataLink); err != nil {
		return fmt.Errorf("swap %s: %w", dataLink, err)
	}
	return nil
}

// linkVisible makes each top-level name of files a symlink through ..data
// and removes visible names no longer published.
func linkVisible(dirFd int, files []volumeFile) error {
	wanted := map[string]bool{}
	for _, f := range files {
		top := subpathComponents(f.path)[0]
		if wanted[top] {
			continue
		}
		wanted[top] = true
		target := dataLink + "/" + top
		if cur, err := readlinkat(dirFd, top); err == nil && cur == target {
			continue
		}
		if err := removeBeneath(dirFd, top); err != nil {
			return err
		}
		if err := unix.Symlinkat(target, dirFd, top); err != nil {
			return fmt.Errorf("link %s: %w", top, err)
		}
	}
	names, err := readDirFd(dirFd)
	if err != nil {
		return err
	}
	for _, name := range names {
		if !strings.HasPrefix(name, "..") && !wanted[name] {
			if err := removeBeneath(dirFd, name); err != nil {
				return err
			}
		}
	}
	return nil
}

// removeBeneath removes the entry name of the directory fd, a directory
// with everything in it, never following a symlink; a missing name is no
// error.
func removeBeneath(dirFd int, name string) error {
	var st unix.Stat_t
	if err := unix.Fstatat(dirFd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return unix.Unlinkat(dirFd, name, 0)
	}
	sub, err := unix.Openat(dirFd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	names, err := readDirFd(sub)
	if err == nil {
		for _, n := range names {
			if err = removeBeneath(sub, n); err != nil {
				break
			}
		}
	}
	closeFd(sub)
	if err != nil {
		return err
	}
	return unix.Unlinkat(dirFd, name, unix.AT_REMOVEDIR)
}

// readDirFd lists the names in the directory fd (without . and ..).
func readDirFd(fd int) ([]string, error) {
	dup, err := unix.Openat(fd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(dup), "volume")
	defer f.Close()
	return f.Readdirnames(-1)
}

func readlinkat(dirFd int, name string) (string, error) {
	buf := make([]byte, unix.PathMax)
	n, err := unix.Readlinkat(dirFd, name, buf)
	if err != nil {
		return "", err
	}
	return string(buf[:n]), nil
}

// groupGeneration gives generation gen to group gid.
func groupGeneration(dirFd int, gen string, gid int) error {
	fd, err := unix.Openat(dirFd, gen, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer closeFd(fd)
	budget := maxOwnershipEntries
	return groupTree(fd, gid, fsGroupROMask, 0, &budget)
}
