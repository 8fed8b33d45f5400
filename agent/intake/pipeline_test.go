package intake

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/mqlet/mqlet/agent/pending"
	"github.com/mqlet/mqlet/agent/reply"
	"github.com/mqlet/mqlet/agent/store"
	"github.com/mqlet/mqlet/agent/validate"
	apiv1 "github.com/mqlet/mqlet/api/v1"
	"github.com/mqlet/mqlet/mqtt/outbox"
)

// recordingBox is an outbox that keeps what was queued, in order.
type recordingBox struct {
	mu   sync.Mutex
	msgs []outbox.Message
}

func (b *recordingBox) Put(m outbox.Message) error { return b.PutBatch([]outbox.Message{m}) }

func (b *recordingBox) PutBatch(msgs []outbox.Message) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.msgs = append(b.msgs, msgs...)
	return nil
}

// replies returns the replies queued for id, in order.
func (b *recordingBox) replies(t testing.TB, id string) []apiv1.Reply {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []apiv1.Reply
	for _, m := range b.msgs {
		if !strings.HasSuffix(m.Topic, "/reply/"+id) {
			continue
		}
		var r apiv1.Reply
		if err := json.Unmarshal(m.Payload, &r); err != nil {
			t.Fatalf("reply to %s: %v", id, err)
		}
		out = append(out, r)
	}
	return out
}

func (b *recordingBox) firstTopic() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.msgs) == 0 {
		return ""
	}
	return b.msgs[0].Topic
}

type pipeRig struct {
	st    *store.Store
	box   *recordingBox
	in    *Intake
	pipe  *Pipeline
	sched *fakeScheduler
	track *fakeTracker
}

func newPipeRig(t *testing.T, opts PipelineOptions) *pipeRig {
	st, err := store.Open(filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	r := &pipeRig{st: st, box: &recordingBox{}, sched: &fakeScheduler{deletes: map[string]*int64{}}, track: &fakeTracker{added: map[string]map[string]pending.Want{}}}
	topics := apiv1.Scheme{Prefix: "mqlet/v1", Node: "n1"}
	sender := reply.NewSender(topics, r.box, st, nil, zerolog.Nop())
	r.in = New(Options{Topics: topics, MaxPayloadBytes: 1 << 20, Policy: validate.Policy{}, ApplyDeadline: time.Minute},
		st, sender, r.track, r.sched, &fakeEvents{}, noStatus{}, zerolog.Nop())
	r.pipe = NewPipeline(r.in, st, r.box, sender, opts, zerolog.Nop())
	return r
}

func (r *pipeRig) run(t *testing.T) context.CancelFunc {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.pipe.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return cancel
}

func cmCommand(id, name string) (string, []byte) {
	return "mqlet/v1/n1/cmd/apply/" + id, fmt.Appendf(nil, `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":%q},"data":{"k":"v"}}`, name)
}

// Every command of a burst is stored, answered accepted and acknowledged,
// and no acknowledgement comes before its command and reply are persisted.
func TestPipelineBurstAcksAfterPersistence(t *testing.T) {
	r := newPipeRig(t, PipelineOptions{MaxBacklog: 1000})
	r.run(t)
	const n = 300
	var wg sync.WaitGroup
	var mu sync.Mutex
	var problems []string
	wg.Add(n)
	for i := 0; i < n; i++ {
		id, name := fmt.Sprintf("b%d", i), fmt.Sprintf("cm-%d", i)
		tp, payload := cmCommand(id, name)
		r.pipe.Submit(Command{Topic: tp, Payload: payload, Ack: func() {
			defer wg.Done()
			_, errStored := r.st.ConfigMap("default", name)
			_, recorded, _ := r.st.LookupReply(id)
			if errStored != nil || !recorded || len(r.box.replies(t, id)) == 0 {
				mu.Lock()
				problems = append(problems, fmt.Sprintf("%s acknowledged before persisted (stored: %v, recorded %v)", id, errStored, recorded))
				mu.Unlock()
			}
		}})
	}
	waitGroup(t, &wg, "every command acknowledged")
	if len(problems) > 0 {
		t.Fatalf("%d problems, first: %s", len(problems), problems[0])
	}
	for i := 0; i < n; i++ {
		reps := r.box.replies(t, fmt.Sprintf("b%d", i))
		if len(reps) != 1 || reps[0].Phase != apiv1.Accepted {
			t.Fatalf("b%d replies %+v, want one accepted", i, reps)
		}
	}
	if received, rejected := r.in.Stats(); received != n || rejected != 0 {
		t.Fatalf("stats %d/%d", received, rejected)
	}
}

// Commands keep their order inside a batch: a delete after an apply of the
// same object deletes it, and a redelivered id in the same batch is
// answered from the record, not run again.
func TestPipelineKeepsOrderWithinABatch(t *testing.T) {
	r := newPipeRig(t, PipelineOptions{})
	var wg sync.WaitGroup
	submit := func(tp string, payload []byte) {
		wg.Add(1)
		r.pipe.Submit(Command{Topic: tp, Payload: payload, Ack: wg.Done})
	}
	tp, payload := cmCommand("o1", "ordered")
	submit(tp, payload)
	submit(tp, payload) // the same request id again
	submit("mqlet/v1/n1/cmd/delete/o2", []byte(`{"kind":"ConfigMap","name":"ordered"}`))
	tp3, payload3 := cmCommand("o3", "kept")
	submit(tp3, payload3)
	r.run(t) // all four are queued before the committer starts: one batch
	waitGroup(t, &wg, "four acknowledgements")
	if _, err := r.st.ConfigMap("default", "ordered"); err == nil {
		t.Fatal("the delete did not follow the apply")
	}
	if _, err := r.st.ConfigMap("default", "kept"); err != nil {
		t.Fatal(err)
	}
	if reps := r.box.replies(t, "o1"); len(reps) != 2 || reps[0].Phase != apiv1.Accepted || reps[1].Phase != apiv1.Accepted {
		t.Fatalf("o1 replies %+v, want accepted and the same again", reps)
	}
	if got := r.box.replies(t, "o2"); len(got) != 1 || got[0].Phase != apiv1.Accepted {
		t.Fatalf("delete replies %+v", got)
	}
}

// A command whose store write fails inside a batch undoes the batch; every
// command is then handled alone, so the others are stored and it alone fails.
func TestPipelineFailedWriteFallsBackToOneByOne(t *testing.T) {
	r := newPipeRig(t, PipelineOptions{})
	var wg sync.WaitGroup
	submit := func(tp string, payload []byte) {
		wg.Add(1)
		r.pipe.Submit(Command{Topic: tp, Payload: payload, Ack: wg.Done})
	}
	tp, payload := cmCommand("f1", "before")
	submit(tp, payload)
	dup := `{"apiVersion":"v1","kind":"List","items":[` +
		`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"twice"},"data":{"k":"1"}},` +
		`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"twice"},"data":{"k":"2"}}]}`
	submit("mqlet/v1/n1/cmd/apply/f2", []byte(dup))
	tp3, payload3 := cmCommand("f3", "after")
	submit(tp3, payload3)
	r.run(t)
	waitGroup(t, &wg, "three acknowledgements")
	for _, name := range []string{"before", "after"} {
		if _, err := r.st.ConfigMap("default", name); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, err := r.st.ConfigMap("default", "twice"); err == nil {
		t.Error("the failed command was half stored")
	}
	if got := r.box.replies(t, "f2"); len(got) != 1 || got[0].Phase != apiv1.Failed || !strings.Contains(got[0].Message, "twice") {
		t.Fatalf("f2 replies %+v", got)
	}
	for _, id := range []string{"f1", "f3"} {
		if got := r.box.replies(t, id); len(got) != 1 || got[0].Phase != apiv1.Accepted {
			t.Errorf("%s replies %+v (the undone batch must not have queued replies)", id, got)
		}
	}
}

// Beyond the backlog a command is answered overloaded at once, acknowledged
// and not recorded, so the same request id runs when it is sent again.
func TestPipelineOverloadAnswersAtOnce(t *testing.T) {
	r := newPipeRig(t, PipelineOptions{MaxBacklog: 2})
	var acked sync.WaitGroup
	for i := 0; i < 3; i++ {
		tp, payload := cmCommand(fmt.Sprintf("v%d", i), fmt.Sprintf("cm-%d", i))
		acked.Add(1)
		r.pipe.Submit(Command{Topic: tp, Payload: payload, Ack: acked.Done})
	}
	r.run(t)
	waitGroup(t, &acked, "every command acknowledged")
	got := r.box.replies(t, "v2")
	if len(got) != 1 || got[0].Phase != apiv1.Failed || got[0].Message != "overloaded: 2 commands waiting; retry later" {
		t.Fatalf("v2 replies %+v", got)
	}
	if _, recorded, _ := r.st.LookupReply("v2"); recorded {
		t.Fatal("the overloaded answer was recorded")
	}
	// It was answered before the commands it could not join.
	if first := r.box.firstTopic(); !strings.HasSuffix(first, "/reply/v2") {
		t.Fatalf("first reply on %s, want the overloaded one", first)
	}
	// Sent again once the backlog is gone, v2 runs.
	tp, payload := cmCommand("v2", "cm-2")
	acked.Add(1)
	r.pipe.Submit(Command{Topic: tp, Payload: payload, Ack: acked.Done})
	waitGroup(t, &acked, "the retry acknowledged")
	if _, err := r.st.ConfigMap("default", "cm-2"); err != nil {
		t.Fatalf("retried command: %v", err)
	}
	if _, rejected := r.in.Stats(); rejected != 1 {
		t.Fatalf("rejected %d, want 1", rejected)
	}
}

// On stop the committer handles what is queued; after it, commands are
// left unacknowledged for the broker to deliver again.
func TestPipelineStopDrainsThenRefuses(t *testing.T) {
	r := newPipeRig(t, PipelineOptions{})
	var wg sync.WaitGroup
	for i := 0; i < 5; i++ {
		tp, payload := cmCommand(fmt.Sprintf("s%d", i), fmt.Sprintf("cm-%d", i))
		wg.Add(1)
		r.pipe.Submit(Command{Topic: tp, Payload: payload, Ack: wg.Done})
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	r.pipe.Run(ctx) // returns after draining
	waitGroup(t, &wg, "queued commands handled on stop")
	tp, payload := cmCommand("late", "late")
	r.pipe.Submit(Command{Topic: tp, Payload: payload, Ack: func() { t.Error("a command after stop was acknowledged") }})
	if len(r.box.replies(t, "late")) != 0 {
		t.Fatal("a command after stop was answered")
	}
}

func waitGroup(t *testing.T, wg *sync.WaitGroup, what string) {
	t.Helper()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
	}
}

// answeringTracker answers every request succeeded as soon as it is added,
// as the real tracker does for a ConfigMap apply.
type answeringTracker struct{ sender *reply.Sender }

func (a answeringTracker) Add(id, verb string, _ map[string]pending.Want, _ time.Time) {
	_ = a.sender.Send(apiv1.Reply{RequestID: id, Verb: verb, Phase: apiv1.Succeeded, Message: "done"})
}

// countingBox counts the outbox transactions.
type countingBox struct {
	recordingBox
	puts, batches int
}

func (b *countingBox) Put(m outbox.Message) error { b.puts++; return b.recordingBox.Put(m) }
func (b *countingBox) PutBatch(msgs []outbox.Message) error {
	b.batches++
	return b.recordingBox.PutBatch(msgs)
}

// What the tracker answers while a batch takes effect is recorded and
// queued together, not one disk write per command; the acks come before,
// once the final replies owed are recorded.
func TestPipelineGroupsTheEffectsReplies(t *testing.T) {
	st, err := store.Open(filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	box := &countingBox{}
	topics := apiv1.Scheme{Prefix: "mqlet/v1", Node: "n1"}
	g := NewGroup(st, box, zerolog.Nop())
	sender := reply.NewSender(topics, g.Publisher(), g.Recorder(), nil, zerolog.Nop())
	in := New(Options{Topics: topics, MaxPayloadBytes: 1 << 20, ApplyDeadline: time.Minute},
		st, sender, answeringTracker{sender}, &fakeScheduler{deletes: map[string]*int64{}}, &fakeEvents{}, noStatus{}, zerolog.Nop())
	p := NewPipeline(in, st, box, sender, PipelineOptions{Group: g}, zerolog.Nop())
	var wg sync.WaitGroup
	const n = 50
	for i := 0; i < n; i++ {
		id := fmt.Sprintf("g%d", i)
		tp, payload := cmCommand(id, fmt.Sprintf("cm-%d", i))
		wg.Add(1)
		p.Submit(Command{Topic: tp, Payload: payload, Ack: func() {
			defer wg.Done()
			// Acknowledged once accepted is queued and the final reply it
			// is owed recorded (the effects, answering it, come after).
			if reps := box.replies(t, id); len(reps) != 1 || reps[0].Phase != apiv1.Accepted {
				t.Errorf("%s acknowledged with replies %+v queued, want accepted", id, reps)
			}
			if !owes(t, st, id) {
				t.Errorf("%s acknowledged without its pending reply recorded", id)
			}
		}})
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	p.Run(ctx) // one batch: the n queued commands
	waitGroup(t, &wg, "acknowledgements")
	for i := 0; i < n; i++ {
		id := fmt.Sprintf("g%d", i)
		reps := box.replies(t, id)
		if len(reps) != 2 || reps[0].Phase != apiv1.Accepted || reps[1].Phase != apiv1.Succeeded {
			t.Fatalf("%s replies %+v, want accepted then succeeded", id, reps)
		}
		rec, ok, _ := st.LookupReply(id)
		if !ok || !strings.Contains(string(rec), `"succeeded"`) {
			t.Fatalf("%s record %s, want the succeeded reply", id, rec)
		}
	}
	if box.puts != 0 || box.batches != 2 {
		t.Fatalf("%d single puts and %d batches, want 0 and 2 (the commands' replies, then the effects')", box.puts, box.batches)
	}

	// Any other sender's reply waits for Run (or a Flush), then is written
	// with whatever came with it; after Run stops, writes go straight through.
	if err := sender.Send(apiv1.Reply{RequestID: "later", Phase: apiv1.Failed}); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := st.LookupReply("later"); ok || len(box.replies(t, "later")) != 0 {
		t.Fatal("a gathered reply was written before a flush")
	}
	ctx, cancel = context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); g.Run(ctx) }()
	Eventually := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	Eventually("the gathered reply flushed by Run", func() bool {
		_, ok, _ := st.LookupReply("later")
		return ok && len(box.replies(t, "later")) == 1
	})
	cancel()
	<-done
	if err := sender.Send(apiv1.Reply{RequestID: "after-stop", Phase: apiv1.Failed}); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := st.LookupReply("after-stop"); !ok || len(box.replies(t, "after-stop")) != 1 {
		t.Fatal("after Run stopped, a reply was not written at once")
	}
}

// The backlog is bounded by payload bytes too; one command is always let in.
func TestPipelineOverloadByBytes(t *testing.T) {
	r := newPipeRig(t, PipelineOptions{MaxBacklogBytes: 200})
	var wg sync.WaitGroup
	for i := 0; i < 4; i++ {
		tp, payload := cmCommand(fmt.Sprintf("y%d", i), fmt.Sprintf("cm-%d", i)) // 82 bytes each: two fit in 200
		wg.Add(1)
		r.pipe.Submit(Command{Topic: tp, Payload: payload, Ack: wg.Done})
	}
	r.run(t)
	waitGroup(t, &wg, "acknowledgements")
	var phases []string
	for i := 0; i < 4; i++ {
		reps := r.box.replies(t, fmt.Sprintf("y%d", i))
		if len(reps) != 1 {
			t.Fatalf("y%d: %+v", i, reps)
		}
		phases = append(phases, reps[0].Phase)
	}
	if fmt.Sprint(phases) != "[accepted accepted failed failed]" {
		t.Fatalf("phases %v", phases)
	}
}

// A signed command in a batch that is undone and handled again one by one
// runs: opening it in the batch spent its nonce, and the one-by-one pass
// must not take that for a replay. A replay of it afterwards still fails.
func TestPipelineFallbackKeepsSignedCommands(t *testing.T) {
	signed, ops, _ := signedRig(t, true)
	r := newPipeRig(t, PipelineOptions{})
	r.in.opts.Opener = signed.in.opts.Opener
	var wg sync.WaitGroup
	submit := func(tp string, payload []byte) {
		wg.Add(1)
		r.pipe.Submit(Command{Topic: tp, Payload: payload, Ack: wg.Done})
	}
	_, cm := cmCommand("s1", "signed")
	env := signedFor(t, ops, "apply", "s1", string(cm))
	submit("mqlet/v1/n1/cmd/apply/s1", env)
	// A List naming one object twice fails its store write and undoes the batch.
	dup := `{"apiVersion":"v1","kind":"List","items":[` +
		`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"twice"},"data":{"k":"1"}},` +
		`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"twice"},"data":{"k":"2"}}]}`
	submit("mqlet/v1/n1/cmd/apply/s2", signedFor(t, ops, "apply", "s2", dup))
	r.run(t)
	waitGroup(t, &wg, "two acknowledgements")
	if _, err := r.st.ConfigMap("default", "signed"); err != nil {
		t.Fatalf("the signed command of the undone batch did not run alone: %v; replies %+v", err, r.box.replies(t, "s1"))
	}
	wg.Add(1)
	r.pipe.Submit(Command{Topic: "mqlet/v1/n1/cmd/apply/s3", Payload: env, Ack: wg.Done})
	waitGroup(t, &wg, "the replay's acknowledgement")
	if got := r.box.replies(t, "s3"); len(got) != 1 || got[0].Phase != apiv1.Failed {
		t.Fatalf("the same envelope under another id was not refused: %+v", got)
	}
}

// owes reports whether the store holds a pending reply for id.
func owes(t *testing.T, st *store.Store, id string) bool {
	t.Helper()
	entries, err := st.ListPending()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range entries {
		if p.RequestID == id {
			return true
		}
	}
	return false
}
