package intake

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/rs/zerolog"
	v1 "k8s.io/api/core/v1"

	"github.com/mqlet/mqlet/agent/pending"
	"github.com/mqlet/mqlet/agent/reply"
	"github.com/mqlet/mqlet/agent/store"
	apiv1 "github.com/mqlet/mqlet/api/v1"
	"github.com/mqlet/mqlet/internal/faultpoint"
	"github.com/mqlet/mqlet/mqtt/outbox"
	"github.com/mqlet/mqlet/signing"
)

// Command is one message from the command topics, as the MQTT session
// hands it over.
type Command struct {
	Topic   string
	Payload []byte
	// Retained is the broker's retain flag: the message is a replay of a
	// retained command, which every (re)subscription would run again.
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
	DefaultMaxBacklog      = 5000
	DefaultMaxBacklogBytes = 32 << 20
	DefaultMaxBatch        = 256
)

// PipelineOptions bound the pipeline.
type PipelineOptions struct {
	// MaxBacklog is how many commands may wait; one more is answered
	// "overloaded" at once instead of waiting behind them.
	MaxBacklog int
	// MaxBacklogBytes bounds the payload bytes waiting the same way, so a
	// backlog of large commands cannot exhaust the gateway's memory.
	MaxBacklogBytes int
	// MaxBatch is the most commands persisted in one transaction.
	MaxBatch int
	// Group, when set, is the one gathering the replies and events of the
	// intake's dependencies (reply sender, tracker, event recorder): it is
	// flushed before a command is acknowledged.
	Group *Group
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
	bytes   int       // payload bytes in queue
	refused []refusal // answered before the next batch
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
	if opts.MaxBacklogBytes <= 0 {
		opts.MaxBacklogBytes = DefaultMaxBacklogBytes
	}
	if opts.MaxBatch <= 0 {
		opts.MaxBatch = DefaultMaxBatch
	}
	return &Pipeline{in: in, st: st, out: out, sender: sender, opts: opts, log: log, wake: make(chan struct{}, 1)}
}

// Submit queues c for the committer; it never waits for disk. Beyond the
// backlog bound c is refused: answered "overloaded" (not recorded, so a
// retry of the same request id runs) ahead of the waiting commands, and
// acknowledged. After Run has stopped c is left unacknowledged: the broker
// delivers it again to the next session.
func (p *Pipeline) Submit(c Command) {
	p.mu.Lock()
	if p.stopped {
		p.mu.Unlock()
		p.log.Debug().Str("topic", c.Topic).Msg("command after the intake stopped; left for redelivery")
		return
	}
	if waiting := len(p.queue); waiting >= p.opts.MaxBacklog || (waiting > 0 && p.bytes+len(c.Payload) > p.opts.MaxBacklogBytes) {
		p.refused = append(p.refused, p.refusal(c, waiting))
	} else {
		p.queue = append(p.queue, c)
		p.bytes += len(c.Payload)
	}
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// refusal is a command refused for the backlog: what its answer needs, not
// its payload, so a flood of refusals holds little memory.
type refusal struct {
	id, verb string
	waiting  int
	ack      func()
}

func (p *Pipeline) refusal(c Command, waiting int) refusal {
	ct, err := p.in.opts.Topics.ParseCommand(c.Topic)
	id := ct.RequestID
	if id == "" || err != nil {
		id = DeriveRequestID(c.Topic, c.Payload)
	}
	return refusal{id: id, verb: ct.Verb, waiting: waiting, ack: Command{Ack: c.Ack}.ack}
}

// Waiting is how many commands are queued.
func (p *Pipeline) Waiting() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.queue)
}

// refuse answers refused commands "overloaded", all in one outbox
// transaction (one fsync however many: a flood of refusals must not cost
// a disk write each), then acknowledges them.
func (p *Pipeline) refuse(rs []refusal) {
	buf := &replyBuffer{}
	sender := p.sender.With(buf, nil)
	for _, r := range rs {
		p.in.received.Add(1)
		p.in.rejected.Add(1)
		msg := fmt.Sprintf("overloaded: %d commands waiting; retry later", r.waiting)
		_ = sender.SendUnrecorded(apiv1.Reply{RequestID: r.id, Verb: r.verb, Phase: apiv1.Failed, Message: msg})
	}
	p.log.Warn().Int("commands", len(rs)).Int("maxBacklog", p.opts.MaxBacklog).Msg("commands refused: overloaded")
	if err := p.out.PutBatch(buf.msgs); err != nil {
		// Not acknowledged: the broker delivers them again.
		p.log.Error().Err(err).Int("replies", len(buf.msgs)).Msg("queueing overloaded replies")
		return
	}
	for _, r := range rs {
		r.ack()
	}
}

// Run commits queued commands until ctx ends, then handles what is still
// queued (the store must stay open until Run returns) and returns. Refused
// commands are answered before each batch, so they wait at most one batch.
func (p *Pipeline) Run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			p.mu.Lock()
			p.stopped = true
			rest, refused := p.queue, p.refused
			p.queue, p.refused, p.bytes = nil, nil, 0
			p.mu.Unlock()
			if len(refused) > 0 {
				p.refuse(refused)
			}
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
			refused := p.refused
			p.refused = nil
			n := min(len(p.queue), p.opts.MaxBatch)
			batch := p.queue[:n:n]
			p.queue = p.queue[n:]
			for _, c := range batch {
				p.bytes -= len(c.Payload)
			}
			if len(p.queue) == 0 {
				p.queue = nil // let the backing array go
			}
			p.mu.Unlock()
			if len(refused) > 0 {
				p.refuse(refused)
			}
			if n == 0 && len(refused) == 0 {
				break
			}
			if n > 0 {
				p.commit(batch)
			}
		}
	}
}

// commit handles batch in order in one store transaction, then queues the
// replies, then acknowledges, then applies the effects on workers, tracker
// and events (what they publish persisted together). When any store write
// fails the transaction is dropped and every command is handled again on
// its own, so one bad command cannot leave part of itself stored nor take
// the others down with it.
func (p *Pipeline) commit(batch []Command) {
	buf := &replyBuffer{}
	fx := &effects{}
	var sub *Intake
	// Envelopes opened in the batch, kept for the fallback below: opening
	// spends a signed command's nonce, which an undone batch does not undo.
	opened := &openedInBatch{}
	start := time.Now()
	err := p.st.Batch(func(tx *store.Tx) error {
		buf.msgs, fx.calls = nil, nil
		opts := p.in.opts
		if opts.OnGroupApplied != nil {
			opts.OnGroupApplied = fx.groupApplied
		}
		if opts.Opener != nil {
			opened.next, opened.byID = opts.Opener, map[string]openedCommand{}
			opts.Opener = opened
		}
		sub = New(opts, tx, p.sender.With(buf, tx), fx, fx, fx, p.in.status, p.in.log)
		sub.now = p.in.now
		for _, c := range batch {
			// One call per command, in order, inside the transaction: the
			// place for per-command steps such as an in-flight mark.
			sub.Handle(c)
		}
		return tx.Failed()
	})
	if err != nil {
		p.log.Warn().Err(err).Int("commands", len(batch)).Msg("batch not committed; handling its commands one by one")
		alone := p.in
		if opened.byID != nil {
			opts := p.in.opts
			opts.Opener = opened.replay()
			alone = New(opts, p.in.store, p.in.replies, p.in.tracker, p.in.pods, p.in.events, p.in.status, p.in.log)
			alone.now = p.in.now
		}
		for _, c := range batch {
			alone.Handle(c)
			p.flushGroup()
			c.ack()
		}
		if alone != p.in {
			received, rejected := alone.Stats()
			p.in.received.Add(received)
			p.in.rejected.Add(rejected)
		}
		return
	}
	stored := time.Now()
	if err := p.out.PutBatch(buf.msgs); err != nil {
		// Refused replies are counted by the outbox; the commands are
		// stored and recorded, so a redelivery is answered from the record.
		p.log.Error().Err(err).Int("replies", len(buf.msgs)).Msg("queueing replies of a batch")
	}
	received, rejected := sub.Stats()
	p.in.received.Add(received)
	p.in.rejected.Add(rejected)
	queued := time.Now()
	// The acks before the effects: what the commands owe (the final
	// replies the tracker will give) is persisted with them as pending
	// replies, which the next start follows again if mqlet dies before.
	for _, c := range batch {
		c.ack()
	}
	// Killed here: the commands are stored, answered accepted and
	// acknowledged, and neither the tracker nor the workers heard of them.
	faultpoint.Hit("intake.before-effects")
	p.effects(fx)
	p.log.Debug().Int("commands", len(batch)).Int("replies", len(buf.msgs)).Dur("took", time.Since(start)).
		Dur("store", stored.Sub(start)).Dur("outbox", queued.Sub(stored)).Msg("batch committed")
}

// effects runs a batch's effects and waits until what they published
// through the Group is persisted.
func (p *Pipeline) effects(fx *effects) {
	fx.replay(p.in)
	p.flushGroup()
}

func (p *Pipeline) flushGroup() {
	if p.opts.Group != nil {
		p.opts.Group.Flush()
	}
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

func (f *effects) groupApplied(group string, generation uint64) {
	f.calls = append(f.calls, func(in *Intake) { in.opts.OnGroupApplied(group, generation) })
}

func (f *effects) replay(in *Intake) {
	for _, c := range f.calls {
		c(in)
	}
}

// openedInBatch opens envelopes through next and remembers each success by
// request id, so a batch handled again one by one does not open (and spend
// the nonce of) the same envelope twice.
type openedInBatch struct {
	next Opener
	byID map[string]openedCommand
}

type openedCommand struct {
	verb    string
	payload []byte
	opened  signing.Opened
}

func (o *openedInBatch) Open(verb, requestID string, payload []byte) (signing.Opened, error) {
	res, err := o.next.Open(verb, requestID, payload)
	if err == nil {
		o.byID[requestID] = openedCommand{verb: verb, payload: payload, opened: res}
	}
	return res, err
}

// replay is an Opener that answers the batch's opened envelopes from memory
// (the same verb, id and bytes only) and opens anything else through next.
func (o *openedInBatch) replay() Opener { return replayOpener{o} }

type replayOpener struct{ o *openedInBatch }

func (r replayOpener) Open(verb, requestID string, payload []byte) (signing.Opened, error) {
	if prev, ok := r.o.byID[requestID]; ok && prev.verb == verb && bytes.Equal(prev.payload, payload) {
		return prev.opened, nil
	}
	return r.o.next.Open(verb, requestID, payload)
}
