package shellwire

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

func join(bs [][]byte) string {
	var s []string
	for _, b := range bs {
		s = append(s, string(b))
	}
	return strings.Join(s, ",")
}

func TestReorderDeliversInOrderOnce(t *testing.T) {
	r := NewReorder(8, 64)
	steps := []struct {
		seq  uint64
		data string
		want string
	}{
		{2, "b", ""},    // early: held
		{1, "a", "a,b"}, // fills the gap
		{1, "a", ""},    // QoS 1 redelivery
		{2, "b", ""},    // redelivery of a held-then-delivered one
		{4, "d", ""},    // held
		{4, "d", ""},    // duplicate of a held one
		{3, "c", "c,d"}, // in order again
		{5, "e", "e"},
	}
	for i, s := range steps {
		got, err := r.Add(s.seq, []byte(s.data))
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if join(got) != s.want {
			t.Fatalf("step %d (seq %d): got %q, want %q", i, s.seq, join(got), s.want)
		}
	}
	if r.Delivered() != 5 {
		t.Fatalf("delivered %d, want 5", r.Delivered())
	}
}

func TestReorderBoundsHostileNumbers(t *testing.T) {
	r := NewReorder(4, 10)
	if _, err := r.Add(0, nil); err == nil {
		t.Fatal("seq 0 accepted")
	}
	if _, err := r.Add(6, []byte("x")); !errors.Is(err, ErrTooFarAhead) {
		t.Fatalf("seq 6 with 1 next: %v, want ErrTooFarAhead", err)
	}
	if _, err := r.Add(1<<63, []byte("x")); !errors.Is(err, ErrTooFarAhead) {
		t.Fatalf("huge seq: %v", err)
	}
	if _, err := r.Add(2, []byte("12345678")); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Add(3, []byte("123")); !errors.Is(err, ErrBufferFull) {
		t.Fatalf("over maxBytes held: %v, want ErrBufferFull", err)
	}
	got, err := r.Add(1, []byte("a"))
	if err != nil || join(got) != "a,12345678" {
		t.Fatalf("got %q, %v", join(got), err)
	}
	if r.bytes != 0 || len(r.held) != 0 {
		t.Fatalf("buffer not emptied: %d bytes, %d held", r.bytes, len(r.held))
	}
}

func TestWindowBoundsBytesInFlight(t *testing.T) {
	w := NewWindow(10)
	ctx := context.Background()
	for i, n := range []int{4, 6} {
		seq, err := w.Reserve(ctx, n)
		if err != nil || seq != uint64(i+1) {
			t.Fatalf("reserve %d: seq %d, %v", n, seq, err)
		}
	}
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := w.Reserve(short, 1); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("full window let a byte through: %v", err)
	}
	got := make(chan uint64)
	go func() {
		seq, err := w.Reserve(ctx, 4)
		if err != nil {
			t.Error(err)
		}
		got <- seq
	}()
	select {
	case <-got:
		t.Fatal("reserved before any ack")
	case <-time.After(20 * time.Millisecond):
	}
	if err := w.Ack(1); err != nil { // frees 4
		t.Fatal(err)
	}
	select {
	case seq := <-got:
		if seq != 3 {
			t.Fatalf("seq %d, want 3", seq)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("an ack did not wake the waiting sender")
	}
	if w.InFlight() != 10 {
		t.Fatalf("in flight %d, want 10", w.InFlight())
	}
	if err := w.Ack(1); err != nil || w.InFlight() != 10 {
		t.Fatalf("an old ack changed the window: %v, %d", err, w.InFlight())
	}
	if err := w.Ack(9); !errors.Is(err, ErrBadAck) {
		t.Fatalf("ack past the last sent: %v, want ErrBadAck", err)
	}
	if err := w.Ack(3); err != nil || w.InFlight() != 0 {
		t.Fatalf("ack of all: %v, in flight %d", err, w.InFlight())
	}
	// A message larger than the window goes alone.
	if _, err := w.Reserve(ctx, 100); err != nil {
		t.Fatal(err)
	}
}
