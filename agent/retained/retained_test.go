package retained

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/rs/zerolog"

	"github.com/mqlet/mqlet/mqtt/outbox"
)

// queue is the outbox: what was queued, in order.
type queue struct {
	mu   sync.Mutex
	msgs []outbox.Message
}

func (q *queue) Put(m outbox.Message) error { return q.PutBatch([]outbox.Message{m}) }
func (q *queue) PutBatch(msgs []outbox.Message) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.msgs = append(q.msgs, msgs...)
	return nil
}

func (q *queue) take() []outbox.Message {
	q.mu.Lock()
	defer q.mu.Unlock()
	m := q.msgs
	q.msgs = nil
	return m
}

// conn is a connection whose broker acknowledges at once (or refuses).
type conn struct {
	sent []outbox.Message
	err  error
}

type done struct{ err error }

func (d done) Done() <-chan struct{} { c := make(chan struct{}); close(c); return c }
func (d done) Err() error            { return d.err }

func (c *conn) Send(_ context.Context, m outbox.Message) (outbox.Delivery, error) {
	c.sent = append(c.sent, m)
	return done{c.err}, nil
}

type ledger map[string][]byte

func (l ledger) Meta(key string) ([]byte, bool, error) { v, ok := l[key]; return v, ok, nil }
func (l ledger) SetMeta(key string, v []byte) error    { l[key] = v; return nil }

func topics(msgs []outbox.Message) []string {
	var out []string
	for _, m := range msgs {
		if !m.Retained || m.QoS != 1 || !m.Coalesce {
			out = append(out, "NOT RETAINED "+m.Topic)
			continue
		}
		if len(m.Payload) == 0 {
			out = append(out, "clear "+m.Topic)
		} else {
			out = append(out, m.Topic+"="+string(m.Payload))
		}
	}
	return out
}

func equal(t *testing.T, what string, got []string, want ...string) {
	t.Helper()
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("%s:\n got %q\nwant %q", what, got, want)
	}
}

var birth = Message("n/state", []byte("online"))

func TestEveryConnectRepublishesEverythingRetained(t *testing.T) {
	q, l := &queue{}, ledger{}
	r, err := New(q, l, []string{"tcp://a:1", "tcp://b:2"}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	_ = r.Set("n/node", []byte("node1"))
	_ = r.Set("n/pods/default/web", []byte("running"))
	_ = r.Set("n/pods/default/old", []byte("running"))
	_ = r.Clear("n/pods/default/old")
	_ = r.Set("n/node", []byte("node2"))
	equal(t, "queued as set", topics(q.take()), "n/node=node1", "n/pods/default/web=running", "n/pods/default/old=running", "clear n/pods/default/old", "n/node=node2")

	// Broker a: the state first, then the tombstone owed, acknowledged on
	// the connection; the values go through the outbox, behind it.
	a := &conn{}
	if err := r.Republish(context.Background(), "tcp://a:1", a, birth); err != nil {
		t.Fatal(err)
	}
	equal(t, "published on connect to a", topics(a.sent), "n/state=online", "clear n/pods/default/old")
	equal(t, "queued on connect to a", topics(q.take()), "n/node=node2", "n/pods/default/web=running")

	// Again on a: the tombstone is no longer owed to it.
	a = &conn{}
	_ = r.Republish(context.Background(), "tcp://a:1", a, birth)
	equal(t, "published on reconnect to a", topics(a.sent), "n/state=online")
	equal(t, "queued on reconnect to a", topics(q.take()), "n/node=node2", "n/pods/default/web=running")

	// b is still owed it, also after a restart (the ledger).
	r2, err := New(q, l, []string{"tcp://a:1", "tcp://b:2"}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	b := &conn{}
	_ = r2.Republish(context.Background(), "tcp://b:2", b, birth)
	equal(t, "published on connect to b after a restart", topics(b.sent), "n/state=online", "clear n/pods/default/old")
	if s := r2.Stats(); s.Tombstones != 0 {
		t.Fatalf("tombstones owed after both brokers acknowledged: %d", s.Tombstones)
	}
}

func TestARefusedTombstoneStaysOwed(t *testing.T) {
	r, _ := New(&queue{}, nil, []string{"tcp://a:1"}, zerolog.Nop())
	_ = r.Clear("n/pods/default/old")
	bad := &conn{err: errors.New("not authorized")}
	if err := r.Republish(context.Background(), "tcp://a:1", bad, birth); err == nil {
		t.Fatal("a refused birth did not fail the connect")
	}
	good := &conn{}
	_ = r.Republish(context.Background(), "tcp://a:1", good, birth)
	equal(t, "the tombstone is published on the next connect", topics(good.sent), "n/state=online", "clear n/pods/default/old")
}

func TestASetCancelsTheTombstone(t *testing.T) {
	r, _ := New(&queue{}, ledger{}, []string{"tcp://a:1"}, zerolog.Nop())
	_ = r.Clear("n/pods/default/web")
	_ = r.Set("n/pods/default/web", []byte("pending"))
	c := &conn{}
	_ = r.Republish(context.Background(), "tcp://a:1", c, birth)
	equal(t, "published", topics(c.sent), "n/state=online")
	if v := string(r.Value("n/pods/default/web")); v != "pending" {
		t.Fatalf("value %q", v)
	}
}

func TestTombstonesAreBoundedAndForgetBrokersNoLongerConfigured(t *testing.T) {
	r, _ := New(&queue{}, nil, []string{"tcp://a:1", "tcp://gone:9"}, zerolog.Nop())
	for i := range MaxTombstones + 5 {
		_ = r.Clear(fmt.Sprintf("n/pods/default/p%04d", i))
	}
	if s := r.Stats(); s.Tombstones != MaxTombstones {
		t.Fatalf("tombstones kept: %d, want %d", s.Tombstones, MaxTombstones)
	}
	c := &conn{}
	_ = r.Republish(context.Background(), "tcp://a:1", c, birth)
	if len(c.sent) != 1+MaxTombstones || c.sent[1].Topic != "n/pods/default/p0005" {
		t.Fatalf("published %d, first tombstone %s: the oldest are not the ones forgotten", len(c.sent), c.sent[1].Topic)
	}
	// Only tcp://gone:9 is owed them, and it is no longer configured.
	l := ledger{}
	r1, _ := New(&queue{}, l, []string{"tcp://a:1", "tcp://gone:9"}, zerolog.Nop())
	_ = r1.Clear("n/pods/default/old")
	_ = r1.Republish(context.Background(), "tcp://a:1", &conn{}, birth)
	r2, _ := New(&queue{}, l, []string{"tcp://a:1"}, zerolog.Nop())
	if s := r2.Stats(); s.Tombstones != 0 {
		t.Fatalf("tombstones owed to a broker no longer configured: %d", s.Tombstones)
	}
}
