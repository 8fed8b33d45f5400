package podworker

import (
	"context"
	"sync"

	"github.com/rs/zerolog"

	"github.com/mqlet/mqlet/internal/crashout"
)

// slotSet is the bounded number of pod syncs at once: a sync takes a free
// slot number and, when marks are kept, marks the slot with its pod key
// while it runs. A freed slot goes to the syncs of pods synced before
// first (a container exited, a resync, a retry), then to the others (first
// starts): a pod whose container ended is not reported only after every
// pod queued to start has started. Each pod has at most one sync waiting,
// so first starts wait at most for the syncs of the pods there are.
type slotSet struct {
	marks Marker // nil: no in-flight marks
	log   zerolog.Logger

	mu      sync.Mutex
	free    []int
	waiting [2][]chan int // [0]: syncs of pods synced before, [1]: the others; oldest first
}

func newSlotSet(n int, marks Marker, log zerolog.Logger) *slotSet {
	s := &slotSet{marks: marks, log: log}
	for i := range n {
		s.free = append(s.free, i)
	}
	return s
}

// with runs fn holding a slot marked with key, fn's phase (phaseRead
// first; fn moves it on with the function it is given) and the calling
// goroutine, which a Go crash report names; running says the pod was
// synced before (its sync goes before first starts). It gives up with
// ctx's error when ctx ends before a slot is free.
func (s *slotSet) with(ctx context.Context, key string, running bool, fn func(phase func(string)) error) error {
	slot, err := s.acquire(ctx, running)
	if err != nil {
		return err
	}
	defer s.release(slot)
	m := s.marks
	if m == nil {
		return fn(func(string) {})
	}
	mark := syncMark{key: key, phase: phaseRead, goroutine: crashout.CurrentGoroutine()}
	write := func() {
		if err := m.Set(slot, mark.String()); err != nil {
			s.log.Error().Err(err).Str("pod", key).Msg("marking pod sync in flight; a crash in it would not be caught at restart")
		}
	}
	write()
	set := func(phase string) {
		if phase != mark.phase {
			mark.phase = phase
			write()
		}
	}
	defer func() {
		if err := m.Clear(slot); err != nil {
			s.log.Error().Err(err).Str("pod", key).Msg("clearing the in-flight mark of a pod sync")
		}
	}()
	return fn(set)
}

func (s *slotSet) acquire(ctx context.Context, running bool) (int, error) {
	class := 1
	if running {
		class = 0
	}
	s.mu.Lock()
	if n := len(s.free); n > 0 {
		slot := s.free[n-1]
		s.free = s.free[:n-1]
		s.mu.Unlock()
		return slot, nil
	}
	ch := make(chan int, 1) // release never blocks on it
	s.waiting[class] = append(s.waiting[class], ch)
	s.mu.Unlock()
	select {
	case slot := <-ch:
		return slot, nil
	case <-ctx.Done():
	}
	s.mu.Lock()
	for i, w := range s.waiting[class] {
		if w == ch {
			s.waiting[class] = append(s.waiting[class][:i], s.waiting[class][i+1:]...)
			s.mu.Unlock()
			return 0, ctx.Err()
		}
	}
	s.mu.Unlock()
	// A slot was handed over as ctx ended: pass it on.
	s.release(<-ch)
	return 0, ctx.Err()
}

func (s *slotSet) release(slot int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.waiting {
		if len(s.waiting[c]) > 0 {
			ch := s.waiting[c][0]
			s.waiting[c] = s.waiting[c][1:]
			ch <- slot
			return
		}
	}
	s.free = append(s.free, slot)
}

// waiters is how many syncs of each class wait for a slot (tests).
func (s *slotSet) waiters() (running, others int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.waiting[0]), len(s.waiting[1])
}
