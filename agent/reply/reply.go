// Package reply publishes the answers to commands on
// <prefix>/<node>/reply/<requestId> and remembers the latest answer of each
// request, so a redelivered request is answered again instead of re-run.
package reply

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/rs/zerolog"

	"github.com/mqlet/mqlet/mqtt/outbox"
	"github.com/mqlet/mqlet/mqtt/topic"
)

// Phases of a command, in the order they are reported.
const (
	Accepted   = "accepted"
	InProgress = "in_progress"
	Succeeded  = "succeeded"
	Failed     = "failed"
)

// Reply is the payload published on the reply topic.
type Reply struct {
	RequestID string    `json:"requestId"`
	Verb      string    `json:"verb,omitempty"`
	Phase     string    `json:"phase"`
	Message   string    `json:"message,omitempty"`
	Result    any       `json:"result,omitempty"`
	Errors    []string  `json:"errors,omitempty"`
	TS        time.Time `json:"ts"`
}

// Final reports whether no further reply follows this one.
func (r Reply) Final() bool { return r.Phase == Succeeded || r.Phase == Failed }

// Publisher queues a message for the broker (the outbox).
type Publisher interface {
	Put(m outbox.Message) error
}

// Recorder persists the latest reply of each request id.
type Recorder interface {
	RecordReply(requestID string, reply []byte, at time.Time) error
}

// Sender publishes replies and records them.
type Sender struct {
	topics topic.Scheme
	out    Publisher
	rec    Recorder
	now    func() time.Time
	log    zerolog.Logger
}

// NewSender returns a Sender; now is the clock (time.Now when nil).
func NewSender(topics topic.Scheme, out Publisher, rec Recorder, now func() time.Time, log zerolog.Logger) *Sender {
	if now == nil {
		now = time.Now
	}
	return &Sender{topics: topics, out: out, rec: rec, now: now, log: log}
}

// Send records and publishes one reply. Failures are logged and returned;
// the record is written first so a redelivery never re-runs a command whose
// reply could not be queued.
func (s *Sender) Send(r Reply) error {
	if r.TS.IsZero() {
		r.TS = s.now().UTC()
	}
	payload, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("encoding reply to %s: %w", r.RequestID, err)
	}
	if s.rec != nil {
		if err := s.rec.RecordReply(r.RequestID, payload, r.TS); err != nil {
			s.log.Error().Err(err).Str("requestId", r.RequestID).Msg("recording reply")
		}
	}
	return s.Resend(r.RequestID, payload)
}

// Resend publishes a reply payload recorded earlier.
func (s *Sender) Resend(requestID string, payload []byte) error {
	err := s.out.Put(outbox.Message{Topic: s.topics.Reply(requestID), Payload: payload, QoS: 1})
	if err != nil {
		s.log.Error().Err(err).Str("requestId", requestID).Msg("queueing reply")
		return fmt.Errorf("queueing reply to %s: %w", requestID, err)
	}
	return nil
}
