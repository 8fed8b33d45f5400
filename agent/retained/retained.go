// Package retained owns the node's retained topics: the one rule by which
// each is published, the latest value of each, and the tombstones (empty
// retained payloads) still owed to a broker, so that every connect, to the
// same broker or another, republishes all of it.
//
// The topics are the node's state (the presence's birth and will), its
// v1.Node, one status per pod, and the tombstone of each pod gone.
package retained

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sort"
	"sync"

	"github.com/rs/zerolog"

	"github.com/mqlet/mqlet/mqtt/outbox"
)

// Message is the rule of every retained topic of the node: QoS 1 (the
// broker acknowledges it), retained (a subscriber that comes later gets the
// last value) and coalesced in the outbox (offline, only the latest value of
// a topic waits). An empty payload is a tombstone: it clears the topic.
func Message(topic string, payload []byte) outbox.Message {
	return outbox.Message{Topic: topic, Payload: payload, QoS: 1, Retained: true, Coalesce: true}
}

// Publisher queues messages for the broker (the outbox).
type Publisher interface {
	Put(m outbox.Message) error
	PutBatch(msgs []outbox.Message) error
}

// Sender publishes on the connection being set up (the MQTT session);
// Delivery reports the broker's acknowledgement.
type Sender interface {
	Send(ctx context.Context, m outbox.Message) (outbox.Delivery, error)
}

// Ledger persists the tombstones still owed across restarts.
type Ledger interface {
	Meta(key string) ([]byte, bool, error)
	SetMeta(key string, value []byte) error
}

const ledgerKey = "retained/tombstones"

// MaxTombstones bounds the tombstones kept; beyond it the oldest is
// forgotten (a broker away that long keeps that pod's last status).
const MaxTombstones = 1024

// tomb is a cleared topic and the brokers that have not acknowledged its
// tombstone yet.
type tomb struct {
	Owed []string `json:"owed"`
	Seq  uint64   `json:"seq"` // order of clearing, for the bound
}

// Registry holds the latest value of every retained topic the node set and
// the tombstones it still owes. Safe for concurrent use.
type Registry struct {
	out     Publisher
	ledger  Ledger
	brokers []string
	log     zerolog.Logger

	// mu is held across each queueing, so the outbox receives the values
	// of a topic in the order the registry took them.
	mu     sync.Mutex
	values map[string][]byte
	tombs  map[string]tomb
	seq    uint64
}

// New returns a registry queueing into out. brokers are the identities of
// the configured brokers (each gets every tombstone); ledger (may be nil)
// keeps the tombstones owed across restarts: those read from it that name
// no configured broker any more are forgotten.
func New(out Publisher, ledger Ledger, brokers []string, log zerolog.Logger) (*Registry, error) {
	r := &Registry{out: out, ledger: ledger, brokers: slices.Clone(brokers), log: log, values: map[string][]byte{}, tombs: map[string]tomb{}}
	if ledger == nil {
		return r, nil
	}
	raw, ok, err := ledger.Meta(ledgerKey)
	if err != nil {
		return nil, fmt.Errorf("reading the tombstones owed: %w", err)
	}
	if !ok {
		return r, nil
	}
	var kept map[string]tomb
	if err := json.Unmarshal(raw, &kept); err != nil {
		// Losing them leaves at worst a stale status on a broker: not a
		// reason to refuse to start.
		log.Warn().Err(err).Msg("the tombstones owed are unreadable; forgetting them")
		return r, nil
	}
	for topic, t := range kept {
		t.Owed = slices.DeleteFunc(t.Owed, func(b string) bool { return !slices.Contains(r.brokers, b) })
		if len(t.Owed) > 0 {
			r.tombs[topic] = t
			r.seq = max(r.seq, t.Seq)
		}
	}
	return r, nil
}

// Set records payload as the topic's value and queues it. An empty payload
// is Clear.
func (r *Registry) Set(topic string, payload []byte) error {
	if len(payload) == 0 {
		return r.Clear(topic)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.values[topic] = payload
	if _, ok := r.tombs[topic]; ok {
		delete(r.tombs, topic)
		r.persistLocked()
	}
	if err := r.out.Put(Message(topic, payload)); err != nil {
		return fmt.Errorf("queueing retained %s: %w", topic, err)
	}
	return nil
}

// Clear forgets the topic's value and queues its tombstone, which every
// configured broker is owed until it acknowledged one on a later connect.
func (r *Registry) Clear(topic string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.values, topic)
	r.seq++
	r.tombs[topic] = tomb{Owed: slices.Clone(r.brokers), Seq: r.seq}
	r.boundLocked()
	r.persistLocked()
	if err := r.out.Put(Message(topic, nil)); err != nil {
		return fmt.Errorf("queueing the tombstone of %s: %w", topic, err)
	}
	return nil
}

// Value returns the topic's value, nil when it has none.
func (r *Registry) Value(topic string) []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.values[topic]
}

// Stats are the registry's figures.
type Stats struct {
	Topics     int   // topics with a value
	Bytes      int64 // their topic and payload bytes
	Tombstones int   // tombstones still owed to some broker
}

// Stats returns the registry's figures.
func (r *Registry) Stats() Stats {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := Stats{Topics: len(r.values), Tombstones: len(r.tombs)}
	for t, v := range r.values {
		s.Bytes += int64(len(t) + len(v))
	}
	return s
}

// Republish is run on every connect, once the connection to broker is
// subscribed and before anything else is published on it: birth (the
// node's state) is published and acknowledged first, then every tombstone
// owed to broker (acknowledged, then no longer owed to it), then every
// value is queued in the outbox, which sends it once the connection is up
// (after what it held already; a newer value queued meanwhile replaces it).
// So a subscriber on a fresh or different broker sees the node's whole
// retained state within one connect.
func (r *Registry) Republish(ctx context.Context, broker string, send Sender, birth outbox.Message) error {
	if err := wait(ctx, send, []outbox.Message{birth}); err != nil {
		return fmt.Errorf("publishing the node's state: %w", err)
	}
	r.mu.Lock()
	owed := map[string]uint64{}
	for topic, t := range r.tombs {
		if slices.Contains(t.Owed, broker) {
			owed[topic] = t.Seq
		}
	}
	r.mu.Unlock()
	if len(owed) > 0 {
		topics := slices.Sorted(maps.Keys(owed))
		msgs := make([]outbox.Message, len(topics))
		for i, topic := range topics {
			msgs[i] = Message(topic, nil)
		}
		if err := wait(ctx, send, msgs); err != nil {
			return fmt.Errorf("publishing %d tombstones owed: %w", len(msgs), err)
		}
		r.mu.Lock()
		for topic, seq := range owed {
			t, ok := r.tombs[topic]
			if !ok || t.Seq != seq {
				continue // set or cleared again meanwhile
			}
			t.Owed = slices.DeleteFunc(t.Owed, func(b string) bool { return b == broker })
			if len(t.Owed) == 0 {
				delete(r.tombs, topic)
			} else {
				r.tombs[topic] = t
			}
		}
		r.persistLocked()
		r.mu.Unlock()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.values) == 0 {
		return nil
	}
	topics := slices.Sorted(maps.Keys(r.values))
	msgs := make([]outbox.Message, len(topics))
	for i, topic := range topics {
		msgs[i] = Message(topic, r.values[topic])
	}
	// A value the outbox refuses (full of final replies) is not a reason to
	// drop the connection: it goes with the topic's next change or resync.
	if err := r.out.PutBatch(msgs); err != nil {
		r.log.Warn().Err(err).Int("topics", len(msgs)).Msg("queueing the retained state for this connection")
	}
	return nil
}

// wait sends msgs in order on the connection and waits for every
// acknowledgement.
func wait(ctx context.Context, send Sender, msgs []outbox.Message) error {
	deliveries := make([]outbox.Delivery, 0, len(msgs))
	for _, m := range msgs {
		d, err := send.Send(ctx, m)
		if err != nil {
			return err
		}
		deliveries = append(deliveries, d)
	}
	for _, d := range deliveries {
		select {
		case <-d.Done():
			if err := d.Err(); err != nil {
				return err
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// boundLocked forgets the oldest tombstones beyond MaxTombstones.
func (r *Registry) boundLocked() {
	extra := len(r.tombs) - MaxTombstones
	if extra <= 0 {
		return
	}
	topics := slices.Collect(maps.Keys(r.tombs))
	sort.Slice(topics, func(i, j int) bool { return r.tombs[topics[i]].Seq < r.tombs[topics[j]].Seq })
	for _, topic := range topics[:extra] {
		delete(r.tombs, topic)
	}
	r.log.Warn().Int("forgotten", extra).Int("kept", MaxTombstones).Msg("too many tombstones owed to brokers not seen since; forgetting the oldest")
}

func (r *Registry) persistLocked() {
	if r.ledger == nil {
		return
	}
	raw, err := json.Marshal(r.tombs)
	if err == nil {
		err = r.ledger.SetMeta(ledgerKey, raw)
	}
	if err != nil {
		r.log.Warn().Err(err).Msg("recording the tombstones owed")
	}
}
