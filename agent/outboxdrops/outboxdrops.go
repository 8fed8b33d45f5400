// Package outboxdrops reports what the outbox drops for lack of room as
// node events: one Warning event per burst with the count, never one per
// message, so a flood of drops costs a few events, not thousands.
package outboxdrops

import (
	"context"
	"fmt"
	"time"

	"github.com/rs/zerolog"
	v1 "k8s.io/api/core/v1"

	"github.com/mqlet/mqlet/mqtt/outbox"
)

// Reason is the reason of the node event that reports drops.
const Reason = "OutboxDropped"

// Defaults: a burst is gathered for DefaultWindow; while drops go on, the
// reports space out, doubling up to DefaultMaxGap, so a long outage
// does not spend the node's event budget (the recorder's spam filter
// allows one event per object every few minutes after a burst).
const (
	DefaultWindow = 10 * time.Second
	DefaultMaxGap = 5 * time.Minute
)

// Source is the outbox: its counters and a signal after each drop.
type Source interface {
	Stats() outbox.Stats
	Drops() <-chan struct{}
}

// Events records node events.
type Events interface {
	NodeEvent(eventType, reason, message string)
}

// Reporter turns the outbox's drop signals into node events.
type Reporter struct {
	src    Source
	events Events
	window time.Duration
	maxGap time.Duration
	log    zerolog.Logger
	// base is the outbox's counters when the Reporter was made.
	base outbox.Stats
}

// New returns a Reporter; window and maxGap <= 0 take the defaults. Drops
// counted before (by a previous process) are not reported again.
func New(src Source, events Events, window, maxGap time.Duration, log zerolog.Logger) *Reporter {
	if window <= 0 {
		window = DefaultWindow
	}
	if maxGap <= 0 {
		maxGap = DefaultMaxGap
	}
	return &Reporter{src: src, events: events, window: window, maxGap: max(maxGap, window), log: log, base: src.Stats()}
}

// Run reports drops until ctx ends.
func (r *Reporter) Run(ctx context.Context) {
	last := r.base
	var (
		lastReport time.Time
		gap        = r.window
		// own is the last report's own event, which a full outbox may
		// refuse too (the event is queued later, through the intake's
		// group): a report of that one drop alone would repeat forever
		// while offline, so one drop after a report waits for another.
		own uint64
	)
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.src.Drops():
		}
		if time.Since(lastReport) > gap {
			gap = r.window // quiet for longer than the gap: a new burst
		}
		// Gather the burst for a window, and leave the gap since the last report.
		wait := max(r.window, time.Until(lastReport.Add(gap)))
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-timer.C:
		}
		now := r.src.Stats()
		dropped := now.Dropped - last.Dropped
		if dropped <= own {
			continue
		}
		final := now.DroppedFinal - last.DroppedFinal
		since := "since mqlet started"
		if !lastReport.IsZero() {
			since = "in the last " + time.Since(lastReport).Round(time.Second).String()
		}
		msg := fmt.Sprintf("the outbox dropped %d queued messages (%d of them final replies) %s for lack of room (%d bytes bound; %d dropped since it was created): the broker was out of reach or slower than what mqlet publishes", dropped, final, since, now.MaxBytes, now.Dropped)
		r.log.Warn().Uint64("dropped", dropped).Uint64("droppedFinal", final).Uint64("droppedTotal", now.Dropped).Msg("outbox dropped messages")
		r.events.NodeEvent(v1.EventTypeWarning, Reason, msg)
		last, lastReport, own = now, time.Now(), 1
		gap = min(gap*2, r.maxGap)
	}
}
