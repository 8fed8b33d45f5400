package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
)

// msg is one MQTT message as the bench client saw it.
type msg struct {
	Topic    string
	Payload  []byte
	Retained bool
	At       time.Time
}

// recorder is an operator's MQTT connection that keeps every message on the
// topics it subscribed to, in arrival order, so steps can wait on them.
type recorder struct {
	c paho.Client

	mu      sync.Mutex
	msgs    []msg
	changed chan struct{}
	lostErr error
}

func connect(ctx context.Context, broker, clientID string) (*recorder, error) {
	r := &recorder{changed: make(chan struct{})}
	opts := paho.NewClientOptions().AddBroker(broker).SetClientID(clientID).
		SetCleanSession(true).SetAutoReconnect(false).SetOrderMatters(true).
		SetConnectTimeout(10 * time.Second).SetWriteTimeout(10 * time.Second)
	opts.SetDefaultPublishHandler(r.record)
	opts.SetConnectionLostHandler(func(_ paho.Client, err error) {
		r.mu.Lock()
		r.lostErr = err
		r.wake()
		r.mu.Unlock()
	})
	r.c = paho.NewClient(opts)
	if err := waitToken(ctx, r.c.Connect()); err != nil {
		return nil, fmt.Errorf("connect to %s: %w", broker, err)
	}
	return r, nil
}

func (r *recorder) close() { r.c.Disconnect(200) }

// wake tells waiters something changed; r.mu must be held.
func (r *recorder) wake() {
	close(r.changed)
	r.changed = make(chan struct{})
}

func (r *recorder) record(_ paho.Client, m paho.Message) {
	at := time.Now()
	r.mu.Lock()
	r.msgs = append(r.msgs, msg{Topic: m.Topic(), Payload: append([]byte(nil), m.Payload()...), Retained: m.Retained(), At: at})
	r.wake()
	r.mu.Unlock()
}

func (r *recorder) subscribe(ctx context.Context, filter string) error {
	if err := waitToken(ctx, r.c.Subscribe(filter, 1, r.record)); err != nil {
		return fmt.Errorf("subscribe to %s: %w", filter, err)
	}
	return nil
}

// publish sends at QoS 1 and waits for the PUBACK.
func (r *recorder) publish(ctx context.Context, topic string, payload []byte) error {
	if err := waitToken(ctx, r.c.Publish(topic, 1, false, payload)); err != nil {
		return fmt.Errorf("publish to %s: %w", topic, err)
	}
	return nil
}

// publishAsync sends at QoS 1 without waiting; the token says when it was acknowledged.
func (r *recorder) publishAsync(topic string, payload []byte) paho.Token {
	return r.c.Publish(topic, 1, false, payload)
}

// mark is the position after the last recorded message.
func (r *recorder) mark() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.msgs)
}

// since returns a copy of the messages recorded at or after index from.
func (r *recorder) since(from int) []msg {
	r.mu.Lock()
	defer r.mu.Unlock()
	if from > len(r.msgs) {
		return nil
	}
	return append([]msg(nil), r.msgs[from:]...)
}

// scan feeds every message recorded at or after from, in order and each
// once, to visit until visit reports done, the context ends or the
// connection is lost.
func (r *recorder) scan(ctx context.Context, from int, what string, visit func(msg) (done bool, err error)) error {
	next := from
	for {
		r.mu.Lock()
		batch := append([]msg(nil), r.msgs[min(next, len(r.msgs)):]...)
		next += len(batch)
		changed, lost := r.changed, r.lostErr
		r.mu.Unlock()
		for _, m := range batch {
			done, err := visit(m)
			if err != nil {
				return fmt.Errorf("waiting for %s: %w", what, err)
			}
			if done {
				return nil
			}
		}
		if lost != nil {
			return fmt.Errorf("waiting for %s: connection to the broker lost: %w", what, lost)
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w", what, context.Cause(ctx))
		}
	}
}

func waitToken(ctx context.Context, tok paho.Token) error {
	select {
	case <-tok.Done():
		return tok.Error()
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// replyMsg is the part of a reply the bench reads.
type replyMsg struct {
	RequestID string   `json:"requestId"`
	Phase     string   `json:"phase"`
	Message   string   `json:"message"`
	Errors    []string `json:"errors"`
}

// topics builds the contract's topic names for one node.
type topics struct{ prefix, node string }

func (t topics) cmd(verb, id string) string {
	return t.prefix + "/" + t.node + "/cmd/" + verb + "/" + id
}
func (t topics) all() string   { return t.prefix + "/" + t.node + "/#" }
func (t topics) state() string { return t.prefix + "/" + t.node + "/state" }
func (t topics) pod(ns, name string) string {
	return t.prefix + "/" + t.node + "/pods/" + ns + "/" + name
}
func (t topics) replyPrefix() string { return t.prefix + "/" + t.node + "/reply/" }

// parseReply decodes m when it is a reply of this node.
func (t topics) parseReply(m msg) (replyMsg, bool) {
	if !strings.HasPrefix(m.Topic, t.replyPrefix()) {
		return replyMsg{}, false
	}
	var r replyMsg
	if json.Unmarshal(m.Payload, &r) != nil {
		return replyMsg{}, false
	}
	if r.RequestID == "" {
		r.RequestID = strings.TrimPrefix(m.Topic, t.replyPrefix())
	}
	return r, true
}

// finalReplies waits until every id in ids has a final reply recorded at
// or after from, and returns when each succeeded; a failed reply is an error.
func (r *recorder) finalReplies(ctx context.Context, t topics, from int, ids []string) (map[string]time.Time, error) {
	want := make(map[string]bool, len(ids))
	for _, id := range ids {
		want[id] = true
	}
	done := make(map[string]time.Time, len(ids))
	err := r.scan(ctx, from, fmt.Sprintf("%d succeeded replies", len(ids)), func(m msg) (bool, error) {
		rep, ok := t.parseReply(m)
		if !ok || !want[rep.RequestID] {
			return false, nil
		}
		switch rep.Phase {
		case "succeeded":
			if _, seen := done[rep.RequestID]; !seen {
				done[rep.RequestID] = m.At
			}
		case "failed":
			return false, fmt.Errorf("request %s failed: %s %v", rep.RequestID, rep.Message, rep.Errors)
		}
		return len(done) == len(want), nil
	})
	if err != nil {
		return done, fmt.Errorf("%w (%d of %d succeeded)", err, len(done), len(ids))
	}
	return done, nil
}
