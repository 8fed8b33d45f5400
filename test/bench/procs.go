package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// process is a child the bench started and must stop.
type process struct {
	name   string
	cmd    *exec.Cmd
	exited chan struct{}
	log    *os.File
}

func startProcess(name, logPath string, bin string, args ...string) (*process, error) {
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open %s log: %w", name, err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("start %s (%s): %w", name, bin, err)
	}
	p := &process{name: name, cmd: cmd, exited: make(chan struct{}), log: logFile}
	go func() {
		_ = cmd.Wait()
		logFile.Close()
		close(p.exited)
	}()
	return p, nil
}

func (p *process) pid() int { return p.cmd.Process.Pid }

func (p *process) alive() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// stop sends SIGTERM, waits up to timeout, then kills.
func (p *process) stop(timeout time.Duration) error {
	if !p.alive() {
		return nil
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
		return nil
	case <-time.After(timeout):
		_ = p.cmd.Process.Kill()
		<-p.exited
		return fmt.Errorf("%s did not stop within %v of SIGTERM; killed", p.name, timeout)
	}
}

// mosquittoBroker is a private mosquitto on a free loopback port.
type mosquittoBroker struct {
	*process
	url string
}

func startMosquitto(ctx context.Context, bin, dir string, noDelay bool) (*mosquittoBroker, error) {
	if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("mosquitto is required (apt-get install mosquitto): %w", err)
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	self, err := user.Current()
	if err != nil {
		return nil, fmt.Errorf("look up current user: %w", err)
	}
	// Queue limits are raised so a pipelined burst of QoS 1 replies is never
	// dropped by the broker, which would make the bench wait for nothing.
	conf := fmt.Sprintf(`listener %d 127.0.0.1
user %s
allow_anonymous true
persistence false
max_queued_messages 100000
log_dest stderr
log_type error
log_type warning
set_tcp_nodelay %t
`, port, self.Username, noDelay)
	confPath := filepath.Join(dir, "mosquitto.conf")
	if err := os.WriteFile(confPath, []byte(conf), 0o600); err != nil {
		return nil, fmt.Errorf("write mosquitto config: %w", err)
	}
	p, err := startProcess("mosquitto", filepath.Join(dir, "mosquitto.log"), bin, "-c", confPath)
	if err != nil {
		return nil, err
	}
	b := &mosquittoBroker{process: p, url: fmt.Sprintf("tcp://127.0.0.1:%d", port)}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	deadline := time.Now().Add(10 * time.Second)
	for {
		conn, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			conn.Close()
			return b, nil
		}
		if !p.alive() {
			return nil, fmt.Errorf("mosquitto exited at start; see %s", filepath.Join(dir, "mosquitto.log"))
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			_ = p.stop(5 * time.Second)
			return nil, fmt.Errorf("mosquitto did not accept connections on %s within 10s: %w", addr, err)
		}
		select { // poll interval while the broker starts
		case <-time.After(50 * time.Millisecond):
		case <-ctx.Done():
		}
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free loopback port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// procRSS returns VmRSS of pid in bytes.
func procRSS(pid int) (int64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, fmt.Errorf("read status of pid %d: %w", pid, err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			fields := strings.Fields(rest)
			if len(fields) != 2 || fields[1] != "kB" {
				return 0, fmt.Errorf("unexpected VmRSS line %q", line)
			}
			kb, err := strconv.ParseInt(fields[0], 10, 64)
			if err != nil {
				return 0, fmt.Errorf("parse VmRSS %q: %w", line, err)
			}
			return kb * 1024, nil
		}
	}
	return 0, errors.New("no VmRSS in /proc status (process exited?)")
}

// procCPUTicks returns utime+stime of pid in clock ticks.
func procCPUTicks(pid int) (int64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("read stat of pid %d: %w", pid, err)
	}
	return parseStatTicks(string(data))
}

// parseStatTicks reads utime and stime (fields 14 and 15) of a /proc/<pid>/stat
// line; the command name in parentheses may itself contain spaces.
func parseStatTicks(stat string) (int64, error) {
	end := strings.LastIndexByte(stat, ')')
	if end < 0 {
		return 0, fmt.Errorf("malformed stat %q", stat)
	}
	fields := strings.Fields(stat[end+1:])
	// fields[0] is field 3 (state); utime is field 14, stime 15.
	if len(fields) < 13 {
		return 0, fmt.Errorf("stat has %d fields after the name, want at least 13", len(fields))
	}
	utime, err1 := strconv.ParseInt(fields[11], 10, 64)
	stime, err2 := strconv.ParseInt(fields[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("parse utime/stime: %w", err)
	}
	return utime + stime, nil
}

// clockTicks is the kernel's USER_HZ; Go cannot call sysconf without cgo.
func clockTicks() int64 {
	out, err := exec.Command("getconf", "CLK_TCK").Output()
	if err == nil {
		if n, err := strconv.ParseInt(strings.TrimSpace(string(out)), 10, 64); err == nil && n > 0 {
			return n
		}
	}
	return 100 // USER_HZ on every Linux architecture mqlet targets
}
