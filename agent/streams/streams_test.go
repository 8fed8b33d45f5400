package streams

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"
)

func TestBoundCancelAndStop(t *testing.T) {
	m := New(Limits{Max: 2})
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { m.Run(ctx); close(done) }()

	var ended atomic.Int32
	block := func(ctx context.Context) { <-ctx.Done(); ended.Add(1) }
	if err := m.Start("a", Kind{}, block); err != nil {
		t.Fatal(err)
	}
	if err := m.Start("a", Kind{}, block); !errors.Is(err, ErrDuplicate) {
		t.Fatalf("same id twice: %v, want ErrDuplicate", err)
	}
	if err := m.Start("b", Kind{}, block); err != nil {
		t.Fatal(err)
	}
	if err := m.Start("c", Kind{}, block); !errors.Is(err, ErrBusy) {
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
	if err := m.Start("d", Kind{}, block); !errors.Is(err, ErrStopped) {
		t.Fatalf("start after stop: %v, want ErrStopped", err)
	}
}

// Followers nobody reads cannot take the one-shot requests' slots: they are
// bounded in all and per requester, and one whose reader is silent ends
// with ErrUnread while a touched one runs on.
func TestFollowersAreBoundedAndDroppedWhenUnread(t *testing.T) {
	m := New(Limits{Max: 8, MaxFollows: 4, MaxFollowsPerRequester: 3, Unread: 300 * time.Millisecond})
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	go m.Run(ctx)

	causes := make(chan error, 16)
	block := func(ctx context.Context) { <-ctx.Done(); causes <- context.Cause(ctx) }
	follow := Kind{Follow: true, Requester: "unsigned"}
	for i := range 3 {
		if err := m.Start(fmt.Sprint("f", i), follow, block); err != nil {
			t.Fatalf("follower %d: %v", i, err)
		}
	}
	if err := m.Start("f3", follow, block); !errors.Is(err, ErrBusy) {
		t.Fatalf("a requester's fourth follower: %v, want ErrBusy", err)
	}
	if err := m.Start("k0", Kind{Follow: true, Requester: "key op"}, block); err != nil {
		t.Fatalf("another requester's follower: %v", err)
	}
	if err := m.Start("k1", Kind{Follow: true, Requester: "key op"}, block); !errors.Is(err, ErrBusy) {
		t.Fatalf("a fifth follower in all: %v, want ErrBusy", err)
	}
	for i := range 4 {
		if err := m.Start(fmt.Sprint("once", i), Kind{Requester: "unsigned"}, block); err != nil {
			t.Fatalf("one-shot request %d beside four followers: %v", i, err)
		}
	}
	// Keep f0 read; the other followers' readers are silent.
	deadline := time.Now().Add(30 * time.Second)
	dropped := 0
	for dropped < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("%d unread followers dropped, want 3", dropped)
		}
		if !m.Touch("f0") {
			t.Fatal("the read follower ended")
		}
		select {
		case err := <-causes:
			if !errors.Is(err, ErrUnread) {
				t.Fatalf("a follower ended with %v, want ErrUnread", err)
			}
			dropped++
		case <-time.After(50 * time.Millisecond):
		}
	}
	if m.Touch("nope") {
		t.Fatal("touch of an unknown id reported one")
	}
	if !m.Cancel("f0") {
		t.Fatal("the read follower is not running")
	}
	if err := <-causes; !errors.Is(err, context.Canceled) || errors.Is(err, ErrUnread) {
		t.Fatalf("a cancelled follower ended with %v, want context.Canceled", err)
	}
}

func TestInteractiveSessionsAreBoundedPerRequester(t *testing.T) {
	m := New(Limits{Max: 8, MaxFollows: 6, MaxFollowsPerRequester: 6, MaxInteractivePerRequester: 2})
	ctx, stop := context.WithCancel(context.Background())
	defer func() { stop(); m.Run(ctx) }()
	block := func(ctx context.Context) { <-ctx.Done() }
	shell := func(who string) Kind { return Kind{Follow: true, Interactive: true, Requester: who} }
	for i, id := range []string{"a1", "a2"} {
		if err := m.Start(id, shell("alice"), block); err != nil {
			t.Fatalf("session %d: %v", i, err)
		}
	}
	if err := m.Start("a3", shell("alice"), block); !errors.Is(err, ErrBusy) {
		t.Fatalf("a third session of one requester: %v, want ErrBusy", err)
	}
	if err := m.Start("b1", shell("bob"), block); err != nil {
		t.Fatalf("another requester's session: %v", err)
	}
	if err := m.Start("a-logs", Kind{Follow: true, Requester: "alice"}, block); err != nil {
		t.Fatalf("a followed log beside the sessions: %v", err)
	}
}
