package cri

import (
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// tmpfsSizeBytes and tmpfsInodes bound a volume's tmpfs: two generations
// (the old one lives until the swap) of the most a volume may hold, each
// file taking at least a page.
const (
	tmpfsSizeBytes = 2 * (maxVolumeBytes + maxVolumeFiles*4096)
	tmpfsInodes    = 4*maxVolumeFiles + 64
)

// writeOnTmpfs publishes the files of a secret, downwardAPI or projected
// volume on a tmpfs of its own mounted at dir, so they never reach the
// node's disk. files is called only once the tmpfs is there.
func writeOnTmpfs(dir string, files func() ([]volumeFile, error)) error {
	if err := ensureTmpfs(dir); err != nil {
		return err
	}
	fs, err := files()
	if err != nil {
		return err
	}
	return writeAtomic(dir, fs)
}

// ensureTmpfs mounts a tmpfs at dir unless one already is.
func ensureTmpfs(dir string) error {
	dir = filepath.Clean(dir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return fmt.Errorf("statfs %s: %w", dir, err)
	}
	if st.Type == unix.TMPFS_MAGIC {
		mounted, err := mountPointsUnder(dir)
		if err != nil {
			return err
		}
		for _, mp := range mounted {
			if mp == dir {
				return nil
			}
		}
	}
	opts := fmt.Sprintf("mode=0755,size=%d,nr_inodes=%d", tmpfsSizeBytes, tmpfsInodes)
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		return fmt.Errorf("mount tmpfs on %s: %w", dir, err)
	}
	// Private at once, as the bind mounts are: unmounting it later never
	// propagates anywhere else.
	if err := unix.Mount("", dir, "", unix.MS_PRIVATE, ""); err != nil {
		_ = unix.Unmount(dir, unix.MNT_DETACH)
		return fmt.Errorf("make %s private: %w", dir, err)
	}
	return nil
}
