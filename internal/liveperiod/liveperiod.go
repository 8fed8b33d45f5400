// Package liveperiod gives a loop a period that may change while it runs
// (a setting changed over MQTT): a Source reads the period and signals its
// changes; a Timer waits one period, re-reading it when told of a change.
// Nothing here is global: each loop owns its Timer.
package liveperiod

import (
	"context"
	"time"
)

// Source is a period that may change.
type Source struct {
	// Period is read at each wait; it must be positive.
	Period func() time.Duration
	// Changes returns a channel closed at the next change of the period (or
	// of any other setting: a Timer re-reads and keeps its deadline when the
	// period is the same). Nil: the period never changes.
	Changes func() <-chan struct{}
}

// Fixed is a period that never changes.
func Fixed(d time.Duration) Source {
	return Source{Period: func() time.Duration { return d }}
}

// IsZero reports whether s was never set.
func (s Source) IsZero() bool { return s.Period == nil }

func (s Source) changes() <-chan struct{} {
	if s.Changes == nil {
		return nil
	}
	return s.Changes()
}

// Min is a source whose period is the smaller of s's and d.
func (s Source) Min(d time.Duration) Source {
	return Source{Period: func() time.Duration { return min(s.Period(), d) }, Changes: s.Changes}
}

// Timer fires once per period, counted from its start or its last Reset.
// A new period takes effect at once, counted from that same start: a
// period shortened below the time already waited fires at once. Use it
// from one goroutine, in a select on C and Changed:
//
//	case <-t.C(): work(); t.Reset()
//	case <-t.Changed(): t.Update()
type Timer struct {
	src     Source
	start   time.Time
	period  time.Duration
	timer   *time.Timer
	changed <-chan struct{}
}

// NewTimer starts a timer of src's current period.
func (s Source) NewTimer() *Timer {
	t := &Timer{src: s}
	t.Reset()
	return t
}

// C fires when the period has passed.
func (t *Timer) C() <-chan time.Time { return t.timer.C }

// Changed is closed when the source may have changed; call Update then.
func (t *Timer) Changed() <-chan struct{} { return t.changed }

// Period is the period the timer runs with.
func (t *Timer) Period() time.Duration { return t.period }

// Reset starts a new period from now (after C fired).
func (t *Timer) Reset() {
	t.changed = t.src.changes()
	t.period = t.src.Period()
	t.start = time.Now()
	t.arm(t.period)
}

// Update re-reads the period after Changed was closed; a changed period
// re-arms the timer for what is left of it.
func (t *Timer) Update() {
	t.changed = t.src.changes()
	p := t.src.Period()
	if p == t.period {
		return
	}
	t.period = p
	t.arm(max(0, p-time.Since(t.start)))
}

func (t *Timer) arm(d time.Duration) {
	if t.timer == nil {
		t.timer = time.NewTimer(d)
		return
	}
	t.timer.Stop()
	// Go 1.23+ timers: Reset after Stop leaves no stale value in C.
	t.timer.Reset(d)
}

// Stop releases the timer.
func (t *Timer) Stop() { t.timer.Stop() }

// Wait blocks for one period from now, following changes; false when ctx ended.
func (s Source) Wait(ctx context.Context) bool {
	t := s.NewTimer()
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return false
		case <-t.C():
			return true
		case <-t.Changed():
			t.Update()
		}
	}
}

// Every calls fn once per period until ctx ends, the first call one
// period after the start.
func (s Source) Every(ctx context.Context, fn func()) {
	t := s.NewTimer()
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
			fn()
			t.Reset()
		case <-t.Changed():
			t.Update()
		}
	}
}
