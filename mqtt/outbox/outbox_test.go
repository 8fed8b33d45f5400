package outbox

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	bolt "go.etcd.io/bbolt"
)

const waitFor = 5 * time.Second

// fakeDelivery is completed by the test (or at once in auto-ack mode).
type fakeDelivery struct {
	done chan struct{}
	err  error
	once sync.Once
}

func (d *fakeDelivery) Done() <-chan struct{} { return d.done }
func (d *fakeDelivery) Err() error            { <-d.done; return d.err }

// fakePublisher records sends and lets the test drive connections and acks.
type fakePublisher struct {
	mu          sync.Mutex
	up, down    chan struct{}
	autoAck     bool
	sent        []Message
	pending     []*fakeDelivery
	inflight    int
	maxInflight int
	failNext    bool
	sentSignal  chan struct{}
}

func newFakePublisher(autoAck bool) *fakePublisher {
	return &fakePublisher{up: make(chan struct{}), down: make(chan struct{}), autoAck: autoAck, sentSignal: make(chan struct{}, 1)}
}

func (p *fakePublisher) Connection() (<-chan struct{}, <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.up, p.down
}

func (p *fakePublisher) connect() {
	p.mu.Lock()
	defer p.mu.Unlock()
	close(p.up)
}

// disconnect ends the current connection and prepares the next one.
func (p *fakePublisher) disconnect() {
	p.mu.Lock()
	defer p.mu.Unlock()
	close(p.down)
	p.up, p.down = make(chan struct{}), make(chan struct{})
	p.pending, p.inflight = nil, 0
}

func (p *fakePublisher) Send(ctx context.Context, m Message) (Delivery, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	d := &fakeDelivery{done: make(chan struct{})}
	p.sent = append(p.sent, m)
	select {
	case p.sentSignal <- struct{}{}:
	default:
	}
	if p.failNext {
		p.failNext = false
		d.err = errors.New("broker refused")
		close(d.done)
		return d, nil
	}
	if p.autoAck {
		close(d.done)
		return d, nil
	}
	p.pending = append(p.pending, d)
	p.inflight++
	if p.inflight > p.maxInflight {
		p.maxInflight = p.inflight
	}
	return d, nil
}

// ackOldest completes the oldest pending delivery; false if none.
func (p *fakePublisher) ackOldest() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.pending) == 0 {
		return false
	}
	d := p.pending[0]
	p.pending = p.pending[1:]
	p.inflight--
	d.once.Do(func() { close(d.done) })
	return true
}

func (p *fakePublisher) sentTopicsPayloads() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for _, m := range p.sent {
		out = append(out, m.Topic+"="+string(m.Payload))
	}
	return out
}

func (p *fakePublisher) sentCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.sent)
}

func openTest(t *testing.T, path string, maxBytes int64, opts ...Option) *Outbox {
	t.Helper()
	o, err := Open(path, maxBytes, zerolog.Nop(), opts...)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return o
}

// runOutbox runs o.Run until the test ends and checks that it stopped.
func runOutbox(t *testing.T, o *Outbox, pub Publisher) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- o.Run(ctx, pub) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if !errors.Is(err, context.Canceled) {
				t.Errorf("Run returned %v, want context.Canceled", err)
			}
		case <-time.After(waitFor):
			t.Error("Run did not stop after cancel")
		}
	})
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond) // polling a test condition with a deadline
	}
}

func mustPut(t *testing.T, o *Outbox, m Message) {
	t.Helper()
	if err := o.Put(m); err != nil {
		t.Fatalf("Put(%s): %v", m.Topic, err)
	}
}

func event(i int) Message {
	return Message{Topic: "n/events", Payload: []byte(fmt.Sprintf("e%d", i)), QoS: 1}
}

func state(v string) Message {
	return Message{Topic: "n/state", Payload: []byte(v), QoS: 1, Retained: true}
}

func TestCoalesceAndFIFOOrder(t *testing.T) {
	o := openTest(t, filepath.Join(t.TempDir(), "ob.db"), 0)
	defer o.Close()
	status := func(v string) Message {
		return Message{Topic: "n/pods/default/web", Payload: []byte(v), QoS: 1, Coalesce: true}
	}
	mustPut(t, o, event(1))
	mustPut(t, o, state("s1"))
	mustPut(t, o, status("p1"))
	mustPut(t, o, event(2))
	mustPut(t, o, state("s2"))
	mustPut(t, o, event(3))
	mustPut(t, o, state("s3"))
	mustPut(t, o, status("p2"))
	if st := o.Stats(); st.Depth != 5 {
		t.Fatalf("depth after coalescing = %d, want 5 (3 events, 1 state, 1 pod)", st.Depth)
	}

	pub := newFakePublisher(true)
	runOutbox(t, o, pub)
	pub.connect()
	waitUntil(t, "outbox drained", func() bool { return o.Stats().Depth == 0 })
	want := []string{"n/events=e1", "n/events=e2", "n/events=e3", "n/state=s3", "n/pods/default/web=p2"}
	if got := pub.sentTopicsPayloads(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("sent %v, want %v", got, want)
	}
	if st := o.Stats(); st.Bytes != 0 || st.Sent != 5 {
		t.Fatalf("stats after drain = %+v, want 0 bytes and 5 sent", st)
	}
	// A Put while connected and idle is sent promptly (Wake path).
	mustPut(t, o, event(4))
	waitUntil(t, "prompt send of a new put", func() bool { return pub.sentCount() == 6 })
}

func TestOverflowDropsOldestNonCoalesced(t *testing.T) {
	one := int64(len(encode(event(10))) + entryOverhead)
	o := openTest(t, filepath.Join(t.TempDir(), "ob.db"), 5*one+int64(len(encode(state("s")))+entryOverhead))
	defer o.Close()
	mustPut(t, o, state("s"))
	for i := 10; i < 20; i++ {
		mustPut(t, o, event(i))
	}
	st := o.Stats()
	if st.Dropped != 5 {
		t.Fatalf("dropped = %d, want 5", st.Dropped)
	}
	if st.Depth != 6 || st.Bytes > o.maxBytes {
		t.Fatalf("stats = %+v, want depth 6 within %d bytes", st, o.maxBytes)
	}
	pub := newFakePublisher(true)
	runOutbox(t, o, pub)
	pub.connect()
	waitUntil(t, "outbox drained", func() bool { return o.Stats().Depth == 0 })
	want := []string{"n/state=s", "n/events=e15", "n/events=e16", "n/events=e17", "n/events=e18", "n/events=e19"}
	if got := pub.sentTopicsPayloads(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("sent %v, want %v (retained kept, oldest events dropped)", got, want)
	}
}

// Full of final replies, the outbox refuses (and counts) a status and an
// event rather than drop a final reply for them; a message larger than
// the bound is refused too.
func TestFullOfFinalRepliesRefusesTelemetryAndCounts(t *testing.T) {
	f := final("r1", 100)
	o := openTest(t, filepath.Join(t.TempDir(), "ob.db"), int64(len(encode(f))+entryOverhead))
	defer o.Close()
	mustPut(t, o, f)
	status := Message{Topic: "n/pods/a/c", Payload: make([]byte, 100), QoS: 1, Retained: true, Coalesce: true}
	if err := o.Put(status); !errors.Is(err, ErrFull) {
		t.Fatalf("a status Put over a bound full of final replies = %v, want ErrFull", err)
	}
	if err := o.Put(event(1)); !errors.Is(err, ErrFull) {
		t.Fatalf("an event Put over a bound full of final replies = %v, want ErrFull", err)
	}
	if err := o.Put(Message{Topic: "big", Payload: make([]byte, 1000), Final: true}); !errors.Is(err, ErrFull) {
		t.Fatalf("Put larger than the bound = %v, want ErrFull", err)
	}
	if st := o.Stats(); st.Dropped != 3 || st.DroppedFinal != 1 || st.Depth != 1 {
		t.Fatalf("stats = %+v, want 3 dropped (1 final), depth 1", st)
	}
}

func final(id string, size int) Message {
	return Message{Topic: "n/reply/" + id, Payload: append([]byte(id+"="), make([]byte, size)...), QoS: 1, Final: true}
}

func progress(id string) Message {
	return Message{Topic: "n/reply/" + id, Payload: []byte(id + "-accepted"), QoS: 1}
}

// When the outbox must drop, it drops telemetry (events, metrics, accepted
// and in-progress replies) first, then retained statuses, and final
// replies last, the oldest first within each kind; each kind displaces
// only its own kind or below. Every drop is counted, final replies apart.
func TestDropOrderKeepsFinalRepliesLast(t *testing.T) {
	metrics := Message{Topic: "n/metrics", Payload: []byte("mm"), QoS: 0, Coalesce: true}
	status := func(pod string) Message {
		return Message{Topic: "n/pods/ns/" + pod, Payload: []byte(pod), QoS: 1, Retained: true, Coalesce: true}
	}
	size := func(ms ...Message) (n int64) {
		for _, m := range ms {
			n += int64(len(encode(m)) + entryOverhead)
		}
		return n
	}
	f1, f2, f3 := final("f1", 20), final("f2", 20), final("f3", 200)
	stored := []Message{f1, event(1), status("a"), progress("p1"), metrics, f2, status("b"), event(2)}
	// Each case's bound is what it keeps: the put must drop the rest.
	cases := []struct {
		name         string
		stored, keep []Message // keep ends with the message put
		dropped      uint64
		droppedFinal uint64
	}{
		{"an event displaces the oldest telemetry only", stored,
			[]Message{f1, status("a"), progress("p1"), metrics, f2, status("b"), event(2), event(3)}, 1, 0},
		{"a final reply displaces all telemetry before any status or final reply", stored,
			[]Message{f1, status("a"), f2, status("b"), f3}, 4, 0},
		{"a final reply displaces statuses, the oldest first, before final replies", stored,
			[]Message{f1, f2, status("b"), f3}, 5, 0},
		{"a final reply displaces the oldest final reply last", stored,
			[]Message{f2, f3}, 7, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o := openTest(t, filepath.Join(t.TempDir(), "ob.db"), size(tc.keep...))
			defer o.Close()
			if err := o.PutBatch(tc.stored); err != nil {
				t.Fatal(err)
			}
			if st := o.Stats(); st.Dropped != 0 {
				t.Fatalf("the bound is too small for the stored messages: %+v", st)
			}
			mustPut(t, o, tc.keep[len(tc.keep)-1])
			entries, err := o.readFrom(0, 100)
			if err != nil {
				t.Fatal(err)
			}
			var got, want []string
			for _, e := range entries {
				got = append(got, e.msg.Topic+"="+string(e.msg.Payload[:2]))
			}
			for _, m := range tc.keep {
				want = append(want, m.Topic+"="+string(m.Payload[:2]))
			}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("kept %v, want %v", got, want)
			}
			if st := o.Stats(); st.Dropped != tc.dropped || st.DroppedFinal != tc.droppedFinal || st.Bytes > o.maxBytes {
				t.Fatalf("stats %+v, want %d dropped, %d final, within %d bytes", st, tc.dropped, tc.droppedFinal, o.maxBytes)
			}
			select {
			case <-o.Drops():
			default:
				t.Fatal("no drop signal after a drop")
			}
		})
	}
	// Full of final replies, a status is refused: no final reply goes for it.
	o := openTest(t, filepath.Join(t.TempDir(), "ob.db"), size(f1, f2))
	defer o.Close()
	mustPut(t, o, f1)
	mustPut(t, o, f2)
	if err := o.Put(status("c")); !errors.Is(err, ErrFull) {
		t.Fatalf("a status over a bound full of final replies: %v, want ErrFull", err)
	}
	if st := o.Stats(); st.Dropped != 1 || st.DroppedFinal != 0 || st.Depth != 2 {
		t.Fatalf("stats %+v, want the status alone refused and both final replies kept", st)
	}
}

func TestPersistsAcrossReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ob.db")
	o := openTest(t, path, 0)
	mustPut(t, o, event(1))
	mustPut(t, o, state("s1"))
	mustPut(t, o, event(2))
	if err := o.Close(); err != nil {
		t.Fatal(err)
	}
	o = openTest(t, path, 0)
	defer o.Close()
	if st := o.Stats(); st.Depth != 3 {
		t.Fatalf("depth after reopen = %d, want 3", st.Depth)
	}
	mustPut(t, o, state("s2")) // coalescing index survived too
	mustPut(t, o, event(3))
	pub := newFakePublisher(true)
	runOutbox(t, o, pub)
	pub.connect()
	waitUntil(t, "outbox drained", func() bool { return o.Stats().Depth == 0 })
	want := []string{"n/events=e1", "n/events=e2", "n/state=s2", "n/events=e3"}
	if got := pub.sentTopicsPayloads(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("sent %v, want %v", got, want)
	}
}

func TestDropCounterPersists(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ob.db")
	one := int64(len(encode(event(1))) + entryOverhead)
	o := openTest(t, path, one)
	mustPut(t, o, event(1))
	mustPut(t, o, event(2))
	o.Close()
	o = openTest(t, path, one)
	defer o.Close()
	if st := o.Stats(); st.Dropped != 1 {
		t.Fatalf("dropped after reopen = %d, want 1", st.Dropped)
	}
}

func TestBoundedInflight(t *testing.T) {
	o := openTest(t, filepath.Join(t.TempDir(), "ob.db"), 0, WithMaxInflight(3))
	defer o.Close()
	for i := 0; i < 20; i++ {
		mustPut(t, o, event(i))
	}
	pub := newFakePublisher(false)
	runOutbox(t, o, pub)
	pub.connect()
	for acked := 0; acked < 20; {
		waitUntil(t, "a send to ack", func() bool {
			pub.mu.Lock()
			defer pub.mu.Unlock()
			// The window must fill up to its bound before we ack.
			return pub.inflight == min(3, 20-acked)
		})
		if pub.ackOldest() {
			acked++
		}
	}
	waitUntil(t, "outbox drained", func() bool { return o.Stats().Depth == 0 })
	pub.mu.Lock()
	defer pub.mu.Unlock()
	if pub.maxInflight != 3 {
		t.Fatalf("max in flight = %d, want 3", pub.maxInflight)
	}
	for i, m := range pub.sent {
		if string(m.Payload) != fmt.Sprintf("e%d", i) {
			t.Fatalf("send %d was %s, want e%d (FIFO)", i, m.Payload, i)
		}
	}
}

func TestUnackedResentOnNextConnection(t *testing.T) {
	o := openTest(t, filepath.Join(t.TempDir(), "ob.db"), 0, WithMaxInflight(2))
	defer o.Close()
	for i := 0; i < 3; i++ {
		mustPut(t, o, event(i))
	}
	pub := newFakePublisher(false)
	runOutbox(t, o, pub)
	pub.connect()
	waitUntil(t, "window full", func() bool { return pub.sentCount() == 2 })
	pub.ackOldest() // e0 confirmed; e1 still in flight when the link drops
	waitUntil(t, "e0 removed and e2 sent", func() bool { return o.Stats().Depth == 2 && pub.sentCount() == 3 })
	pub.disconnect()
	if st := o.Stats(); st.Depth != 2 {
		t.Fatalf("depth after losing the link = %d, want 2", st.Depth)
	}
	pub.mu.Lock()
	pub.autoAck = true
	pub.mu.Unlock()
	pub.connect()
	waitUntil(t, "drained after reconnect", func() bool { return o.Stats().Depth == 0 })
	want := []string{"n/events=e0", "n/events=e1", "n/events=e2", "n/events=e1", "n/events=e2"}
	if got := pub.sentTopicsPayloads(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("sent %v, want %v", got, want)
	}
}

func TestPublishErrorWaitsForNextConnection(t *testing.T) {
	o := openTest(t, filepath.Join(t.TempDir(), "ob.db"), 0, WithMaxInflight(1), WithRetryDelay(time.Hour))
	defer o.Close()
	mustPut(t, o, event(1))
	mustPut(t, o, event(2))
	pub := newFakePublisher(true)
	pub.failNext = true
	runOutbox(t, o, pub)
	pub.connect()
	waitUntil(t, "first (failing) send", func() bool { return pub.sentCount() == 1 })
	mustPut(t, o, event(3)) // a wake must not restart sending on the failed link
	select {
	case <-pub.sentSignal: // the first send's signal
	default:
	}
	select {
	case <-pub.sentSignal:
		t.Fatalf("outbox kept sending after a failure on the same connection: %v", pub.sentTopicsPayloads())
	case <-time.After(200 * time.Millisecond):
	}
	pub.disconnect()
	pub.connect()
	waitUntil(t, "drained after reconnect", func() bool { return o.Stats().Depth == 0 })
	want := []string{"n/events=e1", "n/events=e1", "n/events=e2", "n/events=e3"}
	if got := pub.sentTopicsPayloads(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("sent %v, want %v", got, want)
	}
}

func TestReplacedWhileInflight(t *testing.T) {
	o := openTest(t, filepath.Join(t.TempDir(), "ob.db"), 0, WithMaxInflight(1))
	defer o.Close()
	pub := newFakePublisher(false)
	runOutbox(t, o, pub)
	pub.connect()
	mustPut(t, o, state("s1"))
	waitUntil(t, "s1 in flight", func() bool { return pub.sentCount() == 1 })
	mustPut(t, o, state("s2"))
	pub.ackOldest() // the ack of s1 must not remove s2
	waitUntil(t, "s2 sent", func() bool { return pub.sentCount() == 2 })
	if st := o.Stats(); st.Depth != 1 {
		t.Fatalf("depth = %d, want 1 (s2 unacknowledged)", st.Depth)
	}
	pub.ackOldest()
	waitUntil(t, "drained", func() bool { return o.Stats().Depth == 0 })
	if got := pub.sentTopicsPayloads(); fmt.Sprint(got) != "[n/state=s1 n/state=s2]" {
		t.Fatalf("sent %v", got)
	}
}

func TestEncodeRoundTrip(t *testing.T) {
	for _, m := range []Message{
		{Topic: "a/b", Payload: []byte("x"), QoS: 1, Retained: true},
		{Topic: "a/c", Payload: nil, QoS: 0, Coalesce: true},
		{Topic: "ü/ev", Payload: []byte{0, 1, 2}, QoS: 2},
		{Topic: "n/reply/x", Payload: []byte("{}"), QoS: 1, Final: true},
	} {
		got, err := decode(encode(m))
		if err != nil {
			t.Fatal(err)
		}
		if got.Topic != m.Topic || string(got.Payload) != string(m.Payload) || got.QoS != m.QoS || got.Retained != m.Retained || got.Coalesce != m.Coalesce || got.Final != m.Final {
			t.Fatalf("round trip %+v -> %+v", m, got)
		}
	}
	if _, err := decode([]byte{0, 1, 200}); err == nil {
		t.Fatal("decode accepted a truncated entry")
	}
}

// A batch is stored as the same Puts one after another would be: in order,
// coalesced within the batch, overflow dropping the oldest events, and a
// refused message not stopping the others.
func TestPutBatchAsSequentialPuts(t *testing.T) {
	one := int64(len(encode(event(10))) + entryOverhead)
	o := openTest(t, filepath.Join(t.TempDir(), "ob.db"), 4*one+int64(len(encode(state("s1")))+entryOverhead))
	defer o.Close()
	batch := []Message{state("s1"), event(10), {Topic: "", Payload: []byte("x")}, event(11), state("s2")}
	for i := 12; i < 16; i++ {
		batch = append(batch, event(i))
	}
	err := o.PutBatch(batch)
	if err == nil || !strings.Contains(err.Error(), "empty topic") {
		t.Fatalf("PutBatch error %v, want the empty topic refused", err)
	}
	st := o.Stats()
	if st.Depth != 5 || st.Dropped != 2 || st.Bytes > o.maxBytes {
		t.Fatalf("stats = %+v, want depth 5 (1 state, 4 events), 2 dropped, within %d bytes", st, o.maxBytes)
	}
	pub := newFakePublisher(true)
	runOutbox(t, o, pub)
	pub.connect()
	waitUntil(t, "outbox drained", func() bool { return o.Stats().Depth == 0 })
	want := []string{"n/state=s2", "n/events=e12", "n/events=e13", "n/events=e14", "n/events=e15"}
	if got := pub.sentTopicsPayloads(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("sent %v, want %v", got, want)
	}
}

// Entries handed to the publisher and waiting for their acknowledgement
// are on their way: a full outbox drops the ones not yet sent, or refuses,
// never those (a drop would count as lost a message that arrives). Once
// the connection is gone they count as unsent again.
func TestInflightEntriesAreNotDropped(t *testing.T) {
	f := func(i int) Message { return final(fmt.Sprintf("r%d", i), 20) }
	one := int64(len(encode(f(0))) + entryOverhead)
	o := openTest(t, filepath.Join(t.TempDir(), "ob.db"), 3*one, WithMaxInflight(2))
	defer o.Close()
	for i := range 3 {
		mustPut(t, o, f(i))
	}
	pub := newFakePublisher(false)
	runOutbox(t, o, pub)
	pub.connect()
	waitUntil(t, "two entries in flight", func() bool { return pub.sentCount() == 2 })
	mustPut(t, o, f(3)) // drops r2, the oldest not in flight
	mustPut(t, o, f(4)) // drops r3
	stored := func() string {
		entries, err := o.readFrom(0, 10)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, e := range entries {
			got = append(got, strings.TrimPrefix(e.msg.Topic, "n/reply/"))
		}
		return fmt.Sprint(got)
	}
	if got, want := stored(), "[r0 r1 r4]"; got != want {
		t.Fatalf("stored %v, want %s", got, want)
	}
	if st := o.Stats(); st.Dropped != 2 || st.DroppedFinal != 2 {
		t.Fatalf("stats %+v, want r2 and r3 dropped", st)
	}
	pub.disconnect()
	waitUntil(t, "nothing in flight after the connection is lost", func() bool {
		o.mu.Lock()
		defer o.mu.Unlock()
		return o.sentBelow == 0
	})
	mustPut(t, o, f(5)) // r0 is no longer on its way: the oldest goes
	if got, want := stored(), "[r1 r4 r5]"; got != want {
		t.Fatalf("stored %v, want %s", got, want)
	}
}

// With only entries in flight left to drop, a message is refused.
func TestFullOfInflightEntriesRefuses(t *testing.T) {
	f := func(i int) Message { return final(fmt.Sprintf("r%d", i), 20) }
	one := int64(len(encode(f(0))) + entryOverhead)
	o := openTest(t, filepath.Join(t.TempDir(), "ob.db"), 2*one, WithMaxInflight(2))
	defer o.Close()
	mustPut(t, o, f(0))
	mustPut(t, o, f(1))
	pub := newFakePublisher(false)
	runOutbox(t, o, pub)
	pub.connect()
	waitUntil(t, "two entries in flight", func() bool { return pub.sentCount() == 2 })
	if err := o.Put(f(2)); !errors.Is(err, ErrFull) {
		t.Fatalf("Put with only entries in flight to drop: %v, want ErrFull", err)
	}
	if st := o.Stats(); st.Dropped != 1 || st.DroppedFinal != 1 || st.Depth != 2 {
		t.Fatalf("stats %+v, want the new reply refused, both in flight kept", st)
	}
}

// A store written before the rank index gets it at Open: drops then go in
// rank order as in a new one.
func TestRankIndexBuiltForAnOlderStore(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ob.db")
	f1 := final("f1", 20)
	one := int64(len(encode(f1)) + entryOverhead)
	o := openTest(t, path, 0)
	mustPut(t, o, f1)
	mustPut(t, o, event(1))
	if err := o.db.Update(func(tx *bolt.Tx) error { return tx.DeleteBucket(bucketRanks) }); err != nil {
		t.Fatal(err)
	}
	if err := o.Close(); err != nil {
		t.Fatal(err)
	}
	o = openTest(t, path, one+int64(len(encode(event(1)))+entryOverhead))
	defer o.Close()
	mustPut(t, o, event(2)) // drops event 1, not the older final reply
	entries, err := o.readFrom(0, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 2 || entries[0].msg.Topic != "n/reply/f1" || string(entries[1].msg.Payload) != "e2" {
		t.Fatalf("stored %+v, want f1 and e2", entries)
	}
	if st := o.Stats(); st.Dropped != 1 || st.DroppedFinal != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// Through puts of every kind, coalescing, drops and acknowledgements, the
// rank index names exactly the stored entries.
func TestRankIndexFollowsTheEntries(t *testing.T) {
	o := openTest(t, filepath.Join(t.TempDir(), "ob.db"), 4096, WithMaxInflight(3))
	defer o.Close()
	pub := newFakePublisher(false)
	runOutbox(t, o, pub)
	check := func(when string) {
		t.Helper()
		err := o.db.View(func(tx *bolt.Tx) error {
			entries, ranks := tx.Bucket(bucketEntries), tx.Bucket(bucketRanks)
			n := 0
			if err := entries.ForEach(func(k, v []byte) error {
				n++
				if ranks.Get(rankKey(rankOf(v), k)) == nil {
					t.Errorf("%s: entry %x has no index key", when, k)
				}
				return nil
			}); err != nil {
				return err
			}
			if got := ranks.Stats().KeyN; got != n {
				t.Errorf("%s: %d index keys for %d entries", when, got, n)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	for i := range 200 {
		var m Message
		switch i % 4 {
		case 0:
			m = event(i)
		case 1:
			m = Message{Topic: fmt.Sprintf("n/pods/ns/p%d", i%7), Payload: make([]byte, 40), QoS: 1, Retained: true}
		case 2:
			m = Message{Topic: "n/metrics", Payload: make([]byte, 60), Coalesce: true}
		case 3:
			m = final(fmt.Sprintf("r%d", i), 30)
		}
		_ = o.Put(m) // some are refused when only final replies are left
		switch i {
		case 50:
			pub.connect()
		case 120:
			pub.disconnect()
		}
		if i > 50 && i < 120 && i%5 == 0 {
			pub.ackOldest()
		}
	}
	pub.disconnect()
	check("after the puts")
}

// A publish the broker never acknowledges on a connection that stays up
// (a cluster member that swallowed it) is sent again after the ack
// timeout, with everything after it, and nothing is lost or reordered.
func TestUnacknowledgedSendIsResentAfterTheAckTimeout(t *testing.T) {
	o := openTest(t, filepath.Join(t.TempDir(), "ob.db"), 0, WithMaxInflight(2), WithAckTimeout(100*time.Millisecond), WithRetryDelay(10*time.Millisecond))
	defer o.Close()
	mustPut(t, o, event(0))
	mustPut(t, o, event(1))
	pub := newFakePublisher(false)
	runOutbox(t, o, pub)
	pub.connect()
	waitUntil(t, "both sent", func() bool { return pub.sentCount() == 2 })
	// Neither is acknowledged: the outbox must send them again on the same
	// connection once the ack timeout passes.
	waitUntil(t, "both sent again", func() bool { return pub.sentCount() == 4 })
	if st := o.Stats(); st.Depth != 2 {
		t.Fatalf("depth %d before any ack, want 2 (nothing removed unconfirmed)", st.Depth)
	}
	pub.mu.Lock()
	pub.autoAck = true
	pending := pub.pending
	pub.pending = nil
	pub.mu.Unlock()
	_ = pending // the swallowed deliveries stay incomplete, as the broker left them
	waitUntil(t, "drained once acknowledged", func() bool { return o.Stats().Depth == 0 })
	got := pub.sentTopicsPayloads()
	if len(got) < 4 || fmt.Sprint(got[:4]) != "[n/events=e0 n/events=e1 n/events=e0 n/events=e1]" {
		t.Fatalf("sent %v, want e0 e1 then both again in order", got)
	}
}
