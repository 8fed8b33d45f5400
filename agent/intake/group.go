package intake

import (
	"context"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/mqlet/mqlet/agent/reply"
	"github.com/mqlet/mqlet/agent/store"
	"github.com/mqlet/mqlet/mqtt/outbox"
)

// Group commits reply records and outbox messages from many writers
// together: the tracker answering 2,000 pod applies, a ConfigMap apply's
// at-once succeeded, a storm of Warning events. Each record or message
// alone costs an fsync; gathered, a flush costs one per file however many
// it holds. Writers do not wait for the disk: Run flushes as soon as
// something is gathered (what comes in meanwhile waits for the next
// flush), and the pipeline calls Flush before acknowledging a command.
// Before Run starts things wait for it; after it stopped, writes go straight
// through.
type Group struct {
	st  BatchStore
	out BatchOutbox
	log zerolog.Logger

	mu      sync.Mutex
	records []record
	msgs    []outbox.Message
	stopped bool
	wake    chan struct{}

	flushing sync.Mutex // one flush at a time, so records and messages keep their order
}

type record struct {
	id    string
	reply []byte
	at    time.Time
}

// NewGroup returns a Group that persists into st and out.
func NewGroup(st BatchStore, out BatchOutbox, log zerolog.Logger) *Group {
	return &Group{st: st, out: out, log: log, wake: make(chan struct{}, 1)}
}

// Publisher is the outbox as seen through the Group.
func (g *Group) Publisher() reply.Publisher { return groupPublisher{g} }

// Recorder is the store's reply records as seen through the Group.
func (g *Group) Recorder() reply.Recorder { return groupRecorder{g} }

// Run flushes whatever is gathered until ctx ends, then flushes once more
// and lets later writes through.
func (g *Group) Run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			g.mu.Lock()
			g.stopped = true
			g.mu.Unlock()
			g.Flush()
			return
		case <-g.wake:
			g.Flush()
		}
	}
}

// Flush persists everything gathered so far: the records in one store
// transaction, then the messages in one outbox transaction.
func (g *Group) Flush() {
	g.flushing.Lock()
	defer g.flushing.Unlock()
	g.mu.Lock()
	records, msgs := g.records, g.msgs
	g.records, g.msgs = nil, nil
	g.mu.Unlock()
	g.write(records, msgs)
}

func (g *Group) write(records []record, msgs []outbox.Message) {
	if len(records) > 0 {
		err := g.st.Batch(func(tx *store.Tx) error {
			for _, r := range records {
				if err := tx.RecordReply(r.id, r.reply, r.at); err != nil {
					g.log.Error().Err(err).Str("requestId", r.id).Msg("recording reply")
				}
			}
			return tx.Failed()
		})
		if err != nil {
			g.log.Error().Err(err).Int("replies", len(records)).Msg("recording replies")
		}
	}
	if len(msgs) > 0 {
		if err := g.out.PutBatch(msgs); err != nil {
			g.log.Error().Err(err).Int("messages", len(msgs)).Msg("queueing messages")
		}
	}
}

// add gathers records and messages, or, once Run has stopped, writes them
// at once.
func (g *Group) add(records []record, msgs []outbox.Message) {
	g.mu.Lock()
	g.records = append(g.records, records...)
	g.msgs = append(g.msgs, msgs...)
	stopped := g.stopped
	g.mu.Unlock()
	if stopped {
		g.Flush() // behind whatever was gathered before, in order
		return
	}
	select {
	case g.wake <- struct{}{}:
	default:
	}
}

type groupPublisher struct{ g *Group }

func (p groupPublisher) Put(m outbox.Message) error {
	p.g.add(nil, []outbox.Message{m})
	return nil
}

// PutBatch keeps a large reply's parts together.
func (p groupPublisher) PutBatch(msgs []outbox.Message) error {
	p.g.add(nil, append([]outbox.Message(nil), msgs...))
	return nil
}

type groupRecorder struct{ g *Group }

func (r groupRecorder) RecordReply(id string, reply []byte, at time.Time) error {
	r.g.add([]record{{id, reply, at}}, nil)
	return nil
}
