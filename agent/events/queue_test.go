package events

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	v1 "k8s.io/api/core/v1"
)

// slowSink blocks its first Emit until released, as an fsync that takes
// its time; it keeps the reasons in the order it got them.
type slowSink struct {
	entered chan struct{}
	release chan struct{}
	once    sync.Once
	mu      sync.Mutex
	got     []string
}

func (s *slowSink) Emit(ev *v1.Event) {
	s.once.Do(func() {
		close(s.entered)
		<-s.release
	})
	s.mu.Lock()
	defer s.mu.Unlock()
	s.got = append(s.got, ev.InvolvedObject.Name)
}

func (s *slowSink) names() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.got...)
}

func startSlow(t *testing.T, opts Options) (*Recorder, *slowSink) {
	sink := &slowSink{entered: make(chan struct{}), release: make(chan struct{})}
	r := New(sink, opts, zerolog.Nop())
	go r.Event(testPod("p0"), v1.EventTypeNormal, "Started", "first")
	select {
	case <-sink.entered:
	case <-time.After(5 * time.Second):
		t.Fatal("the sink was never called")
	}
	return r, sink
}

// While the sink is stuck writing one event, other callers queue theirs
// and return; once it is free, every event reaches it, in order.
func TestSlowSinkDoesNotBlockCallers(t *testing.T) {
	r, sink := startSlow(t, Options{})
	returned := make(chan struct{})
	go func() {
		defer close(returned)
		for i := 1; i <= 20; i++ {
			r.Event(testPod(fmt.Sprintf("p%d", i)), v1.EventTypeNormal, "Started", "next")
		}
	}()
	select {
	case <-returned:
	case <-time.After(5 * time.Second):
		t.Fatal("callers waited for a slow sink")
	}
	if n := len(sink.names()); n != 0 {
		t.Fatalf("sink got %d events while stuck", n)
	}
	close(sink.release)
	deadline := time.Now().Add(5 * time.Second)
	for len(sink.names()) < 21 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	got := sink.names()
	if len(got) != 21 {
		t.Fatalf("sink got %d events, want 21", len(got))
	}
	for i, name := range got {
		if want := fmt.Sprintf("p%d", i); name != want {
			t.Fatalf("event %d is %s, want %s (order lost)", i, name, want)
		}
	}
	if s := r.Stats(); s.Emitted != 21 || s.Overflowed != 0 {
		t.Fatalf("stats %+v", s)
	}
}

// Past QueueSize events waiting, new ones are dropped and counted.
func TestQueueOverflowIsCounted(t *testing.T) {
	r, sink := startSlow(t, Options{QueueSize: 3})
	for i := 1; i <= 5; i++ {
		r.Event(testPod(fmt.Sprintf("p%d", i)), v1.EventTypeNormal, "Started", "next")
	}
	if s := r.Stats(); s.Overflowed != 2 || s.Emitted != 4 {
		t.Fatalf("stats %+v, want 2 overflowed and 4 emitted", s)
	}
	close(sink.release)
	deadline := time.Now().Add(5 * time.Second)
	for len(sink.names()) < 4 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if got := sink.names(); len(got) != 4 || got[3] != "p3" {
		t.Fatalf("sink got %v, want p0..p3", got)
	}
}
