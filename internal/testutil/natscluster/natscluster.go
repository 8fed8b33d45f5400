// Package natscluster runs a real NATS server cluster with its MQTT gateway
// on loopback for tests: Debian's nats-server (test/env/install-deps.sh),
// JetStream clustered (sessions and retained messages are the cluster's),
// one process per server, each killable. Test-only: nothing of NATS is
// linked into mqlet.
package natscluster

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
)

// Binary is where the Debian package installs the server.
const Binary = "/usr/sbin/nats-server"

const startTimeout = 20 * time.Second

// Server is one member of the cluster.
type Server struct {
	Name     string
	mqttPort int
	dir      string
	conf     string
	logFile  string

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
}

// Cluster is n servers routed to each other.
type Cluster struct {
	Servers []*Server
}

// Start launches an n-server cluster and stops it when the test ends. The
// test fails if nats-server is not installed.
func Start(t testing.TB, n int) *Cluster {
	t.Helper()
	if _, err := os.Stat(Binary); err != nil {
		t.Fatalf("nats-server is required for this test but %s is missing (test/env/install-deps.sh): %v", Binary, err)
	}
	ports := make([]int, 3*n) // client, cluster, mqtt per server
	for i := range ports {
		p, err := freePort()
		if err != nil {
			t.Fatalf("find a free port: %v", err)
		}
		ports[i] = p
	}
	routes := make([]string, n)
	for i := range n {
		routes[i] = fmt.Sprintf("nats-route://127.0.0.1:%d", ports[3*i+1])
	}
	c := &Cluster{}
	for i := range n {
		dir := t.TempDir()
		s := &Server{Name: fmt.Sprintf("n%d", i+1), mqttPort: ports[3*i+2], dir: dir,
			conf: filepath.Join(dir, "nats.conf"), logFile: filepath.Join(dir, "nats.log")}
		conf := fmt.Sprintf(`server_name: %s
listen: 127.0.0.1:%d
jetstream { store_dir: %q }
cluster { name: mqlet, listen: 127.0.0.1:%d, routes: [%s] }
mqtt { listen: 127.0.0.1:%d }
`, s.Name, ports[3*i], filepath.Join(dir, "js"), ports[3*i+1], strings.Join(routes, ", "), s.mqttPort)
		if err := os.WriteFile(s.conf, []byte(conf), 0o600); err != nil {
			t.Fatalf("write nats config: %v", err)
		}
		c.Servers = append(c.Servers, s)
	}
	for _, s := range c.Servers {
		s.start(t)
		t.Cleanup(func() {
			s.Kill()
			if t.Failed() {
				t.Logf("nats server %s log (tail):\n%s", s.Name, tail(s.Log(), 30))
			}
		})
	}
	for _, s := range c.Servers {
		if err := waitListening(s.Addr(), s.exited); err != nil {
			t.Fatalf("nats server %s did not listen for MQTT on %s: %v\nlog:\n%s", s.Name, s.Addr(), err, s.Log())
		}
	}
	// MQTT connects are refused until JetStream's cluster has a leader.
	deadline := time.Now().Add(startTimeout)
	for !c.hasMetaLeader() {
		if time.Now().After(deadline) {
			t.Fatalf("the NATS cluster elected no JetStream leader in %v; log of %s:\n%s", startTimeout, c.Servers[0].Name, c.Servers[0].Log())
		}
		time.Sleep(100 * time.Millisecond) // polling a log file: nothing to wait on
	}
	// The first MQTT connect makes the MQTT streams (3 replicas), which on
	// a loaded machine takes seconds; every server must take a connect.
	for _, s := range c.Servers {
		if err := waitMQTT(s.URL(), readyTimeout); err != nil {
			t.Fatalf("nats server %s takes no MQTT connect: %v\nlog:\n%s", s.Name, err, tail(s.Log(), 30))
		}
	}
	return c
}

// readyTimeout bounds the wait for the cluster to take MQTT connects.
const readyTimeout = 90 * time.Second

// waitMQTT connects to url until a connect succeeds and a QoS 1 publish is
// acknowledged, or timeout passes.
func waitMQTT(url string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		c := paho.NewClient(paho.NewClientOptions().AddBroker(url).SetClientID(fmt.Sprintf("ready-%d", time.Now().UnixNano())).
			SetCleanSession(true).SetConnectTimeout(10 * time.Second).SetAutoReconnect(false))
		tok := c.Connect()
		if tok.WaitTimeout(15*time.Second) && tok.Error() == nil {
			pub := c.Publish("natscluster/ready", 1, false, []byte("1"))
			ok := pub.WaitTimeout(15*time.Second) && pub.Error() == nil
			last = pub.Error()
			c.Disconnect(100)
			if ok {
				return nil
			}
		} else {
			last = tok.Error()
		}
		time.Sleep(500 * time.Millisecond) // a refused connect returns at once: do not spin
	}
	return fmt.Errorf("no MQTT connect and publish within %v (last: %v)", timeout, last)
}

func (c *Cluster) hasMetaLeader() bool {
	for _, s := range c.Servers {
		if strings.Contains(s.Log(), "metadata leader") {
			return true
		}
	}
	return false
}

// URL is the server's MQTT address, tcp://127.0.0.1:PORT.
func (s *Server) URL() string { return "tcp://" + s.Addr() }

// Addr is host:port of the MQTT listener.
func (s *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.mqttPort)) }

// Log returns what the server logged so far.
func (s *Server) Log() string {
	data, err := os.ReadFile(s.logFile)
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	return string(data)
}

func (s *Server) start(t testing.TB) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	cmd := exec.Command(Binary, "-c", s.conf, "-l", s.logFile)
	cmd.Dir = s.dir
	if err := cmd.Start(); err != nil {
		t.Fatalf("start nats-server: %v", err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	s.cmd, s.exited = cmd, exited
}

// Kill ends the server with SIGKILL, as a lost host would. Killing a
// killed server does nothing.
func (s *Server) Kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	<-s.exited
	s.cmd = nil
}

func waitListening(addr string, exited <-chan struct{}) error {
	deadline := time.NewTimer(startTimeout)
	defer deadline.Stop()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			_ = c.Close()
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("exited")
		case <-deadline.C:
			return fmt.Errorf("not listening after %v", startTimeout)
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

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
