// Package streams runs the long operator requests (logs, follow, exec,
// restart) outside the command intake, which handles one command at a
// time: each runs in a goroutine owned here and can be cancelled by its
// request id. Stopping the manager cancels and waits for every one.
//
// Followed logs are bounded apart from the rest, so requests that nobody
// reads cannot take the slots of the one-shot verbs: at most MaxFollows of
// them run (the other slots stay for one-shot logs, exec and restart), at
// most MaxFollowsPerRequester per requester, and one whose reader stays
// silent for Unread is ended with ErrUnread as its context's cause.
package streams

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Errors of Start, and the cause of an unread follower's end.
var (
	ErrBusy      = errors.New("too many requests running")
	ErrDuplicate = errors.New("a request with this id is running")
	ErrStopped   = errors.New("stopping")
	ErrUnread    = errors.New("nobody read it")
)

// Limits bound the requests running at once.
type Limits struct {
	// Max bounds every request (at least 1).
	Max int
	// MaxFollows bounds the followed ones (at most Max-1: one slot always
	// stays for one-shot requests); MaxFollowsPerRequester bounds those of
	// one requester. 0: Max-1.
	MaxFollows             int
	MaxFollowsPerRequester int
	// MaxInteractivePerRequester bounds the interactive sessions (which
	// are followers too) of one requester; 0: no bound of their own.
	MaxInteractivePerRequester int
	// Unread ends a follower whose reader sent nothing (Touch) for this
	// long; 0: never.
	Unread time.Duration
}

// Kind says how a request counts against the limits.
type Kind struct {
	// Follow marks a request that lasts as long as someone reads it.
	Follow bool
	// Interactive marks an interactive session (exec -it); it must be a
	// Follow too.
	Interactive bool
	// Requester names who asked (a signing key), or is empty when
	// unknown; unknown requesters count as one.
	Requester string
	// Owner says whose the request's object is, for CancelIf.
	Owner string
}

type running struct {
	cancel    context.CancelCauseFunc
	kind      Kind
	heartbeat *time.Timer // of a follower with an Unread bound
}

// Manager owns the running requests.
type Manager struct {
	lim    Limits
	base   context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	running map[string]*running
	stopped bool
}

// New returns a Manager within lim.
func New(lim Limits) *Manager {
	lim.Max = max(1, lim.Max)
	if lim.MaxFollows <= 0 || lim.MaxFollows >= lim.Max {
		lim.MaxFollows = max(1, lim.Max-1)
	}
	if lim.MaxFollowsPerRequester <= 0 || lim.MaxFollowsPerRequester > lim.MaxFollows {
		lim.MaxFollowsPerRequester = lim.MaxFollows
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Manager{lim: lim, base: ctx, cancel: cancel, running: map[string]*running{}}
}

// Start runs fn(ctx) for request id in a goroutine; ctx ends on Cancel(id),
// when the manager stops, or (a follower) when its reader is silent for
// Limits.Unread, with ErrUnread as context.Cause. It refuses beyond the
// limits.
func (m *Manager) Start(id string, k Kind, fn func(ctx context.Context)) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.admitLocked(id, k); err != nil {
		return err
	}
	ctx, cancel := context.WithCancelCause(m.base)
	r := &running{cancel: cancel, kind: k}
	if k.Follow && m.lim.Unread > 0 {
		r.heartbeat = time.AfterFunc(m.lim.Unread, func() { cancel(ErrUnread) })
	}
	m.running[id] = r
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		defer func() {
			if r.heartbeat != nil {
				r.heartbeat.Stop()
			}
			m.mu.Lock()
			delete(m.running, id)
			m.mu.Unlock()
			cancel(context.Canceled)
		}()
		fn(ctx)
	}()
	return nil
}

func (m *Manager) admitLocked(id string, k Kind) error {
	switch {
	case m.stopped:
		return ErrStopped
	case m.running[id] != nil:
		return ErrDuplicate
	case len(m.running) >= m.lim.Max:
		return fmt.Errorf("%w (at most %d): try again when one ends", ErrBusy, m.lim.Max)
	}
	if !k.Follow {
		return nil
	}
	follows, mine, sessions := 0, 0, 0
	for _, r := range m.running {
		if r.kind.Follow {
			follows++
			if r.kind.Requester == k.Requester {
				mine++
				if r.kind.Interactive {
					sessions++
				}
			}
		}
	}
	if k.Interactive && m.lim.MaxInteractivePerRequester > 0 && sessions >= m.lim.MaxInteractivePerRequester {
		return fmt.Errorf("%w: %d interactive sessions of this requester run (at most %d, exec.maxSessionsPerRequester)", ErrBusy, sessions, m.lim.MaxInteractivePerRequester)
	}
	if follows >= m.lim.MaxFollows {
		return fmt.Errorf("%w: %d followed logs run (at most %d; the other slots are kept for one-shot requests)", ErrBusy, follows, m.lim.MaxFollows)
	}
	if mine >= m.lim.MaxFollowsPerRequester {
		return fmt.Errorf("%w: %d followed logs of this requester run (at most %d)", ErrBusy, mine, m.lim.MaxFollowsPerRequester)
	}
	return nil
}

// Cancel ends the request id; it reports whether one was running.
func (m *Manager) Cancel(id string) bool {
	m.mu.Lock()
	r := m.running[id]
	m.mu.Unlock()
	if r == nil {
		return false
	}
	r.cancel(context.Canceled)
	return true
}

// CancelIf ends the request id when may allows its kind; it reports
// whether it did.
func (m *Manager) CancelIf(id string, may func(Kind) bool) bool {
	m.mu.Lock()
	r := m.running[id]
	m.mu.Unlock()
	if r == nil || !may(r.kind) {
		return false
	}
	r.cancel(context.Canceled)
	return true
}

// Touch says the reader of request id is still there: a follower's Unread
// bound starts again. It reports whether id runs.
func (m *Manager) Touch(id string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	r := m.running[id]
	if r == nil {
		return false
	}
	if r.heartbeat != nil {
		r.heartbeat.Reset(m.lim.Unread)
	}
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
