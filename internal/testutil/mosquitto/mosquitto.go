// Package mosquitto runs a real mosquitto broker on loopback for tests.
package mosquitto

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Binary is where the Debian package installs the broker.
const Binary = "/usr/sbin/mosquitto"

// startTimeout bounds how long a (re)start may take to accept connections.
const startTimeout = 10 * time.Second

// Broker is one mosquitto process bound to a fixed loopback port, with its
// persistence directory kept across Stop/Restart.
type Broker struct {
	t       testing.TB
	port    int
	dir     string
	config  string
	logFile string

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
}

// Start launches mosquitto on a free 127.0.0.1 port and stops it when the
// test ends. The test fails if mosquitto is not installed.
func Start(t testing.TB) *Broker {
	t.Helper()
	if _, err := os.Stat(Binary); err != nil {
		t.Fatalf("mosquitto is required for this test but %s is missing (apt-get install mosquitto): %v", Binary, err)
	}
	port, err := freePort()
	if err != nil {
		t.Fatalf("find a free port for mosquitto: %v", err)
	}
	dir := t.TempDir()
	b := &Broker{
		t:       t,
		port:    port,
		dir:     dir,
		config:  filepath.Join(dir, "mosquitto.conf"),
		logFile: filepath.Join(dir, "mosquitto.log"),
	}
	// Run as whoever runs the test: as root mosquitto would otherwise drop to
	// user "mosquitto", which cannot write the test's temp directory.
	self, err := user.Current()
	if err != nil {
		t.Fatalf("look up current user for mosquitto config: %v", err)
	}
	conf := fmt.Sprintf(`listener %d 127.0.0.1
user %s
allow_anonymous true
set_tcp_nodelay true
persistence true
persistence_location %s/
autosave_interval 1
log_dest file %s
log_type error
log_type warning
log_type notice
log_type information
`, port, self.Username, dir, b.logFile)
	if err := os.WriteFile(b.config, []byte(conf), 0o600); err != nil {
		t.Fatalf("write mosquitto config: %v", err)
	}
	b.start()
	t.Cleanup(b.Stop)
	return b
}

// URL is the broker's address for an MQTT client, tcp://127.0.0.1:PORT.
func (b *Broker) URL() string { return "tcp://" + b.Addr() }

// Addr is host:port of the listener.
func (b *Broker) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(b.port)) }

// Log returns what mosquitto logged so far, for failure messages.
func (b *Broker) Log() string {
	data, err := os.ReadFile(b.logFile)
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	return string(data)
}

// Stop terminates the broker (SIGTERM, so it saves its persistence) and
// waits for it to exit. Stopping a stopped broker does nothing.
func (b *Broker) Stop() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.cmd == nil {
		return
	}
	_ = b.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-b.exited:
	case <-time.After(startTimeout):
		_ = b.cmd.Process.Kill()
		<-b.exited
	}
	b.cmd = nil
}

// Kill ends the broker with SIGKILL, as a crash or a lost host would: its
// clients' connections drop without a DISCONNECT and nothing is saved.
func (b *Broker) Kill() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.cmd == nil {
		return
	}
	_ = b.cmd.Process.Kill()
	<-b.exited
	b.cmd = nil
}

// Restart stops the broker if running and starts it again on the same port
// with the same persistence directory.
func (b *Broker) Restart() {
	b.t.Helper()
	b.Stop()
	b.start()
}

func (b *Broker) start() {
	b.t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	cmd := exec.Command(Binary, "-c", b.config)
	cmd.Dir = b.dir
	if err := cmd.Start(); err != nil {
		b.t.Fatalf("start mosquitto: %v", err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	b.cmd, b.exited = cmd, exited
	err := waitListening(b.Addr(), exited)
	if err == nil {
		// mosquitto takes SIGTERM as "save and exit" only once its main
		// loop runs, after it listens: a Stop before that loses the save.
		err = waitRunning(b.logFile, exited)
	}
	if err != nil {
		_ = cmd.Process.Kill()
		<-exited
		b.cmd = nil
		b.t.Fatalf("mosquitto did not come up on %s: %v\nlog:\n%s", b.Addr(), err, b.Log())
	}
}

// waitListening polls with a deadline until the port accepts a connection;
// a restart may need a moment for the old socket to be released.
func waitListening(addr string, exited <-chan struct{}) error {
	deadline := time.Now().Add(startTimeout)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		conn, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			return conn.Close()
		}
		if time.Now().After(deadline) {
			return err
		}
		select {
		case <-exited:
			return errors.New("mosquitto exited during startup")
		case <-tick.C:
		}
	}
}

// waitRunning polls with a deadline until mosquitto's log says it runs.
func waitRunning(logFile string, exited <-chan struct{}) error {
	deadline := time.Now().Add(startTimeout)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		if data, err := os.ReadFile(logFile); err == nil && strings.Contains(string(data), " running") {
			return nil
		}
		if time.Now().After(deadline) {
			return errors.New("mosquitto never logged that it runs")
		}
		select {
		case <-exited:
			return errors.New("mosquitto exited during startup")
		case <-tick.C:
		}
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// PID is the running broker's process id (0 when stopped), for reading its
// resource use from /proc.
func (b *Broker) PID() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.cmd == nil || b.cmd.Process == nil {
		return 0
	}
	return b.cmd.Process.Pid
}
