package cri

import (
	"context"
	"errors"
	"fmt"
	"time"

	criclient "k8s.io/cri-client/pkg"
	utilexec "k8s.io/utils/exec"
)

// ErrExecTimedOut is returned (wrapped) when a command ran past its timeout;
// the runtime has stopped it.
var ErrExecTimedOut = errors.New("command timed out")

// ExecResult is what a command run in a container gave.
type ExecResult struct {
	Stdout, Stderr []byte
	ExitCode       int
}

// ExecSync runs cmd in the running container of the pod and waits for it, at
// most timeout (the runtime kills it then). A command that exits non-zero
// is a result, not an error.
func (m *Manager) ExecSync(ctx context.Context, pod PodKey, container string, cmd []string, timeout time.Duration) (*ExecResult, error) {
	if err := checkLabelName("container", container); err != nil {
		return nil, fmt.Errorf("exec in pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	svc, err := m.conn.get()
	if err != nil {
		return nil, err
	}
	c, err := m.attempt(ctx, pod, container, false)
	if err != nil {
		return nil, err
	}
	if c.State != ContainerRunning {
		return nil, fmt.Errorf("%w: container %q in pod %s/%s is not running (%s)", ErrNoContainer, container, pod.Namespace, pod.Name, c.State)
	}
	// The runtime enforces timeout; the context only guards against a
	// runtime that does not answer.
	ctx, cancel := context.WithTimeout(quietContext(ctx), timeout+m.cfg.RequestTimeout)
	defer cancel()
	stdout, stderr, err := svc.runtime.ExecSync(ctx, c.ID, cmd, timeout)
	var exit utilexec.CodeExitError
	switch {
	case err == nil:
		return &ExecResult{Stdout: stdout, Stderr: stderr}, nil
	case errors.As(err, &exit):
		// Its message quotes stderr: only the code is kept.
		return &ExecResult{Stdout: stdout, Stderr: stderr, ExitCode: exit.Code}, nil
	case errors.Is(err, criclient.ErrCommandTimedOut) || errors.Is(ctx.Err(), context.DeadlineExceeded):
		return nil, fmt.Errorf("exec in container %s of pod %s/%s: %w after %s", container, pod.Namespace, pod.Name, ErrExecTimedOut, timeout)
	default:
		return nil, fmt.Errorf("exec in container %s of pod %s/%s: %w", container, pod.Namespace, pod.Name, m.conn.classify(err))
	}
}
