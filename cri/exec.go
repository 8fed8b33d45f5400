package cri

import (
	"context"
	"errors"
	"fmt"
	"time"

	criclient "k8s.io/cri-client/pkg"
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
	case errors.Is(err, criclient.ErrCommandTimedOut):
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
