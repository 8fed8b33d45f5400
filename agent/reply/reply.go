// Package reply publishes the answers to commands on
// <prefix>/<node>/reply/<requestId> and remembers the latest answer of each
// request, so a redelivered request is answered again instead of re-run.
//
// No reply message is larger than the sender's bound (default 256 KiB): a
// reply whose result does not fit is sent as numbered parts (in_progress
// replies with "seq" 1..N, each carrying a base64 piece of the result's
// JSON), then the reply itself with an apiv1.Parts result naming the count,
// size and SHA-256 of the whole; apiv1.Assemble puts it back together.
package reply

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/rs/zerolog"

	apiv1 "github.com/mqlet/mqlet/api/v1"
	"github.com/mqlet/mqlet/mqtt/outbox"
)

// Publisher queues a message for the broker (the outbox).
type Publisher interface {
	Put(m outbox.Message) error
}

// batchPublisher is a Publisher that can queue many messages at the cost of
// one (the outbox); the parts of a large reply go out that way.
type batchPublisher interface {
	PutBatch(msgs []outbox.Message) error
}

// Recorder persists the latest reply of each request id.
type Recorder interface {
	RecordReply(requestID string, reply []byte, at time.Time) error
}

// Defaults of the sender's bounds.
const (
	DefaultMaxReplyBytes = 256 << 10
	// DefaultMaxRecordedBytes: a reply larger than this is recorded as a
	// short stub, so a few big results cannot push every other request's
	// record out of the bounded store.
	DefaultMaxRecordedBytes = 16 << 10
	// minMaxReplyBytes leaves room for a part's envelope and some data.
	minMaxReplyBytes = 4 << 10
	// DefaultMaxResultBytes bounds one result sent in parts: half the
	// default outbox, so one answer never crowds out everything else.
	DefaultMaxResultBytes = 8 << 20
)

// Option tunes a Sender.
type Option func(*Sender)

// WithMaxReplyBytes bounds each reply message's payload (at least 4 KiB).
func WithMaxReplyBytes(n int) Option {
	return func(s *Sender) { s.maxReply = max(n, minMaxReplyBytes) }
}

// WithMaxResultBytes bounds one result (its JSON); a larger result is not
// sent and the reply says so.
func WithMaxResultBytes(n int) Option {
	return func(s *Sender) {
		if n > 0 {
			s.maxResult = n
		}
	}
}

// WithMaxRecordedBytes sets the largest reply recorded in full; larger ones
// are recorded as a stub that says so.
func WithMaxRecordedBytes(n int) Option {
	return func(s *Sender) {
		if n > 0 {
			s.maxRecorded = n
		}
	}
}

// Sender publishes replies and records them.
type Sender struct {
	topics      apiv1.Scheme
	out         Publisher
	rec         Recorder
	now         func() time.Time
	log         zerolog.Logger
	maxReply    int
	maxRecorded int
	maxResult   int
}

// NewSender returns a Sender; now is the clock (time.Now when nil).
func NewSender(topics apiv1.Scheme, out Publisher, rec Recorder, now func() time.Time, log zerolog.Logger, opts ...Option) *Sender {
	if now == nil {
		now = time.Now
	}
	s := &Sender{topics: topics, out: out, rec: rec, now: now, log: log, maxReply: DefaultMaxReplyBytes, maxRecorded: DefaultMaxRecordedBytes, maxResult: DefaultMaxResultBytes}
	for _, o := range opts {
		o(s)
	}
	return s
}

// With returns a Sender with the same settings that publishes to out and
// records to rec, e.g. into one batch's transaction.
func (s *Sender) With(out Publisher, rec Recorder) *Sender {
	c := *s
	c.out, c.rec = out, rec
	return &c
}

// MaxReplyBytes is the bound of one reply message's payload.
func (s *Sender) MaxReplyBytes() int { return s.maxReply }

// Send records and publishes one reply, in parts when it is too large for
// one message. Failures are logged and returned; the record is written first
// so a redelivery never re-runs a command whose reply could not be queued.
func (s *Sender) Send(r apiv1.Reply) error {
	if r.TS.IsZero() {
		r.TS = s.now().UTC()
	}
	if r.Node == "" {
		r.Node = s.topics.Node
	}
	msgs, payload, err := s.encode(r)
	if err != nil {
		return err
	}
	if s.rec != nil {
		if err := s.rec.RecordReply(r.RequestID, s.record(r, payload, len(msgs)-1), r.TS); err != nil {
			s.log.Error().Err(err).Str("requestId", r.RequestID).Msg("recording reply")
		}
	}
	return s.put(r.RequestID, msgs)
}

// SendUnrecorded publishes one reply without recording it, for an answer
// that must not stand for the request on redelivery (e.g. "overloaded":
// the request should run when it comes again).
func (s *Sender) SendUnrecorded(r apiv1.Reply) error {
	msgs, _, err := s.encode(r)
	if err != nil {
		return err
	}
	return s.put(r.RequestID, msgs)
}

// Resend publishes a reply payload recorded earlier.
func (s *Sender) Resend(requestID string, payload []byte) error {
	var r struct {
		Phase string `json:"phase"`
	}
	_ = json.Unmarshal(payload, &r) // unreadable: queued as not final
	return s.put(requestID, []outbox.Message{s.message(requestID, payload, apiv1.Reply{Phase: r.Phase}.Final())})
}

// message is one reply message; final marks a final reply and the parts
// of its result, which a full outbox drops last.
func (s *Sender) message(requestID string, payload []byte, final bool) outbox.Message {
	return outbox.Message{Topic: s.topics.Reply(requestID), Payload: payload, QoS: 1, Final: final}
}

func (s *Sender) put(requestID string, msgs []outbox.Message) error {
	var err error
	if bp, ok := s.out.(batchPublisher); ok && len(msgs) > 1 {
		err = bp.PutBatch(msgs)
	} else {
		for _, m := range msgs {
			if err = s.out.Put(m); err != nil {
				break
			}
		}
	}
	if err != nil {
		s.log.Error().Err(err).Str("requestId", requestID).Msg("queueing reply")
		return fmt.Errorf("queueing reply to %s: %w", requestID, err)
	}
	return nil
}

// encode turns r into its messages (the parts, if any, then r itself) and
// returns r's own payload last.
func (s *Sender) encode(r apiv1.Reply) ([]outbox.Message, []byte, error) {
	if r.TS.IsZero() {
		r.TS = s.now().UTC()
	}
	if r.Node == "" {
		r.Node = s.topics.Node
	}
	payload, err := json.Marshal(r)
	if err != nil {
		return nil, nil, fmt.Errorf("encoding reply to %s: %w", r.RequestID, err)
	}
	if len(payload) <= s.maxReply {
		return []outbox.Message{s.message(r.RequestID, payload, r.Final())}, payload, nil
	}
	var msgs []outbox.Message
	if r.Result != nil {
		result, err := json.Marshal(r.Result)
		if err != nil {
			return nil, nil, fmt.Errorf("encoding reply result to %s: %w", r.RequestID, err)
		}
		if len(result) > s.maxResult {
			// More than one answer should ever cost: it would crowd
			// everything else out of the outbox while offline. Say so
			// instead of sending it.
			r.Result = nil
			r.Message = strings.TrimSpace(r.Message + fmt.Sprintf(" (result of %d bytes not sent: more than %d; ask for less, e.g. one kind, namespace or name)", len(result), s.maxResult))
		} else {
			parts, err := s.parts(r, result)
			if err != nil {
				return nil, nil, err
			}
			msgs = parts
			r.Result = apiv1.Parts{Parts: len(parts), Bytes: len(result), SHA256: apiv1.SHA256Hex(result)}
			r.Message = strings.TrimSpace(r.Message + fmt.Sprintf(" (result in %d parts)", len(parts)))
		}
	}
	if payload, err = s.fit(r); err != nil {
		return nil, nil, err
	}
	return append(msgs, s.message(r.RequestID, payload, r.Final())), payload, nil
}

// parts cuts result into in_progress replies that each fit the bound.
func (s *Sender) parts(r apiv1.Reply, result []byte) ([]outbox.Message, error) {
	env, err := json.Marshal(apiv1.Reply{RequestID: r.RequestID, Node: r.Node, Verb: r.Verb, Phase: apiv1.InProgress, Seq: 1 << 30,
		Message: "result part 1073741824 of 1073741824", Result: apiv1.Part{Data: []byte{}}, TS: r.TS})
	if err != nil {
		return nil, fmt.Errorf("encoding reply part to %s: %w", r.RequestID, err)
	}
	room := (s.maxReply - len(env)) / 4 * 3 // base64: 4 bytes for every 3
	if room < 3 {
		return nil, fmt.Errorf("reply to %s: request id too long for a reply part", r.RequestID)
	}
	n := (len(result) + room - 1) / room
	msgs := make([]outbox.Message, 0, n)
	for i := 0; i < n; i++ {
		piece := result[i*room : min((i+1)*room, len(result))]
		p, err := json.Marshal(apiv1.Reply{RequestID: r.RequestID, Node: r.Node, Verb: r.Verb, Phase: apiv1.InProgress, Seq: i + 1,
			Message: fmt.Sprintf("result part %d of %d", i+1, n), Result: apiv1.Part{Data: piece}, TS: r.TS})
		if err != nil {
			return nil, fmt.Errorf("encoding reply part to %s: %w", r.RequestID, err)
		}
		msgs = append(msgs, s.message(r.RequestID, p, r.Final()))
	}
	return msgs, nil
}

// fit encodes r, shortening its errors and message until it fits the bound
// (a List of many invalid objects can name more problems than fit).
func (s *Sender) fit(r apiv1.Reply) ([]byte, error) {
	all := len(r.Errors)
	shown := r.Errors
	for {
		payload, err := json.Marshal(r)
		if err != nil {
			return nil, fmt.Errorf("encoding reply to %s: %w", r.RequestID, err)
		}
		if len(payload) <= s.maxReply {
			return payload, nil
		}
		switch {
		case len(shown) > 0:
			shown = shown[:len(shown)/2]
			r.Errors = append(slices.Clip(shown), fmt.Sprintf("... and %d more not shown (reply size bound)", all-len(shown)))
		case len(r.Message) > s.maxReply/4:
			r.Message = truncate(r.Message, s.maxReply/4)
		default:
			return nil, fmt.Errorf("reply to %s: %d bytes do not fit the bound of %d", r.RequestID, len(payload), s.maxReply)
		}
	}
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	const more = "... (truncated)"
	cut := max(n-len(more), 0)
	for cut > 0 && !utf8RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + more
}

func utf8RuneStart(b byte) bool { return b&0xC0 != 0x80 }

// record is what is kept for a redelivery of r's request: r itself when it
// is small, else a stub that says the reply was sent and how to read it again.
func (s *Sender) record(r apiv1.Reply, payload []byte, parts int) []byte {
	if parts == 0 && len(payload) <= s.maxRecorded {
		return payload
	}
	stub := apiv1.Reply{RequestID: r.RequestID, Node: r.Node, Verb: r.Verb, Phase: r.Phase, TS: r.TS,
		Message: truncate(r.Message, 1024) + fmt.Sprintf("; the full reply (%d bytes) is not kept: send the request again with a new request id to read it", len(payload))}
	if parts > 0 {
		stub.Message = truncate(r.Message, 1024) + fmt.Sprintf("; its %d parts are not kept: send the request again with a new request id to read them", parts)
	}
	b, err := json.Marshal(stub)
	if err != nil { // a struct of strings always encodes
		return payload
	}
	return b
}
