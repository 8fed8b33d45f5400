package intake

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/rs/zerolog"
	v1 "k8s.io/api/core/v1"

	"github.com/mqlet/mqlet/agent/pending"
	"github.com/mqlet/mqlet/agent/reply"
	"github.com/mqlet/mqlet/agent/store"
	"github.com/mqlet/mqlet/mqtt/outbox"
)

// Command is one message from the command topics, as the MQTT session
// hands it over.
type Command struct {
	Topic     string
	Payload   []byte
	Retained  bool
	Duplicate bool
	// Ack acknowledges the message to the broker; the pipeline calls it once
	// the command's effect and first replies are persisted. nil: nothing to do.
	Ack func()
}

func (c Command) ack() {
	if c.Ack != nil {
		c.Ack()
	}
}

// BatchStore writes many commands' changes in one transaction.
type BatchStore interface {
	Batch(fn func(tx *store.Tx) error) error
}

// BatchOutbox queues many messages in one transaction.
type BatchOutbox interface {
	PutBatch(msgs []outbox.Message) error
}

// Defaults of PipelineOptions.
const (
	DefaultMaxBacklog = 1000
	DefaultMaxBatch   = 256
)

// PipelineOptions bound the pipeline.
type PipelineOptions struct {
	// MaxBacklog is how many commands may wait; one more is answered
	// "overloaded" at once instead of waiting behind them.
	MaxBacklog int
	// MaxBatch is the most commands persisted in one transaction.
	MaxBatch int
}

// Pipeline is the intake under bursts. The session's handler only queues
// (Submit); one committer (Run) takes everything queued, handles each
// command in order against one store transaction, commits it with one
// fsync, queues all their replies in one outbox transaction, and only then
// acknowledges each message, so the QoS 1 ack still follows persistence.
type Pipeline struct {
	in     *Intake
	st     BatchStore
	out    BatchOutbox
	sender *reply.Sender
	opts   PipelineOptions
	log    zerolog.Logger

	mu      sync.Mutex
	queue   []Command
	stopped bool
	wake    chan struct{}
}

// NewPipeline returns a pipeline in front of in. st and out are the store
// and outbox in uses; sender is its reply sender (its bounds are kept in
// batches).
func NewPipeline(in *Intake, st BatchStore, out BatchOutbox, sender *reply.Sender, opts PipelineOptions, log zerolog.Logger) *Pipeline {
	if opts.MaxBacklog <= 0 {
		opts.MaxBacklog = DefaultMaxBacklog
	}
	if opts.MaxBatch <= 0 {
		opts.MaxBatch = DefaultMaxBatch
	}
	return &Pipeline{in: in, st: st, out: out, sender: sender, opts: opts, log: log, wake: make(chan struct{}, 1)}
}

// Submit queues c for the committer; it never waits for disk. Beyond the
// backlog bound c is answered "overloaded" (not recorded, so a retry of the
// same request id runs) and acknowledged. After Run has stopped c is left
// unacknowledged: the broker delivers it again to the next session.
func (p *Pipeline) Submit(c Command) {
	p.mu.Lock()
	if p.stopped {
		p.mu.Unlock()
		p.log.Debug().Str("topic", c.Topic).Msg("command after the intake stopped; left for redelivery")
		return
	}
	waiting := len(p.queue)
	if waiting >= p.opts.MaxBacklog {
		p.mu.Unlock()
		p.overloaded(c, waiting)
		return
	}
	p.queue = append(p.queue, c)
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// Waiting is how many commands are queued.
func (p *Pipeline) Waiting() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.queue)
}

func (p *Pipeline) overloaded(c Command, waiting int) {
	verb, id, err := p.in.opts.Topics.ParseCommand(c.Topic)
	if id == "" || err != nil {
		id = DeriveRequestID(c.Topic, c.Payload)
	}
	p.in.received.Add(1)
	p.in.rejected.Add(1)
	msg := fmt.Sprintf("overloaded: %d commands waiting; retry later", waiting)
	p.log.Warn().Str("requestId", id).Str("verb", verb).Int("waiting", waiting).Msg("command refused: overloaded")
	if err := p.sender.SendUnrecorded(reply.Reply{RequestID: id, Verb: verb, Phase: reply.Failed, Message: msg}); err != nil {
		// Not acknowledged: the broker will deliver it again.
		return
	}
	c.ack()
}

// Run commits queued commands until ctx ends, then handles what is still
// queued (the store must stay open until Run returns) and returns.
func (p *Pipeline) Run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			p.mu.Lock()
			p.stopped = true
			rest := p.queue
			p.queue = nil
			p.mu.Unlock()
			for len(rest) > 0 {
				n := min(len(rest), p.opts.MaxBatch)
				p.commit(rest[:n])
				rest = rest[n:]
			}
			return
		case <-p.wake:
		}
		for {
			p.mu.Lock()
			n := min(len(p.queue), p.opts.MaxBatch)
			batch := p.queue[:n:n]
			p.queue = p.queue[n:]
			if len(p.queue) == 0 {
				p.queue = nil // let the backing array go
			}
			p.mu.Unlock()
			if n == 0 {
				break
			}
			p.commit(batch)
		}
	}
}

// commit handles batch in order in one store transaction, then queues the
// replies, then applies the effects on workers, tracker and events, then
// acknowledges. When any store write fails the transaction is dropped and
// every command is handled again on its own, so one bad command cannot
// leave part of itself stored nor take the others down with it.
func (p *Pipeline) commit(batch []Command) {
	buf := &replyBuffer{}
	fx := &effects{}
	var sub *Intake
	start := time.Now()
	err := p.st.Batch(func(tx *store.Tx) error {
		buf.msgs, fx.calls = nil, nil
		sub = New(p.in.opts, tx, p.sender.With(buf, tx), fx, fx, fx, p.in.status, p.in.log)
		sub.now = p.in.now
		for _, c := range batch {
			// One call per command, in order, inside the transaction: the
			// place for per-command steps such as an in-flight mark.
			sub.Handle(c.Topic, c.Payload)
		}
		return tx.Failed()
	})
	if err != nil {
		p.log.Warn().Err(err).Int("commands", len(batch)).Msg("batch not committed; handling its commands one by one")
		for _, c := range batch {
			p.in.Handle(c.Topic, c.Payload)
			c.ack()
		}
		return
	}
	if err := p.out.PutBatch(buf.msgs); err != nil {
		// Refused replies are counted by the outbox; the commands are
		// stored and recorded, so a redelivery is answered from the record.
		p.log.Error().Err(err).Int("replies", len(buf.msgs)).Msg("queueing replies of a batch")
	}
	received, rejected := sub.Stats()
	p.in.received.Add(received)
	p.in.rejected.Add(rejected)
	fx.replay(p.in)
	for _, c := range batch {
		c.ack()
	}
	p.log.Debug().Int("commands", len(batch)).Int("replies", len(buf.msgs)).Dur("took", time.Since(start)).Msg("batch committed")
}

// replyBuffer holds a batch's replies until the store has committed.
type replyBuffer struct{ msgs []outbox.Message }

func (b *replyBuffer) Put(m outbox.Message) error { b.msgs = append(b.msgs, m); return nil }

func (b *replyBuffer) PutBatch(msgs []outbox.Message) error {
	b.msgs = append(b.msgs, msgs...)
	return nil
}

// effects records, in order, what a batch's commands ask of the tracker,
// the workers and the event recorder; they run once the batch is durable,
// so nothing acts on a change that could still be undone.
type effects struct{ calls []func(in *Intake) }

func (f *effects) Add(id, verb string, want map[string]pending.Want, deadline time.Time) {
	f.calls = append(f.calls, func(in *Intake) { in.tracker.Add(id, verb, want, deadline) })
}

func (f *effects) Enqueue(key string) {
	f.calls = append(f.calls, func(in *Intake) { in.pods.Enqueue(key) })
}

func (f *effects) EnqueueDelete(key string, grace *int64) {
	f.calls = append(f.calls, func(in *Intake) { in.pods.EnqueueDelete(key, grace) })
}

func (f *effects) Event(pod *v1.Pod, eventType, reason, message string) {
	f.calls = append(f.calls, func(in *Intake) { in.events.Event(pod, eventType, reason, message) })
}

func (f *effects) ObjectEvent(ref v1.ObjectReference, eventType, reason, message string) {
	f.calls = append(f.calls, func(in *Intake) { in.events.ObjectEvent(ref, eventType, reason, message) })
}

func (f *effects) replay(in *Intake) {
	for _, c := range f.calls {
		c(in)
	}
}
