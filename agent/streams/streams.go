// Package streams runs the long operator requests (logs, follow, exec,
// restart) outside the command intake, which handles one command at a
// time: each runs in a goroutine owned here, at most Max at once, and can
// be cancelled by its request id. Stopping the manager cancels and waits
// for every one.
package streams

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// Errors of Start.
var (
	ErrBusy      = errors.New("too many requests running")
	ErrDuplicate = errors.New("a request with this id is running")
	ErrStopped   = errors.New("stopping")
)

// Manager owns the running requests.
type Manager struct {
	max    int
	base   context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	running map[string]context.CancelFunc
	stopped bool
}

// New returns a Manager running at most limit requests at once (at least 1).
func New(limit int) *Manager {
	ctx, cancel := context.WithCancel(context.Background())
	return &Manager{max: max(1, limit), base: ctx, cancel: cancel, running: map[string]context.CancelFunc{}}
}

// Start runs fn(ctx) for request id in a goroutine; ctx ends on Cancel(id)
// or when the manager stops. It refuses when Max are running.
func (m *Manager) Start(id string, fn func(ctx context.Context)) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case m.stopped:
		return ErrStopped
	case m.running[id] != nil:
		return ErrDuplicate
	case len(m.running) >= m.max:
		return fmt.Errorf("%w (at most %d): try again when one ends", ErrBusy, m.max)
	}
	ctx, cancel := context.WithCancel(m.base)
	m.running[id] = cancel
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		defer func() {
			m.mu.Lock()
			delete(m.running, id)
			m.mu.Unlock()
			cancel()
		}()
		fn(ctx)
	}()
	return nil
}

// Cancel ends the request id; it reports whether one was running.
func (m *Manager) Cancel(id string) bool {
	m.mu.Lock()
	cancel := m.running[id]
	m.mu.Unlock()
	if cancel == nil {
		return false
	}
	cancel()
	return true
}

// Len is how many requests run.
func (m *Manager) Len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.running)
}

// Run blocks until ctx ends, then cancels every request and waits for them.
func (m *Manager) Run(ctx context.Context) {
	<-ctx.Done()
	m.mu.Lock()
	m.stopped = true
	m.mu.Unlock()
	m.cancel()
	m.wg.Wait()
}
