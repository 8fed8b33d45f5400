package agent

import (
	"context"
	"encoding/json"
	"go.uber.org/goleak"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	"github.com/rs/zerolog"

	"github.com/mqlet/mqlet/agent/store"
	apiv1 "github.com/mqlet/mqlet/api/v1"
	"github.com/mqlet/mqlet/cri"
	"github.com/mqlet/mqlet/mqtt/broker"
	"github.com/mqlet/mqlet/mqtt/outbox"
	"github.com/mqlet/mqlet/mqtt/session"
)

// seen collects what a plain MQTT client receives, in order.
type seen struct {
	mu   sync.Mutex
	msgs []paho.Message
}

func (s *seen) add(m paho.Message) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.msgs = append(s.msgs, m)
}

// wait polls until one message satisfies cond, and returns it.
func (s *seen) wait(t *testing.T, what string, cond func(paho.Message) bool) paho.Message {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		s.mu.Lock()
		for _, m := range s.msgs {
			if cond(m) {
				s.mu.Unlock()
				return m
			}
		}
		s.mu.Unlock()
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("%s: not seen within 30s", what)
	return nil
}

func stateIs(topics apiv1.Scheme, state string) func(paho.Message) bool {
	return func(m paho.Message) bool {
		var p apiv1.NodeState
		return m.Topic() == topics.State() && json.Unmarshal(m.Payload(), &p) == nil && p.State == state
	}
}

// The whole agent on a real (embedded) broker with no container runtime:
// it comes online, answers a command, and on stop says offline before it
// disconnects, then returns with every part stopped.
func TestAgentAnswersACommandAndStopsInOrderWithoutARuntime(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	dir := t.TempDir()
	log := zerolog.Nop()
	ctx := context.Background()
	b, err := broker.Start(ctx, broker.Options{Listen: "127.0.0.1:0"}, log)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	st, err := store.OpenWith(filepath.Join(dir, "state.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	box, err := outbox.Open(filepath.Join(dir, "outbox.db"), 1<<20, log)
	if err != nil {
		t.Fatal(err)
	}
	defer box.Close()
	// A runtime that never answers: nothing listens on this socket.
	rt := cri.NewManager(cri.Config{Endpoint: "unix://" + filepath.Join(dir, "no-cri.sock"), PodDir: filepath.Join(dir, "pods"), PodLogDir: filepath.Join(dir, "logs")}, log)

	topics := apiv1.Scheme{Prefix: "mqlet", Node: "t1"}
	opts := Options{
		Topics: topics, Workers: 1, PLEGPeriod: time.Second, GCInterval: time.Hour, PodStatusResync: time.Hour,
		Version: "test",
		Session: session.Options{BrokerURL: "tcp://" + b.Addr(), ClientID: session.ClientID("t1"), KeepAlive: 30 * time.Second},
	}
	opts.Telemetry.NodeStatusInterval = time.Hour
	a, err := New(ctx, opts, Deps{Store: st, Outbox: box, Runtime: rt}, log)
	if err != nil {
		t.Fatal(err)
	}

	var got seen
	client := paho.NewClient(paho.NewClientOptions().AddBroker("tcp://" + b.Addr()).SetClientID("observer"))
	if tok := client.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("observer connect: %v", tok.Error())
	}
	defer client.Disconnect(0)
	if tok := client.Subscribe("mqlet/t1/#", 1, func(_ paho.Client, m paho.Message) { got.add(m) }); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("observer subscribe: %v", tok.Error())
	}

	runCtx, stop := context.WithCancel(ctx)
	var runErr error
	returned := make(chan struct{})
	go func() { defer close(returned); runErr = a.Run(runCtx) }()
	defer func() { stop(); <-returned }()
	got.wait(t, "online state", stateIs(topics, "online"))

	if tok := client.Publish(topics.Command("get", "r1"), 1, false, []byte(`{"kind":"pods"}`)); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("publish get: %v", tok.Error())
	}
	m := got.wait(t, "reply to r1", func(m paho.Message) bool {
		var r apiv1.Reply
		return m.Topic() == topics.Reply("r1") && json.Unmarshal(m.Payload(), &r) == nil && r.Final()
	})
	var r apiv1.Reply
	_ = json.Unmarshal(m.Payload(), &r)
	if r.Phase != apiv1.Succeeded || r.RequestID != "r1" {
		t.Fatalf("reply %s, want succeeded for r1", m.Payload())
	}
	if rt.Ready() {
		t.Fatal("runtime ready with no CRI endpoint")
	}

	stoppedAt := time.Now().UTC()
	stop()
	select {
	case <-returned:
		if runErr != nil {
			t.Fatalf("Run: %v", runErr)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return within 30s of the stop")
	}
	// The offline state is the agent's goodbye, sent while the session was
	// still up: stamped after the stop, unlike the will (stamped when the
	// agent was built), which only a connection cut before the goodbye
	// would have released.
	off := got.wait(t, "offline state", stateIs(topics, "offline"))
	var p apiv1.NodeState
	_ = json.Unmarshal(off.Payload(), &p)
	if p.BootID != a.BootID() || p.TS.Before(stoppedAt) {
		t.Fatalf("offline state %s: want boot %q stamped at or after the stop (%v)", off.Payload(), a.BootID(), stoppedAt)
	}
	// Run left the stores to its caller, open and usable.
	if _, err := st.NextSeq(); err != nil {
		t.Fatalf("store after Run: %v", err)
	}
	if err := box.Put(outbox.Message{Topic: topics.Events(), Payload: []byte("{}"), QoS: 1}); err != nil && !strings.Contains(err.Error(), "full") {
		t.Fatalf("outbox after Run: %v", err)
	}
}
