package cri

import (
	"context"
	"errors"
	"fmt"
	"time"

	utilexec "k8s.io/utils/exec"
)

// ErrExecTimedOut is returned (wrapped) when a command run by ExecSync
// outlived its timeout.
var ErrExecTimedOut = errors.New("command timed out")

// maxExecOutput bounds what ExecSync keeps of a command's stdout and
// stderr each (the kubelet's probe output limit): a probe printing without
// end must not grow the agent.
const maxExecOutput = 10 << 10

// ExecSync runs cmd in the container with this runtime ID and waits at most
// timeout for it. A command that ran returns its exit code with a nil error,
// whatever the code; err says the command could not be run (or timed out).
// The container must be one mqlet made: callers take IDs from GetPodStatus.
func (m *Manager) ExecSync(ctx context.Context, containerID string, cmd []string, timeout time.Duration) (stdout, stderr []byte, exitCode int, err error) {
	svc, err := m.conn.get()
	if err != nil {
		return nil, nil, 0, err
	}
	stdout, stderr, err = svc.runtime.ExecSync(quietContext(ctx), containerID, cmd, timeout)
	var exit utilexec.CodeExitError
	switch {
	case err == nil:
	case errors.As(err, &exit):
		exitCode, err = exit.Code, nil
	case errors.Is(err, errCommandTimedOut):
		return nil, nil, 0, fmt.Errorf("exec in container %s: %w after %s", containerID, ErrExecTimedOut, timeout)
	default:
		return nil, nil, 0, fmt.Errorf("exec in container %s: %w", containerID, err)
	}
	return capBytes(stdout), capBytes(stderr), exitCode, nil
}

func capBytes(b []byte) []byte {
	if len(b) > maxExecOutput {
		return b[:maxExecOutput]
	}
	return b
}

// ExecResult is what a command run in a container gave.
type ExecResult struct {
	Stdout, Stderr []byte
	ExitCode       int
}

// ExecInPod runs cmd in the running container of the pod and waits for it, at
// most timeout (the runtime kills it then). A command that exits non-zero
// is a result, not an error.
func (m *Manager) ExecInPod(ctx context.Context, pod PodKey, container string, cmd []string, timeout time.Duration) (*ExecResult, error) {
	if err := checkLabelName("container", container); err != nil {
		return nil, fmt.Errorf("exec in pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	svc, err := m.conn.await(ctx, m.cfg.ConnectTimeout)
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
	case errors.Is(err, errCommandTimedOut) || errors.Is(ctx.Err(), context.DeadlineExceeded):
		return nil, fmt.Errorf("exec in container %s of pod %s/%s: %w after %s", container, pod.Namespace, pod.Name, ErrExecTimedOut, timeout)
	default:
		return nil, fmt.Errorf("exec in container %s of pod %s/%s: %w", container, pod.Namespace, pod.Name, err)
	}
}
