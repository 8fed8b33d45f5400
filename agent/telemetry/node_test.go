package telemetry

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	v1 "k8s.io/api/core/v1"

	"github.com/mqlet/mqlet/agent/nodestatus"
)

const plentyOfMemory = 2 << 30

type nodeFixture struct {
	rt     *fakeRuntime
	out    *fakePublisher
	events *fakeEvents
	memory *memoryGauge
	rep    *NodeReporter
}

func newNodeFixture(t *testing.T, opts NodeOptions, ready bool) *nodeFixture {
	t.Helper()
	b, err := nodestatus.NewBuilder(nodestatus.Options{NodeName: "gw1", Version: "v0.1.0"})
	if err != nil {
		t.Fatal(err)
	}
	f := &nodeFixture{rt: newFakeRuntime(ready), out: newFakePublisher(), events: &fakeEvents{}, memory: newMemoryGauge(plentyOfMemory)}
	opts.Topics = testTopics
	f.rep = NewNodeReporter(opts, b, NodeSources{Machine: fakeMachine{}, Runtime: f.rt, Host: fakeHost, MemoryAvailable: f.memory.read},
		f.out, f.events, zerolog.New(zerolog.NewTestWriter(t)))
	return f
}

// waitReads waits until the node has been built n more times.
func (f *nodeFixture) waitReads(t *testing.T, n int) {
	t.Helper()
	deadline := time.NewTimer(5 * time.Second)
	defer deadline.Stop()
	for i := 0; i < n; i++ {
		select {
		case <-f.memory.reads:
		case <-deadline.C:
			t.Fatalf("node built only %d of %d times within 5s", i, n)
		}
	}
}

func TestNodeReporterPublishesRetainedNodeAtStart(t *testing.T) {
	f := newNodeFixture(t, NodeOptions{Interval: time.Hour}, true)
	runInBackground(t, f.rep.Run)
	m := f.out.next(t, "mqlet/v1/gw1/node", 5*time.Second)
	if !m.Retained || m.QoS != 1 || !m.Coalesce {
		t.Fatalf("node message retained=%v qos=%d coalesce=%v, want retained QoS 1 coalesced", m.Retained, m.QoS, m.Coalesce)
	}
	node := decodeNode(t, m)
	if node.Name != "gw1" || node.Kind != "Node" {
		t.Fatalf("node name %q kind %q", node.Name, node.Kind)
	}
	if ready := condition(t, node, v1.NodeReady); ready.Status != v1.ConditionTrue {
		t.Fatalf("Ready = %s (%s), want True", ready.Status, ready.Message)
	}
	if got := node.Status.Capacity.Cpu().Value(); got != 2 {
		t.Fatalf("cpu capacity %d, want 2 from MachineInfo", got)
	}
	if node.Status.NodeInfo.ContainerRuntimeVersion != "containerd://1.6.20" {
		t.Fatalf("runtime version %q", node.Status.NodeInfo.ContainerRuntimeVersion)
	}
	if _, ok := f.events.find("NodeReady"); !ok {
		t.Fatalf("no NodeReady event at start; events %v", f.events.reasons())
	}
	for _, r := range f.events.reasons() {
		if r == "NodeHasSufficientMemory" {
			t.Fatalf("healthy pressure conditions are not evented at start: %v", f.events.reasons())
		}
	}
}

func TestNodeReporterSkipsUnchangedChecks(t *testing.T) {
	f := newNodeFixture(t, NodeOptions{Interval: time.Hour, CheckInterval: 5 * time.Millisecond}, true)
	runInBackground(t, f.rep.Run)
	f.out.next(t, "mqlet/v1/gw1/node", 5*time.Second)
	// The start build plus five checks: the reports before the last read
	// have all finished, and none had anything new to say.
	f.waitReads(t, 6)
	if n := f.out.count(); n != 0 {
		t.Fatalf("%d node messages published by checks that found no change", n)
	}
}

func TestNodeReporterPublishesOnChange(t *testing.T) {
	f := newNodeFixture(t, NodeOptions{Interval: time.Hour, CheckInterval: 5 * time.Millisecond}, true)
	runInBackground(t, f.rep.Run)
	first := decodeNode(t, f.out.next(t, "mqlet/v1/gw1/node", 5*time.Second))
	if c := condition(t, first, v1.NodeMemoryPressure); c.Status != v1.ConditionFalse {
		t.Fatalf("MemoryPressure at start = %s", c.Status)
	}
	f.memory.value.Store(10 << 20) // below the 100Mi default threshold
	node := decodeNode(t, f.out.next(t, "mqlet/v1/gw1/node", 5*time.Second))
	if c := condition(t, node, v1.NodeMemoryPressure); c.Status != v1.ConditionTrue || c.Reason != nodestatus.ReasonInsufficientMemory {
		t.Fatalf("MemoryPressure after the drop = %s/%s, want True/%s", c.Status, c.Reason, nodestatus.ReasonInsufficientMemory)
	}
	ev, ok := f.events.find("NodeHasInsufficientMemory")
	if !ok || ev.eventType != v1.EventTypeWarning {
		t.Fatalf("want a Warning NodeHasInsufficientMemory event, have %v", f.events.reasons())
	}
	f.memory.value.Store(plentyOfMemory)
	node = decodeNode(t, f.out.next(t, "mqlet/v1/gw1/node", 5*time.Second))
	if c := condition(t, node, v1.NodeMemoryPressure); c.Status != v1.ConditionFalse {
		t.Fatalf("MemoryPressure after recovery = %s", c.Status)
	}
	if _, ok := f.events.find("NodeHasSufficientMemory"); !ok {
		t.Fatalf("no NodeHasSufficientMemory event after recovery: %v", f.events.reasons())
	}
}

func TestNodeReporterHeartbeat(t *testing.T) {
	f := newNodeFixture(t, NodeOptions{Interval: 20 * time.Millisecond}, true)
	runInBackground(t, f.rep.Run)
	first := decodeNode(t, f.out.next(t, "mqlet/v1/gw1/node", 5*time.Second))
	for i := 0; i < 3; i++ {
		hb := decodeNode(t, f.out.next(t, "mqlet/v1/gw1/node", 5*time.Second))
		if nodestatus.Changed(first, hb) {
			t.Fatalf("heartbeat %d differs from the first node beyond heartbeat times", i)
		}
	}
}

func TestNodeReporterRuntimeDownAndBack(t *testing.T) {
	// No tick can fire during the test: the transitions come from Changes.
	f := newNodeFixture(t, NodeOptions{Interval: time.Hour, CheckInterval: time.Hour, RuntimeEndpoint: "unix:///run/containerd/containerd.sock"}, true)
	runInBackground(t, f.rep.Run)
	start := decodeNode(t, f.out.next(t, "mqlet/v1/gw1/node", 5*time.Second))
	if c := condition(t, start, v1.NodeReady); c.Status != v1.ConditionTrue {
		t.Fatalf("Ready at start = %s", c.Status)
	}

	f.rt.setReady(false)
	down := decodeNode(t, f.out.next(t, "mqlet/v1/gw1/node", 5*time.Second))
	c := condition(t, down, v1.NodeReady)
	if c.Status != v1.ConditionFalse || c.Reason != nodestatus.ReasonRuntimeUnreachable {
		t.Fatalf("Ready with the runtime down = %s/%s, want False/%s", c.Status, c.Reason, nodestatus.ReasonRuntimeUnreachable)
	}
	if !strings.Contains(c.Message, "unix:///run/containerd/containerd.sock") {
		t.Fatalf("not-ready message does not name the endpoint: %q", c.Message)
	}
	if ev, ok := f.events.find("NodeNotReady"); !ok || ev.eventType != v1.EventTypeWarning {
		t.Fatalf("want a Warning NodeNotReady event, have %v", f.events.reasons())
	}

	f.rt.setReady(true)
	up := decodeNode(t, f.out.next(t, "mqlet/v1/gw1/node", 5*time.Second))
	if c := condition(t, up, v1.NodeReady); c.Status != v1.ConditionTrue || c.Reason != nodestatus.ReasonReady {
		t.Fatalf("Ready after the runtime came back = %s/%s", c.Status, c.Reason)
	}
	if n := len(f.events.reasons()); n < 3 || f.events.reasons()[n-1] != "NodeReady" {
		t.Fatalf("want NodeReady, NodeNotReady, NodeReady; have %v", f.events.reasons())
	}
}

func TestNodeReporterRetriesWhenTheOutboxRefuses(t *testing.T) {
	f := newNodeFixture(t, NodeOptions{Interval: time.Hour, CheckInterval: 5 * time.Millisecond}, true)
	f.out.fails.Store(1)
	runInBackground(t, f.rep.Run)
	m := f.out.next(t, "mqlet/v1/gw1/node", 5*time.Second)
	if node := decodeNode(t, m); node.Name != "gw1" {
		t.Fatalf("retried node named %q", node.Name)
	}
}

func TestReadMemAvailable(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "meminfo")
	if err := os.WriteFile(good, []byte("MemTotal:        4030464 kB\nMemFree:          123456 kB\nMemAvailable:    2015232 kB\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := ReadMemAvailable(good)
	if err != nil || got != 2015232*1024 {
		t.Fatalf("ReadMemAvailable = %d, %v; want %d", got, err, 2015232*1024)
	}
	bad := filepath.Join(dir, "old")
	if err := os.WriteFile(bad, []byte("MemTotal: 1 kB\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadMemAvailable(bad); err == nil {
		t.Fatal("a meminfo without MemAvailable was accepted")
	}
	real, err := ReadMemAvailable("/proc/meminfo")
	if err != nil || real == 0 {
		t.Fatalf("this machine's MemAvailable = %d, %v", real, err)
	}
}

func TestNodeReporterWaitsForTheRuntimeAtStart(t *testing.T) {
	f := newNodeFixture(t, NodeOptions{Interval: time.Hour, CheckInterval: time.Hour, StartupGrace: time.Hour}, false)
	runInBackground(t, f.rep.Run)
	f.rt.setReady(true) // the first handshake succeeds during the grace
	node := decodeNode(t, f.out.next(t, "mqlet/v1/gw1/node", 5*time.Second))
	if c := condition(t, node, v1.NodeReady); c.Status != v1.ConditionTrue {
		t.Fatalf("first node Ready = %s, want True", c.Status)
	}
	if got := f.events.reasons(); len(got) != 1 || got[0] != "NodeReady" {
		t.Fatalf("events %v, want only NodeReady (no start-up flap)", got)
	}
}

func TestNodeReporterPublishesNotReadyAfterTheGrace(t *testing.T) {
	f := newNodeFixture(t, NodeOptions{Interval: time.Hour, CheckInterval: time.Hour, StartupGrace: 10 * time.Millisecond}, false)
	runInBackground(t, f.rep.Run)
	node := decodeNode(t, f.out.next(t, "mqlet/v1/gw1/node", 5*time.Second))
	if c := condition(t, node, v1.NodeReady); c.Status != v1.ConditionFalse || c.Reason != nodestatus.ReasonRuntimeUnreachable {
		t.Fatalf("Ready = %s/%s with the runtime down from the start", c.Status, c.Reason)
	}
	if ev, ok := f.events.find("NodeNotReady"); !ok || ev.eventType != v1.EventTypeWarning {
		t.Fatalf("events %v, want NodeNotReady", f.events.reasons())
	}
}
