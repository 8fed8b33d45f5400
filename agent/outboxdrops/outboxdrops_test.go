package outboxdrops

import (
	"context"
	"path/filepath"
	"regexp"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/mqlet/mqlet/mqtt/outbox"
)

// sink records node events and queues each as the real event sink does,
// into the same outbox.
type sink struct {
	box    *outbox.Outbox
	mu     sync.Mutex
	events []string
	added  chan struct{}
}

func (s *sink) NodeEvent(eventType, reason, message string) {
	s.mu.Lock()
	s.events = append(s.events, eventType+" "+reason+": "+message)
	s.mu.Unlock()
	_ = s.box.Put(outbox.Message{Topic: "n/events", Payload: []byte(message), QoS: 1})
	s.added <- struct{}{}
}

func (s *sink) list() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.events...)
}

func (s *sink) next(t *testing.T) string {
	t.Helper()
	select {
	case <-s.added:
		l := s.list()
		return l[len(l)-1]
	case <-time.After(30 * time.Second):
		t.Fatalf("no event; had %v", s.list())
		return ""
	}
}

var countRe = regexp.MustCompile(`dropped (\d+) queued messages \((\d+) of them final replies\)`)

func counts(t *testing.T, event string) (dropped, final int) {
	t.Helper()
	m := countRe.FindStringSubmatch(event)
	if m == nil {
		t.Fatalf("event without counts: %q", event)
	}
	d, _ := strconv.Atoi(m[1])
	f, _ := strconv.Atoi(m[2])
	return d, f
}

func finalReply(i int) outbox.Message {
	return outbox.Message{Topic: "n/reply/r" + strconv.Itoa(i), Payload: make([]byte, 200), QoS: 1, Final: true}
}

// A burst of drops is one Warning event with the count (final replies
// apart); the report's own event, refused by an outbox full of final
// replies, is not reported on its own (it would repeat forever while
// offline), but is counted into the next report.
func TestOneEventPerBurstWithTheCount(t *testing.T) {
	one := finalReply(0)
	box, err := outbox.Open(filepath.Join(t.TempDir(), "ob.db"), 10*int64(len(one.Payload)+len(one.Topic)+16), zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	defer box.Close()
	s := &sink{box: box, added: make(chan struct{}, 16)}
	r := New(box, s, 50*time.Millisecond, 200*time.Millisecond, zerolog.Nop())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.Run(ctx) }()
	defer func() { cancel(); <-done }()

	// 40 final replies into room for 10 (one batch: one burst): 30 dropped.
	batch := make([]outbox.Message, 40)
	for i := range batch {
		batch[i] = finalReply(i)
	}
	if err := box.PutBatch(batch); err != nil {
		t.Fatal(err)
	}
	ev := s.next(t)
	if d, f := counts(t, ev); d != 30 || f != 30 {
		t.Fatalf("first report %q: want 30 dropped, 30 final", ev)
	}
	if st := box.Stats(); st.Dropped != 31 {
		t.Fatalf("dropped %d, want 31 (30 replies and the report's own event, refused)", st.Dropped)
	}
	// The refused report alone makes no event; after it, more drops make
	// one that counts it too.
	if err := box.PutBatch(batch[:3]); err != nil {
		t.Fatal(err)
	}
	ev = s.next(t)
	if d, f := counts(t, ev); d != 4 || f != 3 {
		t.Fatalf("second report %q: want 4 dropped (3 final replies and the refused report)", ev)
	}
	if n := len(s.list()); n != 2 {
		t.Fatalf("%d events, want 2: %v", n, s.list())
	}
}
