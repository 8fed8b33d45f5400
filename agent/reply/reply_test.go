package reply

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/mqlet/mqlet/mqtt/outbox"
	"github.com/mqlet/mqlet/mqtt/topic"
)

type box struct {
	msgs []outbox.Message
	err  error
}

func (b *box) Put(m outbox.Message) error { b.msgs = append(b.msgs, m); return b.err }

type records map[string][]byte

func (r records) RecordReply(id string, reply []byte, _ time.Time) error { r[id] = reply; return nil }

func TestSendRecordsThenPublishesOnTheReplyTopic(t *testing.T) {
	b, rec := &box{}, records{}
	s := NewSender(topic.Scheme{Prefix: "mqlet/v1", Node: "n"}, b, rec, func() time.Time { return time.Unix(5, 0) }, zerolog.Nop())
	if err := s.Send(Reply{RequestID: "r1", Phase: Accepted, Message: "ok"}); err != nil {
		t.Fatal(err)
	}
	if len(b.msgs) != 1 || b.msgs[0].Topic != "mqlet/v1/n/reply/r1" || b.msgs[0].QoS != 1 || b.msgs[0].Retained {
		t.Fatalf("published %+v", b.msgs)
	}
	var got Reply
	if err := json.Unmarshal(b.msgs[0].Payload, &got); err != nil || got.Phase != Accepted || !got.TS.Equal(time.Unix(5, 0)) {
		t.Fatalf("payload %s (%v)", b.msgs[0].Payload, err)
	}
	if string(rec["r1"]) != string(b.msgs[0].Payload) {
		t.Fatal("the recorded reply differs from the published one")
	}
	if got.Final() || !(Reply{Phase: Failed}).Final() || !(Reply{Phase: Succeeded}).Final() {
		t.Fatal("Final is wrong")
	}
}

func TestSendReportsAFullOutbox(t *testing.T) {
	b := &box{err: errors.New("outbox full")}
	s := NewSender(topic.Scheme{Node: "n"}, b, records{}, nil, zerolog.Nop())
	if err := s.Send(Reply{RequestID: "r2", Phase: Failed}); err == nil {
		t.Fatal("want the queueing error")
	}
}
