package intake

import (
	"context"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/mqlet/mqlet/agent/reply"
	"github.com/mqlet/mqlet/agent/store"
	apiv1 "github.com/mqlet/mqlet/api/v1"
	"github.com/mqlet/mqlet/internal/faultpoint"
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
	msgs    []queued
	stopped bool
	wake    chan struct{}

	flushing sync.Mutex // one flush at a time, so records and messages keep their order
	// landed are the pending entries (request id -> entry sequence) whose
	// final reply is in the outbox; the next store transaction drops them.
	// Guarded by flushing.
	landed map[string]uint64
	// deadlines are the pending entries' deadlines the tracker moved,
	// written with the next records. Guarded by mu.
	deadlines map[string]time.Time
}

// queued is one message gathered; final names the request whose final
// reply it is, when the tracker sent it (see Finals).
type queued struct {
	msg   outbox.Message
	final string
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
	records, msgs, deadlines := g.records, g.msgs, g.deadlines
	g.records, g.msgs, g.deadlines = nil, nil, nil
	g.mu.Unlock()
	g.write(records, msgs, deadlines)
}

// write persists one flush. A final reply of the tracker is first kept in
// its request's pending entry, in the store transaction that records it,
// then queued in the outbox under the entry's once-key; the entry is
// dropped by the next store transaction. A kill at any point between
// leaves either an undecided entry (the request is followed again at the
// next start) or a decided one (its reply is queued again, and the outbox
// stores it at most once): exactly one final reply either way.
func (g *Group) write(records []record, msgs []queued, deadlines map[string]time.Time) {
	decided := map[int]store.PendingReply{} // index in msgs -> its entry
	if len(records) > 0 || len(deadlines) > 0 {
		err := g.st.Batch(func(tx *store.Tx) error {
			clear(decided)
			for _, r := range records {
				if err := tx.RecordReply(r.id, r.reply, r.at); err != nil {
					g.log.Error().Err(err).Str("requestId", r.id).Msg("recording reply")
				}
			}
			for i, q := range msgs {
				if q.final == "" {
					continue
				}
				p, found, err := tx.DecidePending(q.final, q.msg.Topic, q.msg.Payload)
				if err != nil {
					g.log.Error().Err(err).Str("requestId", q.final).Msg("keeping a final reply with its pending entry")
				} else if found {
					decided[i] = p
				}
			}
			for id, d := range deadlines {
				if err := tx.KeepPendingDeadline(id, d); err != nil {
					g.log.Error().Err(err).Str("requestId", id).Msg("keeping a moved deadline")
				}
			}
			if len(g.landed) > 0 {
				if err := tx.DropPending(g.landed); err != nil {
					g.log.Error().Err(err).Msg("dropping answered pending replies")
				}
			}
			return tx.Failed()
		})
		if err != nil {
			clear(decided)
			g.log.Error().Err(err).Int("replies", len(records)).Msg("recording replies")
		} else {
			g.landed = nil
		}
	}
	if len(msgs) == 0 {
		return
	}
	out := make([]outbox.Message, len(msgs))
	for i, q := range msgs {
		out[i] = q.msg
		if p, ok := decided[i]; ok {
			out[i].Once = p.OnceKey()
		}
	}
	// A kill here leaves decided entries: their replies are queued at the
	// next start (RestorePending).
	if len(decided) > 0 {
		faultpoint.Hit("replies.before-final-queued")
	}
	if err := g.out.PutBatch(out); err != nil {
		// Some may not be stored (a full outbox): the entries stay decided
		// and are queued again at the next start.
		g.log.Error().Err(err).Int("messages", len(msgs)).Msg("queueing messages")
		return
	}
	if len(decided) > 0 {
		// A kill here leaves decided entries whose replies are queued: the
		// next start puts them again, which the outbox ignores.
		faultpoint.Hit("replies.after-final-queued")
		if g.landed == nil {
			g.landed = map[string]uint64{}
		}
		for _, p := range decided {
			g.landed[p.RequestID] = p.Seq
		}
	}
}

// add gathers records and messages, or, once Run has stopped, writes them
// at once.
func (g *Group) add(records []record, msgs []queued) {
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
	p.g.add(nil, []queued{{msg: m}})
	return nil
}

// PutBatch keeps a large reply's parts together.
func (p groupPublisher) PutBatch(msgs []outbox.Message) error {
	p.g.add(nil, wrap(msgs, ""))
	return nil
}

func wrap(msgs []outbox.Message, final string) []queued {
	out := make([]queued, len(msgs))
	for i, m := range msgs {
		out[i] = queued{msg: m}
	}
	if final != "" && len(out) > 0 {
		out[len(out)-1].final = final // the reply itself comes after its parts
	}
	return out
}

type groupRecorder struct{ g *Group }

func (r groupRecorder) RecordReply(id string, reply []byte, at time.Time) error {
	r.g.add([]record{{id, reply, at}}, nil)
	return nil
}

// Finals returns the sender for the tracker (agent/pending): its final
// replies (succeeded, failed) are gathered as the final replies of their
// requests' pending entries (see write); every other reply goes out as
// through s with the Group's publisher and recorder.
func (g *Group) Finals(s *reply.Sender) *FinalSender {
	return &FinalSender{g: g, s: s, plain: s.With(g.Publisher(), g.Recorder())}
}

// FinalSender is the tracker's sender (Group.Finals).
type FinalSender struct {
	g     *Group
	s     *reply.Sender
	plain *reply.Sender
}

// Send records and queues r through the Group.
func (f *FinalSender) Send(r apiv1.Reply) error {
	if r.Phase != apiv1.Succeeded && r.Phase != apiv1.Failed {
		return f.plain.Send(r)
	}
	c := &collector{}
	err := f.s.With(c, c).Send(r)
	f.g.add(c.records, wrap(c.msgs, r.RequestID))
	return err
}

// KeepDeadline has the deadline the tracker moved for requestID written
// to its pending entry with the next flush (before the in_progress reply
// that says so is queued).
func (f *FinalSender) KeepDeadline(requestID string, deadline time.Time) {
	f.g.mu.Lock()
	if f.g.deadlines == nil {
		f.g.deadlines = map[string]time.Time{}
	}
	f.g.deadlines[requestID] = deadline
	f.g.mu.Unlock()
}

// collector holds what one Send records and publishes, so the Group
// gathers it as one unit.
type collector struct {
	records []record
	msgs    []outbox.Message
}

func (c *collector) Put(m outbox.Message) error { c.msgs = append(c.msgs, m); return nil }

func (c *collector) PutBatch(msgs []outbox.Message) error {
	c.msgs = append(c.msgs, msgs...)
	return nil
}

func (c *collector) RecordReply(id string, reply []byte, at time.Time) error {
	c.records = append(c.records, record{id, reply, at})
	return nil
}
