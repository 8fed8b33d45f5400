package cri

import (
	"fmt"
	"strconv"

	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
)

// fsGroup, the kubelet's way: every file and directory of a volume gets
// the group, group read (and write, for a writable volume) permission,
// and directories get setgid so what containers create there inherits
// the group. The walk goes by fd and never follows a symlink (a container
// may plant them in a writable volume): each entry is opened O_PATH and
// O_NOFOLLOW and changed through that fd.

const (
	fsGroupRWMask   = 0o660
	fsGroupROMask   = 0o440
	fsGroupExecMask = 0o110
	// maxOwnershipEntries and maxOwnershipDepth bound one walk.
	maxOwnershipEntries = 1 << 20
	maxOwnershipDepth   = 512
)

// podFSGroup is the pod's fsGroup, or -1.
func podFSGroup(pod *v1.Pod) int {
	if sc := pod.Spec.SecurityContext; sc != nil && sc.FSGroup != nil && *sc.FSGroup >= 0 && *sc.FSGroup <= 1<<31-1 {
		return int(*sc.FSGroup)
	}
	return -1
}

// onRootMismatch reports whether the pod asked to change ownership only
// when the volume root does not match.
func onRootMismatch(pod *v1.Pod) bool {
	sc := pod.Spec.SecurityContext
	return sc != nil && sc.FSGroupChangePolicy != nil && *sc.FSGroupChangePolicy == v1.FSGroupChangeOnRootMismatch
}

// setVolumeGroup gives the volume at dir to group gid.
func setVolumeGroup(dir string, gid int, readOnly, rootOnlyIfMismatch bool) error {
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open volume %s: %w", dir, err)
	}
	defer closeFd(fd)
	mask := uint32(fsGroupRWMask)
	if readOnly {
		mask = fsGroupROMask
	}
	if rootOnlyIfMismatch {
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			return err
		}
		if int(st.Gid) == gid && st.Mode&unix.S_ISGID != 0 && st.Mode&mask == mask {
			return nil
		}
	}
	budget := maxOwnershipEntries
	if err := groupTree(fd, gid, mask, 0, &budget); err != nil {
		return fmt.Errorf("set group %d on volume %s: %w", gid, dir, err)
	}
	return nil
}

// groupTree changes the entry open as the O_PATH fd and, for a
// directory, everything beneath it.
func groupTree(fd, gid int, mask uint32, depth int, budget *int) error {
	if *budget--; *budget < 0 {
		return fmt.Errorf("more than %d entries", maxOwnershipEntries)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	if err := unix.Fchownat(fd, "", -1, gid, unix.AT_EMPTY_PATH); err != nil {
		return err
	}
	kind := st.Mode & unix.S_IFMT
	if kind != unix.S_IFREG && kind != unix.S_IFDIR {
		return nil // symlinks, devices, fifos, sockets: the group only
	}
	mode := st.Mode&0o7777 | mask
	if kind == unix.S_IFDIR {
		mode |= unix.S_ISGID | fsGroupExecMask
	}
	if mode != st.Mode&0o7777 {
		// An O_PATH fd cannot be chmod'ed itself; its /proc link names
		// exactly the opened inode, never a path to look up again.
		if err := unix.Chmod("/proc/self/fd/"+strconv.Itoa(fd), mode); err != nil {
			return err
		}
	}
	if kind != unix.S_IFDIR {
		return nil
	}
	if depth >= maxOwnershipDepth {
		return fmt.Errorf("directories nested deeper than %d", maxOwnershipDepth)
	}
	names, err := readDirFd(fd)
	if err != nil {
		return err
	}
	for _, name := range names {
		child, err := unix.Openat(fd, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			if err == unix.ENOENT {
				continue // removed meanwhile by a container
			}
			return err
		}
		err = groupTree(child, gid, mask, depth+1, budget)
		closeFd(child)
		if err != nil {
			return err
		}
	}
	return nil
}
