package cri

import (
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
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
func writeOnTmpfs(dir string, gid int, files func() ([]volumeFile, error)) error {
	// mode=1777 is the root the kubelet's (unoptioned) tmpfs has; the
	// mount is read-only in every container.
	if err := ensureTmpfs(dir, fmt.Sprintf("mode=1777,size=%d,nr_inodes=%d", tmpfsSizeBytes, tmpfsInodes)); err != nil {
		return err
	}
	fs, err := files()
	if err != nil {
		return err
	}
	return writeAtomicGroup(dir, fs, gid)
}

// ensureTmpfs mounts a tmpfs with opts at dir unless one already is
// (a mounted tmpfs keeps its size: a changed sizeLimit takes a new pod).
func ensureTmpfs(dir, opts string) error {
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

// prepareEmptyDir makes an emptyDir: a directory on the node's disk, or
// for medium Memory a tmpfs of its own sized as the kubelet sizes it (the
// sizeLimit, else the pod's memory limit, else the node's allocatable
// memory, whichever is smallest). Any container user may write it.
func (m *Manager) prepareEmptyDir(pod *v1.Pod, ed *v1.EmptyDirVolumeSource, dir string) error {
	switch ed.Medium {
	case v1.StorageMediumDefault:
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
	case v1.StorageMediumMemory:
		size := emptyDirMemorySize(pod, ed, m.allocatable())
		if size <= 0 {
			return fmt.Errorf("emptyDir medium Memory: no size limit can be derived (no sizeLimit, memory limit or node memory)")
		}
		if err := ensureTmpfs(dir, fmt.Sprintf("mode=0777,size=%d", size)); err != nil {
			return err
		}
	default:
		return fmt.Errorf("emptyDir medium %q is not supported: %w", ed.Medium, errRefused)
	}
	gid := podFSGroup(pod)
	mode := uint32(0o777) // any container user may write, as in the kubelet
	if gid >= 0 {
		mode |= unix.S_ISGID // kept, so OnRootMismatch sees a matching root
	}
	if err := unix.Chmod(dir, mode); err != nil {
		return fmt.Errorf("chmod emptyDir %s: %w", dir, err)
	}
	if gid >= 0 {
		return setVolumeGroup(dir, gid, false, onRootMismatch(pod))
	}
	return nil
}

// emptyDirMemorySize is the kubelet's size of a memory-backed emptyDir.
func emptyDirMemorySize(pod *v1.Pod, ed *v1.EmptyDirVolumeSource, allocatable v1.ResourceList) int64 {
	size := int64(0)
	if q, ok := allocatable[v1.ResourceMemory]; ok {
		size = q.Value()
	}
	smaller := func(v int64) {
		if v > 0 && (size <= 0 || v < size) {
			size = v
		}
	}
	smaller(podMemoryLimit(pod))
	if ed.SizeLimit != nil {
		smaller(ed.SizeLimit.Value())
	}
	return size
}

// podMemoryLimit is the pod's memory limit as its cgroup gets it: the sum
// of its containers' limits, or the largest init container's when that is
// more; 0 when a container has none.
func podMemoryLimit(pod *v1.Pod) int64 {
	if pod.Spec.Resources != nil {
		if q, ok := pod.Spec.Resources.Limits[v1.ResourceMemory]; ok && !q.IsZero() {
			return q.Value()
		}
	}
	sum := int64(0)
	for _, c := range pod.Spec.Containers {
		q, ok := c.Resources.Limits[v1.ResourceMemory]
		if !ok || q.IsZero() {
			return 0
		}
		sum += q.Value()
	}
	for _, c := range pod.Spec.InitContainers {
		q, ok := c.Resources.Limits[v1.ResourceMemory]
		if !ok || q.IsZero() {
			return 0
		}
		if c.RestartPolicy != nil && *c.RestartPolicy == v1.ContainerRestartPolicyAlways {
			sum += q.Value() // a sidecar runs beside the app containers
		} else if q.Value() > sum {
			sum = q.Value()
		}
	}
	return sum
}
