package chaos

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"
)

var (
	binOnce sync.Once
	binPath string
	binErr  error
)

// mqletBin returns $MQLET_TEST_BIN_DIR/mqlet when set (make test builds
// it), else a binary built once for this run.
func mqletBin(t testing.TB) string {
	t.Helper()
	binOnce.Do(func() {
		if dir := os.Getenv("MQLET_TEST_BIN_DIR"); dir != "" {
			binPath = filepath.Join(dir, "mqlet")
			_, binErr = os.Stat(binPath)
			return
		}
		dir, err := os.MkdirTemp("", "mqlet-chaos-bin")
		if err != nil {
			binErr = err
			return
		}
		binPath = filepath.Join(dir, "mqlet")
		out, err := exec.Command("go", "build", "-o", binPath, "github.com/mqlet/mqlet/cmd/mqlet").CombinedOutput()
		if err != nil {
			binErr = fmt.Errorf("building mqlet: %v: %s", err, out)
		}
	})
	if binErr != nil {
		t.Fatalf("mqlet binary: %v", binErr)
	}
	return binPath
}

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
