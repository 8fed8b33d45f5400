package cri

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"path"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/mqlet/mqlet/cri/crilog"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Termination messages, the kubelet's way: every attempt of a container
// that names a terminationMessagePath gets a fresh, empty, writable file
// of its own on the node, bind-mounted at that path. Once the attempt has
// exited, the last 4096 bytes of the file are its terminated message; with
// terminationMessagePolicy FallbackToLogsOnError, an empty file and a
// failed exit take the last 80 lines (at most 2048 bytes) of its log
// instead. The file is <podDir>/containers/<container>/<32 hex digits>,
// created and read through fds with no symlink followed; its name and the
// policy are recorded on the container, so a container is read without
// its spec and no path comes from the runtime's answers.

const (
	// MaxTerminationMessageBytes is the most of a termination message file
	// read (the kubelet's MaxContainerTerminationMessageLength).
	MaxTerminationMessageBytes = 4096
	// MaxTerminationMessageLogLines and MaxTerminationMessageLogBytes bound
	// the log tail of FallbackToLogsOnError (the kubelet's numbers).
	MaxTerminationMessageLogLines = 80
	MaxTerminationMessageLogBytes = 2048
	// MaxTerminationMessagePathBytes bounds terminationMessagePath.
	MaxTerminationMessagePathBytes = 1024

	// AnnotationTerminationPolicy is the container's terminationMessagePolicy.
	AnnotationTerminationPolicy = "io.kubernetes.container.terminationMessagePolicy"
	// AnnotationTerminationFile names the attempt's message file in its
	// container directory.
	AnnotationTerminationFile = "io.mqlet.container.terminationMessageFile"

	containersDirName = "containers"
	messageFileHexLen = 32
)

// CheckTerminationMessagePath accepts an absolute, clean path of at most
// MaxTerminationMessagePathBytes that is not / and not beneath /proc or
// /sys (where the runtime's own mounts are).
func CheckTerminationMessagePath(p string) error {
	switch {
	case len(p) > MaxTerminationMessagePathBytes:
		return fmt.Errorf("must be at most %d bytes", MaxTerminationMessagePathBytes)
	case !path.IsAbs(p):
		return fmt.Errorf("must be an absolute path")
	case strings.ContainsRune(p, 0):
		return fmt.Errorf("must not contain NUL")
	case path.Clean(p) != p:
		return fmt.Errorf("must be a clean path (no '.', '..', '//' or trailing '/')")
	case p == "/":
		return fmt.Errorf("must name a file, not /")
	}
	for _, top := range []string{"/proc", "/sys"} {
		if p == top || strings.HasPrefix(p, top+"/") {
			return fmt.Errorf("must not be beneath %s", top)
		}
	}
	return nil
}

// terminationMessageMount creates the message file of the next attempt of
// c and returns its mount and the file's name ("" and nil when c names no
// path).
func (m *Manager) terminationMessageMount(pod *v1.Pod, c *v1.Container) (*runtimeapi.Mount, string, error) {
	if c.TerminationMessagePath == "" {
		return nil, "", nil
	}
	if err := CheckTerminationMessagePath(c.TerminationMessagePath); err != nil {
		return nil, "", fmt.Errorf("terminationMessagePath %q: %w", c.TerminationMessagePath, err)
	}
	if err := checkLabelName("container", c.Name); err != nil {
		return nil, "", err
	}
	dir, err := m.podDir(string(pod.UID))
	if err != nil {
		return nil, "", err
	}
	var id [messageFileHexLen / 2]byte
	if _, err := rand.Read(id[:]); err != nil {
		return nil, "", fmt.Errorf("name a termination message file: %w", err)
	}
	name := hex.EncodeToString(id[:])
	var o beneathOpener
	dfd, err := o.openSubpathMode(dir, containersDirName+"/"+c.Name, true, 0o750)
	if err != nil {
		return nil, "", fmt.Errorf("create the termination message directory of container %s: %w", c.Name, err)
	}
	defer unix.Close(dfd)
	fd, err := unix.Openat(dfd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o666)
	if err != nil {
		return nil, "", fmt.Errorf("create the termination message file of container %s: %w", c.Name, err)
	}
	defer unix.Close(fd)
	// Whatever the umask, the container's user must be able to write it.
	if err := unix.Fchmod(fd, 0o666); err != nil {
		return nil, "", fmt.Errorf("chmod the termination message file of container %s: %w", c.Name, err)
	}
	return &runtimeapi.Mount{
		ContainerPath: c.TerminationMessagePath,
		HostPath:      filepath.Join(dir, containersDirName, c.Name, name),
		Propagation:   runtimeapi.MountPropagation_PROPAGATION_PRIVATE,
	}, name, nil
}

// terminationMessage is the message of an exited attempt as the kubelet
// builds it, or "".
func (m *Manager) terminationMessage(ctx context.Context, svc *services, uid, namespace, podName string, c *runtimeapi.Container, cs *ContainerStatus) string {
	file := c.Annotations[AnnotationTerminationFile]
	fallback := c.Annotations[AnnotationTerminationPolicy] == string(v1.TerminationMessageFallbackToLogsOnError) &&
		cs.ExitCode != 0 && cs.Reason != "ContainerCannotRun"
	msg := ""
	if file != "" {
		data, err := m.readTerminationFile(uid, cs.Name, file)
		switch {
		case errors.Is(err, unix.ENOENT):
		case err != nil:
			return fmt.Sprintf("Error on reading termination log: %v", err)
		default:
			msg = string(data)
		}
	}
	if msg != "" || !fallback {
		return msg
	}
	dir, err := m.podLogDir(namespace, podName, uid)
	if err != nil {
		return fmt.Sprintf("Error on reading termination message from logs: %v", err)
	}
	logPath := filepath.Join(dir, cs.Name, strconv.Itoa(cs.RestartCount)+".log")
	tail := newTailBuffer(MaxTerminationMessageLogBytes)
	lines := int64(MaxTerminationMessageLogLines)
	// Not followed: the reader asks the runtime nothing.
	if err := crilog.Read(ctx, logPath, crilog.Options{TailLines: &lines}, nil, tail, tail); err != nil {
		return fmt.Sprintf("Error on reading termination message from logs: %v", err)
	}
	return tail.String()
}

// readTerminationFile reads the last MaxTerminationMessageBytes of the
// message file name of container in pod uid, opened beneath the pod
// directory with no symlink followed, a regular file only.
func (m *Manager) readTerminationFile(uid, container, name string) ([]byte, error) {
	if err := checkLabelName("container", container); err != nil {
		return nil, err
	}
	if len(name) != messageFileHexLen || strings.Trim(name, "0123456789abcdef") != "" {
		return nil, fmt.Errorf("termination message file name %q is not mqlet's", name)
	}
	dir, err := m.podDir(uid)
	if err != nil {
		return nil, err
	}
	root, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(root)
	var o beneathOpener
	fd, err := o.open(root, []string{containersDirName, container, name}, unix.O_RDONLY|unix.O_NONBLOCK)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	return readTail(fd, MaxTerminationMessageBytes)
}

// readTail reads the last limit bytes of the regular file open as fd.
func readTail(fd int, limit int64) ([]byte, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, fmt.Errorf("not a regular file")
	}
	size := st.Size
	off := int64(0)
	if size > limit {
		off, size = size-limit, limit
	}
	buf := make([]byte, size)
	n := 0
	for n < len(buf) {
		k, err := unix.Pread(fd, buf[n:], off+int64(n))
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if k == 0 {
			break // truncated meanwhile
		}
		n += k
	}
	return buf[:n], nil
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	max int
	buf []byte
}

func newTailBuffer(max int) *tailBuffer { return &tailBuffer{max: max} }

func (t *tailBuffer) Write(p []byte) (int, error) {
	n := len(p)
	if len(p) >= t.max {
		t.buf = append(t.buf[:0], p[len(p)-t.max:]...)
		return n, nil
	}
	if over := len(t.buf) + len(p) - t.max; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
	t.buf = append(t.buf, p...)
	return n, nil
}

func (t *tailBuffer) String() string { return string(t.buf) }
