package podworker

import (
	"context"

	"github.com/rs/zerolog"
)

// slotSet is the bounded number of pod syncs at once: a sync takes a free
// slot number and, when marks are kept, marks the slot with its pod key
// while it runs.
type slotSet struct {
	free  chan int // free slot numbers
	marks Marker   // nil: no in-flight marks
	log   zerolog.Logger
}

func newSlotSet(n int, marks Marker, log zerolog.Logger) *slotSet {
	s := &slotSet{free: make(chan int, n), marks: marks, log: log}
	for i := range n {
		s.free <- i
	}
	return s
}

// with runs fn holding a slot marked with key. It gives up with ctx's
// error when ctx ends before a slot is free.
func (s *slotSet) with(ctx context.Context, key string, fn func() error) error {
	var slot int
	select {
	case slot = <-s.free:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { s.free <- slot }()
	if m := s.marks; m != nil {
		if err := m.Set(slot, key); err != nil {
			s.log.Error().Err(err).Str("pod", key).Msg("marking pod sync in flight; a crash in it would not be caught at restart")
		}
		defer func() {
			if err := m.Clear(slot); err != nil {
				s.log.Error().Err(err).Str("pod", key).Msg("clearing the in-flight mark of a pod sync")
			}
		}()
	}
	return fn()
}
