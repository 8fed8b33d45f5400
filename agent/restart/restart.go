// Package restart is the crash-loop restart tracker: it is told when a
// container is restarted and answers one question — must it wait, and how
// long. Delays start at Base, double on every restart and stop at Max; a
// container that ran ResetAfter without exiting starts again from Base.
// It never gives up.
package restart

import (
	"sync"
	"time"
)

// Policy holds the numbers; the defaults are the kubelet's.
type Policy struct {
	Base       time.Duration
	Max        time.Duration
	ResetAfter time.Duration
}

// DefaultPolicy is 10 s doubling to 300 s, reset after 10 min healthy.
var DefaultPolicy = Policy{Base: 10 * time.Second, Max: 300 * time.Second, ResetAfter: 10 * time.Minute}

type entry struct {
	delay     time.Duration // wait imposed after the next exit
	restarted time.Time     // when the last restart was allowed
}

// Tracker keeps one entry per container key. Safe for concurrent use.
type Tracker struct {
	policy Policy
	now    func() time.Time

	mu      sync.Mutex
	entries map[string]*entry
}

// New returns a tracker; now is the clock (time.Now when nil).
func New(policy Policy, now func() time.Time) *Tracker {
	if now == nil {
		now = time.Now
	}
	return &Tracker{policy: policy, now: now, entries: map[string]*entry{}}
}

// InBackoff reports whether the container that exited at finishedAt must
// still wait before it is started again, and how long.
func (t *Tracker) InBackoff(key string, finishedAt time.Time) (bool, time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := t.entries[key]
	if !ok || t.ranHealthy(e, finishedAt) {
		return false, 0
	}
	wait := finishedAt.Add(e.delay).Sub(t.now())
	if wait <= 0 {
		return false, 0
	}
	return true, wait
}

// Next records that the container that exited at finishedAt is restarted
// now; the wait after its next exit doubles.
func (t *Tracker) Next(key string, finishedAt time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := t.entries[key]
	switch {
	case !ok || t.ranHealthy(e, finishedAt):
		e = &entry{delay: t.policy.Base}
		t.entries[key] = e
	default:
		e.delay = min(2*e.delay, t.policy.Max)
	}
	e.restarted = t.now()
}

// Delay is the wait that will be imposed after key's next exit (0 if none).
func (t *Tracker) Delay(key string) time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	if e, ok := t.entries[key]; ok {
		return e.delay
	}
	return 0
}

// Forget drops every key for which drop returns true (e.g. a deleted pod's containers).
func (t *Tracker) Forget(drop func(key string) bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for k := range t.entries {
		if drop(k) {
			delete(t.entries, k)
		}
	}
}

// ranHealthy: the container ran at least ResetAfter since its last restart.
func (t *Tracker) ranHealthy(e *entry, finishedAt time.Time) bool {
	return !e.restarted.IsZero() && finishedAt.Sub(e.restarted) >= t.policy.ResetAfter
}
