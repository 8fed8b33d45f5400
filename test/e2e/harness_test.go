// Package e2e runs the real mqlet binary against real brokers (mosquitto and
// the embedded one) and a real containerd. The harness here starts and kills
// agents, talks MQTT like an operator would, and asks CRI what really runs.
package e2e

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	apiv1 "github.com/mqlet/mqlet/api/v1"
	"github.com/mqlet/mqlet/internal/faultpoint"
	"github.com/mqlet/mqlet/internal/testutil/syncbuf"

	paho "github.com/eclipse/paho.mqtt.golang"
	"github.com/go-logr/logr"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	criclient "k8s.io/cri-client/pkg"
	"k8s.io/klog/v2"

	"github.com/mqlet/mqlet/internal/testutil/containerd"
	"github.com/mqlet/mqlet/internal/testutil/mqletbin"
)

const prefix = "mqlet/v1"

// mqletBin returns the mqlet binary the test runs.
func mqletBin(t testing.TB) string { t.Helper(); return mqletbin.Path(t) }

// syncBuffer is readable while its writer writes.
type syncBuffer = syncbuf.Buffer

// AgentOpts say how to start one mqlet.
type AgentOpts struct {
	Node     string
	Broker   string // tcp://host:port
	CRI      string // empty: a socket that does not exist
	StateDir string // empty: a new temp dir
	Embedded string // listen address of the embedded broker; empty: off
	Config   string // YAML written to a config file
	Args     []string
	// FaultPoints, when set, arms internal/faultpoint for the next start
	// only (MQLET_FAULTPOINTS): mqlet kills itself at the point named.
	FaultPoints string
}

// Agent is one mqlet process (restartable with the same options).
type Agent struct {
	t    testing.TB
	opts AgentOpts
	cmd  *exec.Cmd
	logs *syncBuffer
	done chan struct{}
}

// StartAgent starts mqlet and stops it when the test ends.
func StartAgent(t testing.TB, opts AgentOpts) *Agent {
	t.Helper()
	if opts.StateDir == "" {
		opts.StateDir = t.TempDir()
	}
	if opts.CRI == "" {
		opts.CRI = "unix://" + filepath.Join(opts.StateDir, "no-such-cri.sock")
	}
	a := &Agent{t: t, opts: opts}
	a.start()
	t.Cleanup(func() {
		a.Stop()
		if t.Failed() {
			t.Logf("mqlet %s log (tail):\n%s", opts.Node, tail(a.Logs(), 60))
		}
	})
	return a
}

func (a *Agent) start() {
	a.t.Helper()
	args := []string{"--node", a.opts.Node, "--state-dir", a.opts.StateDir, "--cri-endpoint", a.opts.CRI, "--log-level", "debug"}
	if a.opts.Broker != "" {
		args = append(args, "--broker", a.opts.Broker)
	}
	if a.opts.Embedded != "" {
		args = append(args, "--embedded-broker", "true", "--embedded-broker-listen", a.opts.Embedded)
	}
	if a.opts.Config != "" {
		file := filepath.Join(a.opts.StateDir, "mqlet.yaml")
		if err := os.WriteFile(file, []byte(a.opts.Config), 0o600); err != nil {
			a.t.Fatal(err)
		}
		args = append(args, "--config", file)
	}
	args = append(args, a.opts.Args...)
	if a.logs == nil {
		a.logs = &syncBuffer{}
	}
	a.cmd = exec.Command(mqletBin(a.t), args...)
	a.cmd.Stdout = a.logs
	a.cmd.Stderr = a.logs
	if a.opts.FaultPoints != "" {
		a.cmd.Env = append(os.Environ(), faultpoint.Env+"="+a.opts.FaultPoints)
	}
	if err := a.cmd.Start(); err != nil {
		a.t.Fatalf("starting mqlet: %v", err)
	}
	a.done = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) {
		_ = cmd.Wait()
		close(done)
	}(a.cmd, a.done)
}

// Kill9 kills mqlet without letting it say goodbye.
func (a *Agent) Kill9() {
	a.t.Helper()
	_ = a.cmd.Process.Kill()
	<-a.done
}

// Stop sends SIGTERM and waits (10 s) for a clean exit.
func (a *Agent) Stop() {
	select {
	case <-a.done:
		return
	default:
	}
	_ = a.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-a.done:
	case <-time.After(10 * time.Second):
		a.t.Errorf("mqlet did not stop within 10s of SIGTERM")
		_ = a.cmd.Process.Kill()
		<-a.done
	}
}

// Restart starts the same agent again (after Kill9 or Stop).
func (a *Agent) Restart() { a.t.Helper(); a.start() }

// RestartWithFaults starts the same agent again with the fault points
// armed (empty: none); later restarts keep that choice until changed.
func (a *Agent) RestartWithFaults(points string) {
	a.t.Helper()
	a.opts.FaultPoints = points
	a.start()
}

// WaitExit waits up to timeout for the process to end (a fault point's
// kill) and reports whether it did.
func (a *Agent) WaitExit(timeout time.Duration) bool {
	select {
	case <-a.done:
		return true
	case <-time.After(timeout):
		return false
	}
}

// Running reports whether the process is alive.
func (a *Agent) Running() bool {
	select {
	case <-a.done:
		return false
	default:
		return true
	}
}

// ExitCode waits for the process to end and returns its exit code.
func (a *Agent) ExitCode(timeout time.Duration) int {
	select {
	case <-a.done:
		return a.cmd.ProcessState.ExitCode()
	case <-time.After(timeout):
		a.t.Fatalf("mqlet still running after %v", timeout)
		return -1
	}
}

// Logs is everything mqlet wrote so far.
func (a *Agent) Logs() string { return a.logs.String() }

// Msg is one MQTT message seen by a Client.
type Msg struct {
	Topic    string
	Payload  []byte
	Retained bool
	At       time.Time
}

// Client is an operator's MQTT connection that records every message on
// the topics it subscribed to.
type Client struct {
	t       testing.TB
	c       paho.Client
	mu      sync.Mutex
	msgs    []Msg
	filters []string
	changed chan struct{}
}

// Connect connects a recording client to broker (tcp://host:port).
func Connect(t testing.TB, broker string) *Client {
	t.Helper()
	return ConnectTLS(t, broker, nil)
}

// ConnectTLS connects a recording client over TLS (ssl://host:port) with
// tlsConfig (client certificate and CA); nil means plain TCP.
func ConnectTLS(t testing.TB, broker string, tlsConfig *tls.Config) *Client {
	t.Helper()
	cl := &Client{t: t, changed: make(chan struct{})}
	opts := paho.NewClientOptions().AddBroker(broker).SetClientID(fmt.Sprintf("e2e-%d", time.Now().UnixNano())).
		SetCleanSession(true).SetAutoReconnect(true).SetConnectRetry(true).SetMaxReconnectInterval(time.Second).
		SetOrderMatters(true)
	opts.SetOnConnectHandler(func(c paho.Client) {
		// a clean session loses its subscriptions with the broker: take them again
		cl.mu.Lock()
		filters := append([]string(nil), cl.filters...)
		cl.mu.Unlock()
		for _, f := range filters {
			c.Subscribe(f, 1, cl.record)
		}
	})
	opts.SetDefaultPublishHandler(cl.record)
	if tlsConfig != nil {
		opts.SetTLSConfig(tlsConfig)
	}
	cl.c = paho.NewClient(opts)
	tok := cl.c.Connect()
	if !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("connecting to %s: %v", broker, tok.Error())
	}
	t.Cleanup(func() { cl.c.Disconnect(100) })
	return cl
}

func (c *Client) record(_ paho.Client, m paho.Message) {
	c.mu.Lock()
	c.msgs = append(c.msgs, Msg{Topic: m.Topic(), Payload: append([]byte(nil), m.Payload()...), Retained: m.Retained(), At: time.Now()})
	close(c.changed)
	c.changed = make(chan struct{})
	c.mu.Unlock()
}

// Subscribe subscribes at QoS 1 and records what arrives.
func (c *Client) Subscribe(filters ...string) {
	c.t.Helper()
	c.mu.Lock()
	c.filters = append(c.filters, filters...)
	c.mu.Unlock()
	for _, f := range filters {
		tok := c.c.Subscribe(f, 1, c.record)
		if !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
			c.t.Fatalf("subscribing to %s: %v", f, tok.Error())
		}
	}
}

// Publish publishes at QoS 1.
func (c *Client) Publish(topic string, payload []byte, retained bool) {
	c.t.Helper()
	tok := c.c.Publish(topic, 1, retained, payload)
	if !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		c.t.Fatalf("publishing to %s: %v", topic, tok.Error())
	}
}

// Command publishes a command to node.
func (c *Client) Command(node, verb, id string, payload []byte) {
	c.t.Helper()
	topic := prefix + "/" + node + "/cmd/" + verb
	if id != "" {
		topic += "/" + id
	}
	c.Publish(topic, payload, false)
}

// Messages returns a copy of everything recorded.
func (c *Client) Messages() []Msg {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]Msg(nil), c.msgs...)
}

// Mark is a position in the recorded messages, for waiting on what comes after.
func (c *Client) Mark() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.msgs)
}

// WaitFor waits until a message recorded at or after index from matches.
func (c *Client) WaitFor(from int, timeout time.Duration, what string, match func(Msg) bool) Msg {
	c.t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	// Each message is matched once: the recorded messages only grow, and
	// re-matching all of them at every arrival (a 20 MB log is a hundred
	// 256 KiB replies, each decoded again) made the waiting the bottleneck.
	next := from
	for {
		c.mu.Lock()
		for ; next < len(c.msgs); next++ {
			if match(c.msgs[next]) {
				m := c.msgs[next]
				c.mu.Unlock()
				return m
			}
		}
		changed := c.changed
		c.mu.Unlock()
		select {
		case <-changed:
		case <-deadline.C:
			c.t.Fatalf("timed out after %v waiting for %s", timeout, what)
			return Msg{}
		}
	}
}

// WaitReply waits for a reply to request id with the given phase; a final
// reply with another phase fails the test at once.
func (c *Client) WaitReply(node, id, phase string, timeout time.Duration) apiv1.Reply {
	c.t.Helper()
	topic := prefix + "/" + node + "/reply/" + id
	var got apiv1.Reply
	c.WaitFor(0, timeout, fmt.Sprintf("reply %s %s", id, phase), func(m Msg) bool {
		var r apiv1.Reply
		if m.Topic != topic || json.Unmarshal(m.Payload, &r) != nil {
			return false
		}
		if r.Phase == phase || r.Final() {
			got = r
			return true
		}
		return false
	})
	// Failing here, not inside the match, which runs under the client's lock.
	if got.Phase != phase {
		c.t.Fatalf("request %s ended %s (%s), want %s; errors: %v", id, got.Phase, got.Message, phase, got.Errors)
	}
	return got
}

// Replies returns every reply recorded for id, in order.
func (c *Client) Replies(node, id string) []apiv1.Reply {
	var out []apiv1.Reply
	for _, m := range c.Messages() {
		if m.Topic == prefix+"/"+node+"/reply/"+id {
			var r apiv1.Reply
			if json.Unmarshal(m.Payload, &r) == nil {
				out = append(out, r)
			}
		}
	}
	return out
}

// StateOf decodes a state payload.
type StateOf struct {
	State  string   `json:"state"`
	BootID string   `json:"bootId"`
	Seq    uint64   `json:"seq"`
	Groups []string `json:"groups"`
}

// WaitState waits for a state message of node with the given state.
func (c *Client) WaitState(from int, node, state string, timeout time.Duration) StateOf {
	c.t.Helper()
	var s StateOf
	c.WaitFor(from, timeout, node+" "+state, func(m Msg) bool {
		if m.Topic != prefix+"/"+node+"/state" || json.Unmarshal(m.Payload, &s) != nil {
			return false
		}
		return s.State == state
	})
	return s
}

// CRI is a direct CRI connection for checking what really runs.
type CRI struct {
	t   testing.TB
	svc criapi
}

type criapi interface {
	ListContainers(ctx context.Context, filter *runtimeapi.ContainerFilter) ([]*runtimeapi.Container, error)
	ListPodSandbox(ctx context.Context, filter *runtimeapi.PodSandboxFilter) ([]*runtimeapi.PodSandbox, error)
}

// ConnectCRI connects to the test containerd.
func ConnectCRI(t testing.TB) (*CRI, string) {
	t.Helper()
	endpoint := containerd.Endpoint(t)
	ctx, cancel := context.WithTimeout(klog.NewContext(context.Background(), logr.Discard()), 10*time.Second)
	defer cancel()
	svc, err := criclient.NewRemoteRuntimeServiceBuilder().WithEndpoint(endpoint).WithConnectionTimeout(5 * time.Second).WithTracerProvider(nil).Build(ctx)
	if err != nil {
		t.Fatalf("connecting to CRI %s: %v", endpoint, err)
	}
	return &CRI{t: t, svc: svc}, endpoint
}

func criCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(klog.NewContext(context.Background(), logr.Discard()), 10*time.Second)
}

// Containers lists the containers of pod namespace/name (any state).
func (c *CRI) Containers(namespace, name string) []*runtimeapi.Container {
	c.t.Helper()
	ctx, cancel := criCtx()
	defer cancel()
	list, err := c.svc.ListContainers(ctx, &runtimeapi.ContainerFilter{LabelSelector: map[string]string{
		"io.kubernetes.pod.namespace": namespace, "io.kubernetes.pod.name": name}})
	if err != nil {
		c.t.Fatalf("listing containers: %v", err)
	}
	return list
}

// Running lists the running containers of pod namespace/name.
func (c *CRI) Running(namespace, name string) []*runtimeapi.Container {
	var out []*runtimeapi.Container
	for _, ct := range c.Containers(namespace, name) {
		if ct.State == runtimeapi.ContainerState_CONTAINER_RUNNING {
			out = append(out, ct)
		}
	}
	return out
}

// Sandboxes lists the sandboxes of pod namespace/name (any state).
func (c *CRI) Sandboxes(namespace, name string) []*runtimeapi.PodSandbox {
	c.t.Helper()
	ctx, cancel := criCtx()
	defer cancel()
	list, err := c.svc.ListPodSandbox(ctx, &runtimeapi.PodSandboxFilter{LabelSelector: map[string]string{
		"io.kubernetes.pod.namespace": namespace, "io.kubernetes.pod.name": name}})
	if err != nil {
		c.t.Fatalf("listing sandboxes: %v", err)
	}
	return list
}

// Eventually polls cond every 100 ms until it holds or timeout passes.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(timeout)
	for !cond() {
		select {
		case <-tick.C:
		case <-deadline:
			t.Fatalf("timed out after %v waiting until %s", timeout, what)
		}
	}
}

func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// podYAML is a busybox pod running cmd under restartPolicy.
func podYAML(name, namespace, restartPolicy, cmd string) []byte {
	return []byte(fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: %s
  namespace: %s
spec:
  restartPolicy: %s
  terminationGracePeriodSeconds: 2
  containers:
  - name: main
    image: docker.io/mqlet/busybox:test
    imagePullPolicy: Never
    command: ["sh", "-c", %q]
`, name, namespace, restartPolicy, cmd))
}

func execCommand(bin string, args ...string) *exec.Cmd { return exec.Command(bin, args...) }
