package telemetry

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	cadvisorapi "github.com/google/cadvisor/lib/model"
	v1 "k8s.io/api/core/v1"

	"github.com/mqlet/mqlet/agent/nodestatus"
	"github.com/mqlet/mqlet/agent/retained"
	apiv1 "github.com/mqlet/mqlet/api/v1"
	"github.com/mqlet/mqlet/cri"
	"github.com/mqlet/mqlet/mqtt/outbox"
)

var testTopics = apiv1.Scheme{Prefix: "mqlet/v1", Node: "gw1"}

// fakeRuntime is a runtime whose readiness the test flips.
type fakeRuntime struct {
	mu      sync.Mutex
	ready   bool
	name    string
	version string
	changed chan struct{}
	pods    []cri.PodRef
	listErr error
}

func newFakeRuntime(ready bool) *fakeRuntime {
	return &fakeRuntime{ready: ready, name: "containerd", version: "1.6.20", changed: make(chan struct{})}
}

func (f *fakeRuntime) Ready() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.ready
}

func (f *fakeRuntime) RuntimeInfo() (string, string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.name, f.version
}

func (f *fakeRuntime) Changes() <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.changed
}

func (f *fakeRuntime) setReady(ready bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ready = ready
	close(f.changed)
	f.changed = make(chan struct{})
}

func (f *fakeRuntime) ListPods(context.Context) ([]cri.PodRef, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]cri.PodRef(nil), f.pods...), f.listErr
}

// fakePublisher hands every queued message to the test.
type fakePublisher struct {
	msgs  chan outbox.Message
	fails atomic.Int32 // Puts to refuse before accepting
}

func newFakePublisher() *fakePublisher { return &fakePublisher{msgs: make(chan outbox.Message, 256)} }

// Set publishes as the node's registry of retained topics does.
func (p *fakePublisher) Set(topic string, payload []byte) error {
	return p.Put(retained.Message(topic, payload))
}

func (p *fakePublisher) Put(m outbox.Message) error {
	if p.fails.Load() > 0 {
		p.fails.Add(-1)
		return errors.New("outbox full")
	}
	p.msgs <- m
	return nil
}

// next waits for the next message on topic, skipping others.
func (p *fakePublisher) next(t *testing.T, topic string, timeout time.Duration) outbox.Message {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		select {
		case m := <-p.msgs:
			if m.Topic == topic {
				return m
			}
		case <-deadline.C:
			t.Fatalf("no message on %s within %s", topic, timeout)
			return outbox.Message{}
		}
	}
}

// count returns how many messages are queued right now.
func (p *fakePublisher) count() int { return len(p.msgs) }

type fakeMachine struct{}

func (fakeMachine) MachineInfo() (*cadvisorapi.MachineInfo, error) {
	return &cadvisorapi.MachineInfo{NumCores: 2, MemoryCapacity: 4 << 30, MachineID: "m1", SystemUUID: "u1", BootID: "b1"}, nil
}

type recordedEvent struct{ eventType, reason, message string }

type fakeEvents struct {
	mu     sync.Mutex
	events []recordedEvent
}

func (e *fakeEvents) NodeEvent(eventType, reason, message string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.events = append(e.events, recordedEvent{eventType, reason, message})
}

func (e *fakeEvents) reasons() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []string
	for _, ev := range e.events {
		out = append(out, ev.reason)
	}
	return out
}

func (e *fakeEvents) find(reason string) (recordedEvent, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, ev := range e.events {
		if ev.reason == reason {
			return ev, true
		}
	}
	return recordedEvent{}, false
}

// fakeHost serves fixed host inputs.
func fakeHost() (nodestatus.HostInputs, error) {
	return nodestatus.HostInputs{
		Host: nodestatus.HostInfo{KernelVersion: "6.1.0", OSImage: "Debian GNU/Linux 12", Architecture: "amd64", Hostname: "gw1", InternalIPs: []string{"10.0.0.2"}},
		Disk: &nodestatus.DiskUsage{CapacityBytes: 100 << 30, AvailableBytes: 50 << 30},
		PIDs: &nodestatus.PIDUsage{Running: 200, Max: 32768},
	}, nil
}

// memoryGauge is a MemoryAvailableReader the test sets, counting reads.
type memoryGauge struct {
	value atomic.Uint64
	reads chan struct{}
}

func newMemoryGauge(v uint64) *memoryGauge {
	g := &memoryGauge{reads: make(chan struct{}, 1024)}
	g.value.Store(v)
	return g
}

func (g *memoryGauge) read() (uint64, error) {
	select {
	case g.reads <- struct{}{}:
	default:
	}
	return g.value.Load(), nil
}

// decodeStrict decodes JSON into out, refusing unknown fields.
func decodeStrict(t *testing.T, payload []byte, out any) {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.DisallowUnknownFields()
	if err := dec.Decode(out); err != nil {
		t.Fatalf("payload does not decode strictly into %T: %v\n%s", out, err, payload)
	}
}

func decodeNode(t *testing.T, m outbox.Message) *v1.Node {
	t.Helper()
	var node v1.Node
	decodeStrict(t, m.Payload, &node)
	return &node
}

func condition(t *testing.T, node *v1.Node, ct v1.NodeConditionType) v1.NodeCondition {
	t.Helper()
	for _, c := range node.Status.Conditions {
		if c.Type == ct {
			return c
		}
	}
	t.Fatalf("node has no %s condition: %+v", ct, node.Status.Conditions)
	return v1.NodeCondition{}
}

// runInBackground runs f until the test ends and checks it stopped.
func runInBackground(t *testing.T, f func(context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run returned %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Errorf("Run did not stop within 5s of cancel")
		}
	})
}
