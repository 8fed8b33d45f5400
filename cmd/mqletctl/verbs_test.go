package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	apiv1 "github.com/mqlet/mqlet/api/v1"
	"github.com/mqlet/mqlet/mqtt/broker"
)

// Ctrl-C on `logs -f` ends it cleanly (exit 0, nothing on stderr) and
// cancels the follow on the agent; while it reads, it says so on the
// request's input topic, so the agent keeps the follower.
func TestLogsFollowInterruptedCancelsOnTheAgent(t *testing.T) {
	url := startBroker(t, broker.Options{})
	agent := startFakeAgent(t, url, func(r received) []fakeReply {
		if r.Verb == "logs" {
			return []fakeReply{{Phase: apiv1.InProgress, Seq: 1, Message: "log chunk 1", Result: apiv1.LogsChunk{Lines: []string{"hello"}}}}
		}
		return nil // the cancel's answer is not awaited
	})
	heard := make(chan string, 16)
	obs := testClient(t, url, "observer")
	tok := obs.Subscribe(scheme.InputFilter(), 0, func(_ paho.Client, m paho.Message) { heard <- m.Topic() })
	if !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatalf("subscribing to the input topics: %v", tok.Error())
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out, errOut syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"--node", "n1", "--broker", url, "logs", "-f", "web"},
			env{getenv: func(string) string { return "" }, stdout: &out, stderr: &errOut, now: func() time.Time { return testNow }})
	}()
	logs := <-agent.got
	var req apiv1.LogsRequest
	if err := json.Unmarshal(logs.Payload, &req); err != nil || logs.Verb != "logs" || !req.Follow {
		t.Fatalf("agent got %s %s (%v), want a followed logs request", logs.Verb, logs.Payload, err)
	}
	select {
	case topic := <-heard:
		if topic != scheme.Input(logs.RequestID) {
			t.Fatalf("heartbeat on %s, want %s", topic, scheme.Input(logs.RequestID))
		}
	case <-time.After(3 * apiv1.InputInterval):
		t.Fatalf("no heartbeat on %s within %s", scheme.Input(logs.RequestID), 3*apiv1.InputInterval)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(out.String(), "hello\n") {
		if time.Now().After(deadline) {
			t.Fatalf("the chunk was not printed: %q", out.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel() // Ctrl-C
	select {
	case code := <-done:
		if code != 0 || errOut.String() != "" {
			t.Errorf("logs -f ended by Ctrl-C: exit %d, stderr %q; want 0 and nothing", code, errOut.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("logs -f did not stop when interrupted")
	}
	select {
	case c := <-agent.got:
		var cr apiv1.CancelRequest
		if err := json.Unmarshal(c.Payload, &cr); err != nil || c.Verb != apiv1.VerbCancel || cr.RequestID != logs.RequestID {
			t.Fatalf("after Ctrl-C the agent got %s %s, want cancel of %s", c.Verb, c.Payload, logs.RequestID)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no cancel reached the agent after Ctrl-C")
	}
}
