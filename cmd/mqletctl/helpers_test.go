package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mqlet/mqlet/internal/testutil/syncbuf"

	paho "github.com/eclipse/paho.mqtt.golang"
	"github.com/rs/zerolog"

	apiv1 "github.com/mqlet/mqlet/api/v1"
	"github.com/mqlet/mqlet/mqtt/broker"
	"github.com/mqlet/mqlet/sealing"
)

// testNow is the fixed clock of every CLI run in the tests.
var testNow = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

var scheme = apiv1.Scheme{Node: "n1"}

// startBroker runs the embedded broker on a random loopback port and
// returns its URL.
func startBroker(t *testing.T, opts broker.Options) string {
	t.Helper()
	if opts.Listen == "" {
		opts.Listen = "127.0.0.1:0"
	}
	b, err := broker.Start(context.Background(), opts, zerolog.Nop())
	if err != nil {
		t.Fatalf("starting embedded broker: %v", err)
	}
	t.Cleanup(func() { _ = b.Close() })
	scheme := "tcp://"
	if opts.TLS != nil {
		scheme = "ssl://"
	}
	return scheme + b.Addr()
}

// testClient connects a plain paho client for the test's own use.
func testClient(t *testing.T, url, id string) paho.Client {
	t.Helper()
	return testClientAuth(t, url, id, "")
}

// testClientAuth connects as user id with password (none when empty).
func testClientAuth(t *testing.T, url, id, password string) paho.Client {
	t.Helper()
	opts := paho.NewClientOptions().AddBroker(url).SetClientID(id)
	if password != "" {
		opts.SetUsername(id).SetPassword(password)
	}
	c := paho.NewClient(opts.
		SetCleanSession(true).SetAutoReconnect(false).SetConnectTimeout(5 * time.Second))
	tok := c.Connect()
	if !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatalf("test client %s connecting to %s: %v", id, url, tok.Error())
	}
	t.Cleanup(func() { c.Disconnect(100) })
	return c
}

func mustPublish(t *testing.T, c paho.Client, topicName string, retained bool, payload []byte) {
	t.Helper()
	tok := c.Publish(topicName, 1, retained, payload)
	if !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatalf("publishing %s: %v", topicName, tok.Error())
	}
}

// received is one command the fake agent got.
type received struct {
	Verb, RequestID string
	Payload         []byte
}

// fakeReply is what the fake agent answers; it fills in requestId, verb
// and ts.
type fakeReply = apiv1.Reply

// fakeAgent answers commands on mqlet/v1/n1/cmd/# like the agent does:
// answer decides the replies to each command, published in order.
type fakeAgent struct {
	mu       sync.Mutex
	commands []received
	got      chan received
	// sealing is the node's sealing key, published in its state.
	sealing *sealing.Identity
}

func startFakeAgent(t *testing.T, url string, answer func(received) []fakeReply) *fakeAgent {
	t.Helper()
	id, err := sealing.NewIdentity()
	if err != nil {
		t.Fatal(err)
	}
	a := &fakeAgent{got: make(chan received, 16), sealing: id}
	c := testClient(t, url, "fake-agent")
	// Registered after testClient's cleanup, so it runs first: replies in
	// flight finish before the fake agent disconnects.
	var answering sync.WaitGroup
	t.Cleanup(answering.Wait)
	handler := func(cl paho.Client, m paho.Message) {
		ct, err := scheme.ParseCommand(m.Topic())
		verb, id := ct.Verb, ct.RequestID
		if err != nil {
			t.Errorf("fake agent: bad command topic %q: %v", m.Topic(), err)
			return
		}
		r := received{Verb: verb, RequestID: id, Payload: append([]byte(nil), m.Payload()...)}
		a.mu.Lock()
		a.commands = append(a.commands, r)
		a.mu.Unlock()
		a.got <- r
		// Answer from another goroutine: paho must not publish-and-wait
		// inside its message handler.
		answering.Add(1)
		go func() {
			defer answering.Done()
			for _, rep := range answer(r) {
				rep.RequestID, rep.Verb, rep.TS = id, verb, time.Now().UTC()
				payload, err := json.Marshal(rep)
				if err != nil {
					t.Errorf("fake agent: encoding reply: %v", err)
					return
				}
				tok := cl.Publish(scheme.Reply(id), 1, false, payload)
				if !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
					t.Errorf("fake agent: publishing reply: %v", tok.Error())
					return
				}
			}
		}()
	}
	tok := c.Subscribe(scheme.CommandFilters()[0], 1, handler)
	if !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatalf("fake agent subscribing: %v", tok.Error())
	}
	// Like the agent, say the node exists: mqletctl gives up early on a
	// node without retained state.
	mustPublish(t, c, scheme.State(), true, []byte(`{"state":"online","bootId":"b1","version":"test","sealingKey":"`+id.Recipient()+`"}`))
	return a
}

// only returns the single command the fake agent received.
func (a *fakeAgent) only(t *testing.T) received {
	t.Helper()
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.commands) != 1 {
		t.Fatalf("fake agent received %d commands, want 1: %+v", len(a.commands), a.commands)
	}
	return a.commands[0]
}

// result of one CLI run.
type result struct {
	code           int
	stdout, stderr string
}

// runCLI runs mqletctl in-process with --node n1 from the environment.
func runCLI(t *testing.T, url string, stdin string, args ...string) result {
	t.Helper()
	return runCLIEnv(t, map[string]string{envBroker: url, envNode: "n1"}, stdin, args...)
}

func runCLIEnv(t *testing.T, vars map[string]string, stdin string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out, errOut bytes.Buffer
	e := env{
		getenv: func(k string) string { return vars[k] },
		stdin:  strings.NewReader(stdin),
		stdout: &out,
		stderr: &errOut,
		now:    func() time.Time { return testNow },
	}
	code := run(ctx, args, e)
	return result{code: code, stdout: out.String(), stderr: errOut.String()}
}

func (r result) String() string {
	return fmt.Sprintf("exit %d\n--- stdout:\n%s--- stderr:\n%s", r.code, r.stdout, r.stderr)
}

// syncBuffer is readable while its writer writes.
type syncBuffer = syncbuf.Buffer
