package liveperiod

import (
	"context"
	"sync"
	"testing"
	"time"
)

// setting is a changeable period, as liveconfig gives one.
type setting struct {
	mu      sync.Mutex
	d       time.Duration
	changed chan struct{}
}

func newSetting(d time.Duration) *setting { return &setting{d: d, changed: make(chan struct{})} }

func (s *setting) set(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.d = d
	close(s.changed)
	s.changed = make(chan struct{})
}

func (s *setting) source() Source {
	return Source{
		Period: func() time.Duration { s.mu.Lock(); defer s.mu.Unlock(); return s.d },
		Changes: func() <-chan struct{} {
			s.mu.Lock()
			defer s.mu.Unlock()
			return s.changed
		},
	}
}

func TestEveryFollowsAShorterPeriodAtOnce(t *testing.T) {
	s := newSetting(time.Hour)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ticks := make(chan time.Time, 100)
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.source().Every(ctx, func() { ticks <- time.Now() })
	}()
	select {
	case <-ticks:
		t.Fatal("ticked before its hour")
	case <-time.After(50 * time.Millisecond):
	}
	s.set(20 * time.Millisecond)
	deadline := time.After(5 * time.Second)
	for n := 0; n < 3; n++ {
		select {
		case <-ticks:
		case <-deadline:
			t.Fatalf("%d ticks in 5s after the period became 20ms", n)
		}
	}
	cancel()
	<-done
}

func TestUpdateKeepsTheDeadlineWhenThePeriodIsTheSame(t *testing.T) {
	s := newSetting(time.Hour)
	tm := s.source().NewTimer()
	defer tm.Stop()
	s.set(time.Hour) // another setting changed
	<-tm.Changed()
	tm.Update()
	if tm.Period() != time.Hour {
		t.Fatalf("period %v", tm.Period())
	}
	select {
	case <-tm.C():
		t.Fatal("an unchanged period fired")
	case <-time.After(20 * time.Millisecond):
	}
	// A period shorter than the time already waited fires at once.
	s.set(time.Nanosecond)
	<-tm.Changed()
	tm.Update()
	select {
	case <-tm.C():
	case <-time.After(5 * time.Second):
		t.Fatal("a period already passed did not fire")
	}
}

func TestWaitEndsWithTheContextAndFixedNeverChanges(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if Fixed(time.Hour).Wait(ctx) {
		t.Fatal("Wait returned true on an ended context")
	}
	if !Fixed(time.Millisecond).Wait(context.Background()) {
		t.Fatal("Wait returned false")
	}
	if got := Fixed(time.Hour).Min(time.Second).Period(); got != time.Second {
		t.Fatalf("Min: %v", got)
	}
}
