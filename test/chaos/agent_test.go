package chaos

import (
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/mqlet/mqlet/internal/testutil/mqletbin"
)

// mqletBin returns the mqlet binary the test runs.
func mqletBin(t testing.TB) string { t.Helper(); return mqletbin.Path(t) }

// agentProc is the one mqlet process of a run, restartable with the same
// arguments. Only this process is ever killed: the run never signals a
// process it did not start (the e2e tests' agents run beside it).
type agentProc struct {
	bin     string
	args    []string
	logPath string

	cmd       *exec.Cmd
	done      chan struct{}
	startedAt time.Time
	starts    int
}

func (a *agentProc) start() error {
	logf, err := os.OpenFile(a.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("opening the agent log: %w", err)
	}
	a.starts++
	fmt.Fprintf(logf, "==== chaos: start %d at %s\n", a.starts, time.Now().Format(time.RFC3339Nano))
	cmd := exec.Command(a.bin, a.args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("starting mqlet: %w", err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		logf.Close()
		close(done)
	}()
	a.cmd, a.done, a.startedAt = cmd, done, time.Now()
	return nil
}

// alive reports whether the process runs.
func (a *agentProc) alive() bool {
	select {
	case <-a.done:
		return false
	default:
		return true
	}
}

// kill9 SIGKILLs the process (by its own pid) and waits for it.
func (a *agentProc) kill9() {
	_ = a.cmd.Process.Signal(syscall.SIGKILL)
	<-a.done
}

// stop sends SIGTERM and waits 20 s before a SIGKILL.
func (a *agentProc) stop() {
	if !a.alive() {
		return
	}
	_ = a.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-a.done:
	case <-time.After(20 * time.Second):
		a.kill9()
	}
}

// exitDescription says how the process ended.
func (a *agentProc) exitDescription() string {
	if a.alive() || a.cmd.ProcessState == nil {
		return "running"
	}
	return a.cmd.ProcessState.String()
}
