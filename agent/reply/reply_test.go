package reply

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	apiv1 "github.com/mqlet/mqlet/api/v1"
	"github.com/mqlet/mqlet/mqtt/outbox"
)

type box struct {
	msgs []outbox.Message
	err  error
}

func (b *box) Put(m outbox.Message) error { b.msgs = append(b.msgs, m); return b.err }

type records map[string][]byte

func (r records) RecordReply(id string, reply []byte, at time.Time) error {
	if at.IsZero() {
		return errors.New("recorded without a time")
	}
	r[id] = reply
	return nil
}

func TestSendRecordsThenPublishesOnTheReplyTopic(t *testing.T) {
	b, rec := &box{}, records{}
	s := NewSender(apiv1.Scheme{Prefix: "mqlet/v1", Node: "n"}, b, rec, func() time.Time { return time.Unix(5, 0) }, zerolog.Nop())
	if err := s.Send(apiv1.Reply{RequestID: "r1", Phase: apiv1.Accepted, Message: "ok"}); err != nil {
		t.Fatal(err)
	}
	if len(b.msgs) != 1 || b.msgs[0].Topic != "mqlet/v1/n/reply/r1" || b.msgs[0].QoS != 1 || b.msgs[0].Retained {
		t.Fatalf("published %+v", b.msgs)
	}
	var got apiv1.Reply
	if err := json.Unmarshal(b.msgs[0].Payload, &got); err != nil || got.Phase != apiv1.Accepted || !got.TS.Equal(time.Unix(5, 0)) {
		t.Fatalf("payload %s (%v)", b.msgs[0].Payload, err)
	}
	if string(rec["r1"]) != string(b.msgs[0].Payload) {
		t.Fatal("the recorded reply differs from the published one")
	}
	if got.Final() || !(apiv1.Reply{Phase: apiv1.Failed}).Final() || !(apiv1.Reply{Phase: apiv1.Succeeded}).Final() {
		t.Fatal("Final is wrong")
	}
}

func TestSendReportsAFullOutbox(t *testing.T) {
	b := &box{err: errors.New("outbox full")}
	s := NewSender(apiv1.Scheme{Node: "n"}, b, records{}, nil, zerolog.Nop())
	if err := s.Send(apiv1.Reply{RequestID: "r2", Phase: apiv1.Failed}); err == nil {
		t.Fatal("want the queueing error")
	}
}

func TestLargeResultGoesInPartsEachWithinTheBound(t *testing.T) {
	b, rec := &box{}, records{}
	const bound = 8 << 10
	s := NewSender(apiv1.Scheme{Prefix: "mqlet/v1", Node: "n"}, b, rec, nil, zerolog.Nop(), WithMaxReplyBytes(bound), WithMaxRecordedBytes(2048))
	big := map[string]string{}
	for i := 0; i < 50; i++ {
		big[fmt.Sprintf("k%02d", i)] = strings.Repeat("x<&\"\u00e9", 200) // escapes make JSON larger than the text
	}
	if err := s.Send(apiv1.Reply{RequestID: "g1", Verb: "get", Phase: apiv1.Succeeded, Message: "1 configmap", Result: big}); err != nil {
		t.Fatal(err)
	}
	if len(b.msgs) < 3 {
		t.Fatalf("%d messages, want the result in several parts", len(b.msgs))
	}
	payloads := make([][]byte, 0, len(b.msgs))
	for i, m := range b.msgs {
		if len(m.Payload) > bound {
			t.Errorf("message %d: %d bytes, bound %d", i, len(m.Payload), bound)
		}
		if m.Topic != "mqlet/v1/n/reply/g1" {
			t.Errorf("message %d on %s", i, m.Topic)
		}
		payloads = append(payloads, m.Payload)
	}
	// Parts first (in_progress, seq 1..N), the final reply last.
	var first, last apiv1.Reply
	_ = json.Unmarshal(b.msgs[0].Payload, &first)
	_ = json.Unmarshal(b.msgs[len(b.msgs)-1].Payload, &last)
	if first.Phase != apiv1.InProgress || first.Seq != 1 || last.Phase != apiv1.Succeeded || last.Seq != 0 {
		t.Fatalf("first %s/%d, last %s/%d", first.Phase, first.Seq, last.Phase, last.Seq)
	}
	// Out of order, the parts still assemble into the original result.
	payloads[0], payloads[1] = payloads[1], payloads[0]
	result, final, err := apiv1.Assemble(payloads)
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]string
	if err := json.Unmarshal(result, &got); err != nil || fmt.Sprint(got) != fmt.Sprint(big) {
		t.Fatalf("assembled result differs (%v)", err)
	}
	if string(final) != string(b.msgs[len(b.msgs)-1].Payload) {
		t.Fatal("final payload differs")
	}
	// A missing part is detected.
	if _, _, err := apiv1.Assemble(payloads[1:]); err == nil {
		t.Fatal("assembled with a part missing")
	}
	// The record is a short stub, not the result.
	var stub apiv1.Reply
	if err := json.Unmarshal(rec["g1"], &stub); err != nil || stub.Result != nil || stub.Phase != apiv1.Succeeded || !strings.Contains(stub.Message, "not kept") || len(rec["g1"]) > 2048 {
		t.Fatalf("record %s (%v)", rec["g1"], err)
	}
}

func TestTooManyErrorsAreShortenedToFit(t *testing.T) {
	b := &box{}
	const bound = 4 << 10
	s := NewSender(apiv1.Scheme{Node: "n"}, b, records{}, nil, zerolog.Nop(), WithMaxReplyBytes(bound))
	var errs []string
	for i := 0; i < 500; i++ {
		errs = append(errs, fmt.Sprintf("ConfigMap default/c%d: data: Invalid value", i))
	}
	if err := s.Send(apiv1.Reply{RequestID: "a1", Phase: apiv1.Failed, Message: strings.Repeat("m", 3000), Errors: errs}); err != nil {
		t.Fatal(err)
	}
	if len(b.msgs) != 1 || len(b.msgs[0].Payload) > bound {
		t.Fatalf("%d messages, first %d bytes", len(b.msgs), len(b.msgs[0].Payload))
	}
	var got apiv1.Reply
	_ = json.Unmarshal(b.msgs[0].Payload, &got)
	if len(got.Errors) == 0 || got.Errors[0] != errs[0] || !strings.Contains(got.Errors[len(got.Errors)-1], "more not shown") {
		t.Fatalf("errors %v", got.Errors)
	}
}

func TestSendUnrecordedRecordsNothing(t *testing.T) {
	b, rec := &box{}, records{}
	s := NewSender(apiv1.Scheme{Node: "n"}, b, rec, nil, zerolog.Nop())
	if err := s.SendUnrecorded(apiv1.Reply{RequestID: "o1", Phase: apiv1.Failed, Message: "overloaded"}); err != nil {
		t.Fatal(err)
	}
	if len(b.msgs) != 1 || len(rec) != 0 {
		t.Fatalf("%d published, %d recorded", len(b.msgs), len(rec))
	}
}

func TestResultBeyondMaxResultBytesIsNotSent(t *testing.T) {
	b := &box{}
	s := NewSender(apiv1.Scheme{Node: "n"}, b, records{}, nil, zerolog.Nop(), WithMaxReplyBytes(4096), WithMaxResultBytes(10000))
	if err := s.Send(apiv1.Reply{RequestID: "g", Phase: apiv1.Succeeded, Message: "listing", Result: strings.Repeat("x", 20000)}); err != nil {
		t.Fatal(err)
	}
	var got apiv1.Reply
	if len(b.msgs) != 1 || json.Unmarshal(b.msgs[0].Payload, &got) != nil || got.Result != nil || !strings.Contains(got.Message, "not sent") {
		t.Fatalf("%d messages, reply %+v", len(b.msgs), got)
	}
}

// A final reply and every part of its result are marked Final, which a
// full outbox drops last; accepted and in-progress replies are not; a
// recorded reply sent again keeps its mark.
func TestFinalRepliesAreMarkedFinal(t *testing.T) {
	b := &box{}
	s := NewSender(apiv1.Scheme{Prefix: "mqlet/v1", Node: "n"}, b, records{}, nil, zerolog.Nop(), WithMaxReplyBytes(1024))
	send := func(r apiv1.Reply) []outbox.Message {
		t.Helper()
		b.msgs = nil
		if err := s.Send(r); err != nil {
			t.Fatal(err)
		}
		return b.msgs
	}
	for _, tc := range []struct {
		reply apiv1.Reply
		final bool
	}{
		{apiv1.Reply{RequestID: "a", Phase: apiv1.Accepted}, false},
		{apiv1.Reply{RequestID: "p", Phase: apiv1.InProgress}, false},
		{apiv1.Reply{RequestID: "f", Phase: apiv1.Failed, Message: "no"}, true},
		{apiv1.Reply{RequestID: "s", Phase: apiv1.Succeeded, Result: strings.Repeat("x", 5000)}, true},
	} {
		msgs := send(tc.reply)
		for i, m := range msgs {
			if m.Final != tc.final {
				t.Errorf("%s reply, message %d of %d: Final %v, want %v", tc.reply.Phase, i+1, len(msgs), m.Final, tc.final)
			}
		}
		b.msgs = nil
		if err := s.Resend(tc.reply.RequestID, msgs[len(msgs)-1].Payload); err != nil {
			t.Fatal(err)
		}
		if b.msgs[0].Final != tc.final {
			t.Errorf("%s reply resent: Final %v, want %v", tc.reply.Phase, b.msgs[0].Final, tc.final)
		}
	}
	if msgs := send(apiv1.Reply{RequestID: "s2", Phase: apiv1.Succeeded, Result: strings.Repeat("x", 5000)}); len(msgs) < 3 {
		t.Fatalf("%d messages, want the result in parts", len(msgs))
	}
}
