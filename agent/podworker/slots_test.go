package podworker

import (
	"context"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// A freed slot goes to a waiting sync of a running pod before an older
// waiting first start.
func TestSlotGoesToARunningPodFirst(t *testing.T) {
	s := newSlotSet(1, nil, zerolog.Nop())
	ctx := context.Background()
	held, err := s.acquire(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	order := make(chan string, 2)
	wait := func(name string, running bool) {
		_ = s.with(ctx, name, running, func(func(string)) error { order <- name; return nil })
	}
	go wait("start", false)
	waitUntil(t, "the start waiting", func() bool { _, o := s.waiters(); return o == 1 })
	go wait("exited", true)
	waitUntil(t, "the exited pod waiting", func() bool { r, _ := s.waiters(); return r == 1 })
	s.release(held)
	for _, want := range []string{"exited", "start"} {
		select {
		case got := <-order:
			if got != want {
				t.Fatalf("slot went to %q, want %q first", got, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s never got the slot", want)
		}
	}
}

// A sync that gives up waiting leaves no waiter behind, and the slot is
// still handed out.
func TestSlotWaitCancelled(t *testing.T) {
	s := newSlotSet(1, nil, zerolog.Nop())
	held, err := s.acquire(context.Background(), false)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { _, err := s.acquire(ctx, true); done <- err }()
	waitUntil(t, "waiting", func() bool { r, _ := s.waiters(); return r == 1 })
	cancel()
	if err := <-done; err == nil {
		t.Fatal("a cancelled wait got a slot")
	}
	if r, o := s.waiters(); r+o != 0 {
		t.Fatalf("%d waiters left", r+o)
	}
	s.release(held)
	if _, err := s.acquire(context.Background(), false); err != nil {
		t.Fatal(err)
	}
}
