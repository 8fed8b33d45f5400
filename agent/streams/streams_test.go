package streams

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

func TestBoundCancelAndStop(t *testing.T) {
	m := New(2)
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { m.Run(ctx); close(done) }()

	var ended atomic.Int32
	block := func(ctx context.Context) { <-ctx.Done(); ended.Add(1) }
	if err := m.Start("a", block); err != nil {
		t.Fatal(err)
	}
	if err := m.Start("a", block); !errors.Is(err, ErrDuplicate) {
		t.Fatalf("same id twice: %v, want ErrDuplicate", err)
	}
	if err := m.Start("b", block); err != nil {
		t.Fatal(err)
	}
	if err := m.Start("c", block); !errors.Is(err, ErrBusy) {
		t.Fatalf("third: %v, want ErrBusy", err)
	}
	if !m.Cancel("a") {
		t.Fatal("cancel of a running request reported none")
	}
	deadline := time.Now().Add(10 * time.Second)
	for m.Len() != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("cancelled request still counted: %d running", m.Len())
		}
		time.Sleep(5 * time.Millisecond)
	}
	if m.Cancel("nope") {
		t.Fatal("cancel of an unknown id reported one")
	}
	stop()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
	if ended.Load() != 2 {
		t.Fatalf("%d requests saw their context end, want 2", ended.Load())
	}
	if err := m.Start("d", block); !errors.Is(err, ErrStopped) {
		t.Fatalf("start after stop: %v, want ErrStopped", err)
	}
}
