package cri

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// An operator's request that arrives while the runtime is still being
// connected waits for the connection (up to its limit) instead of being
// refused; one that waits past the limit, or whose context ends, gets the
// unavailable error.
func TestAwaitWaitsForTheConnection(t *testing.T) {
	fake := &scriptedCRI{}
	allow := make(chan struct{})
	dial := func(ctx context.Context, _ Config) (*services, error) {
		select {
		case <-allow:
			return &services{runtime: fake, image: fake}, nil
		default:
			return nil, errors.New("not yet")
		}
	}
	m := newManager(Config{HealthInterval: time.Hour, RuntimeRetryMin: 20 * time.Millisecond, RuntimeRetryMax: 20 * time.Millisecond}, zerolog.Nop(), dial)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); m.Run(ctx) }()
	defer func() { cancel(); <-done }()

	if _, err := m.conn.await(ctx, 50*time.Millisecond); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("await past its limit: %v, want ErrUnavailable", err)
	}
	ended, stop := context.WithCancel(ctx)
	stop()
	if _, err := m.conn.await(ended, time.Hour); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("await with an ended context: %v, want ErrUnavailable", err)
	}

	got := make(chan error, 1)
	go func() {
		_, err := m.conn.await(ctx, time.Minute)
		got <- err
	}()
	close(allow)
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("await once the runtime came up: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("await did not return when the runtime came up")
	}
}
