package agent

import (
	"encoding/json"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/mqlet/mqlet/internal/redact"
	"github.com/mqlet/mqlet/mqtt/outbox"
)

type captured struct{ msgs []outbox.Message }

func (c *captured) Put(m outbox.Message) error { c.msgs = append(c.msgs, m); return nil }

func (c *captured) PutBatch(msgs []outbox.Message) error {
	c.msgs = append(c.msgs, msgs...)
	return nil
}

// Every message queued through Scrubbed loses the node's secret values,
// stays valid JSON and keeps its topic and flags.
func TestScrubbedPublisherRemovesSecretValues(t *testing.T) {
	var next captured
	s := redact.FromSecrets([]*v1.Secret{{StringData: map[string]string{"pw": "hunter2-value"}}})
	out := Scrubbed(&next, func() *redact.Scrubber { return s })
	ev, _ := json.Marshal(v1.Event{Reason: "Failed", Message: `exec: "hunter2-value": executable file not found`})
	if err := out.Put(outbox.Message{Topic: "t/events", Payload: ev, QoS: 1, Retained: true, Coalesce: true}); err != nil {
		t.Fatal(err)
	}
	m := next.msgs[0]
	if strings.Contains(string(m.Payload), "hunter2-value") || !json.Valid(m.Payload) || !strings.Contains(string(m.Payload), redact.Placeholder) {
		t.Fatalf("payload %s", m.Payload)
	}
	if m.Topic != "t/events" || m.QoS != 1 || !m.Retained || !m.Coalesce {
		t.Fatalf("message changed: %+v", m)
	}
}

// A batch of replies (the intake's group commit) is scrubbed message by message.
func TestScrubbedPublisherScrubsBatches(t *testing.T) {
	var next captured
	s := redact.FromSecrets([]*v1.Secret{{StringData: map[string]string{"pw": "hunter2-value"}}})
	out := Scrubbed(&next, func() *redact.Scrubber { return s })
	batch := []outbox.Message{
		{Topic: "t/reply/a", Payload: []byte(`{"message":"Pod x: env value \"hunter2-value\" is invalid"}`), QoS: 1},
		{Topic: "t/reply/b", Payload: []byte(`{"message":"fine"}`), QoS: 1},
	}
	if err := out.PutBatch(batch); err != nil {
		t.Fatal(err)
	}
	if len(next.msgs) != 2 {
		t.Fatalf("got %d messages", len(next.msgs))
	}
	for _, m := range next.msgs {
		if strings.Contains(string(m.Payload), "hunter2-value") || !json.Valid(m.Payload) {
			t.Fatalf("payload %s", m.Payload)
		}
	}
	if next.msgs[1].Topic != "t/reply/b" || string(next.msgs[1].Payload) != `{"message":"fine"}` {
		t.Fatalf("an innocent message changed: %+v", next.msgs[1])
	}
}
