package cri

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"syscall"
)

// An agent killed while StartContainer is in flight ends the call's
// context, and containerd then records the container as exited with
// StartError (exit code 128) and no start time: the same record a real
// start failure (an executable that is missing) leaves. Under Never, or
// as a finished run, that record would end the pod although its container
// never ran. So mqlet marks each start in the pod dir before the call and
// clears the mark when the call returns: a StartError with the mark still
// there is a start the agent's death cut short, and is reported as a
// container created but not started, which the planner replaces.
//
// A mark is a file in the page cache (no fsync): a kill -9 or the OOM
// killer leaves it for the next process, as the in-flight marks are left.

// startMarkDir is the pod dir's directory of start marks.
const startMarkDir = "starting"

// containerIDPattern is what a runtime's container id looks like (hex);
// only such an id names a mark file.
var containerIDPattern = regexp.MustCompile(`^[0-9a-f]{1,128}$`)

// startMarkPath is the mark file of container id in pod uid's dir.
func (m *Manager) startMarkPath(uid, id string) (string, error) {
	if !containerIDPattern.MatchString(id) {
		return "", fmt.Errorf("container id %q is not a runtime id", id)
	}
	dir, err := m.podDir(uid)
	if err != nil {
		return "", err
	}
	return childOf(filepath.Join(dir, startMarkDir), id)
}

// markStarting records that container id of pod uid is being started; the
// returned func clears the mark.
func (m *Manager) markStarting(uid, id string) (clear func(), err error) {
	p, err := m.startMarkPath(uid, id)
	if err != nil {
		return nil, fmt.Errorf("marking the start of container %s: %w", id, err)
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return nil, fmt.Errorf("marking the start of container %s: %w", id, err)
	}
	f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, fmt.Errorf("marking the start of container %s: %w", id, err)
	}
	_ = f.Close()
	return func() {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			m.log.Warn().Err(err).Str("container", id).Msg("clearing a container's start mark")
		}
	}, nil
}

// startInterrupted reports whether s, a container of pod uid, is a start
// the agent's death cut short (see the top of this file).
func (m *Manager) startInterrupted(uid string, s *ContainerStatus) bool {
	if s.State != ContainerExited || s.Reason != "StartError" || !s.StartedAt.IsZero() {
		return false
	}
	p, err := m.startMarkPath(uid, s.ID)
	if err != nil {
		return false
	}
	_, err = os.Lstat(p)
	return err == nil
}
