// Package restart is the crash-loop restart tracker of one pod: it is told
// when a container is restarted and answers one question — may the
// container that exited start again now, and if not, how long it waits and
// why. Delays start at Base, double on every restart and stop at Max; a
// container that ran ResetAfter without exiting starts again from Base.
// It never gives up. The counting is client-go's flowcontrol.Backoff.
package restart

import (
	"fmt"
	"time"

	"k8s.io/client-go/util/flowcontrol"
	"k8s.io/utils/clock"
)

// Policy holds the numbers; the defaults are the kubelet's.
type Policy struct {
	Base       time.Duration
	Max        time.Duration
	ResetAfter time.Duration
}

// DefaultPolicy is 10 s doubling to 300 s, reset after 10 min healthy.
var DefaultPolicy = Policy{Base: 10 * time.Second, Max: 300 * time.Second, ResetAfter: 10 * time.Minute}

// Tracker keeps one backoff entry per container key (cri.BackoffKey). One
// pod's runner owns one Tracker, dropped with the pod, so no entry outlives
// its pod and no key of one pod can be taken for another's. Safe for
// concurrent use.
type Tracker struct {
	policy Policy
	clock  clock.Clock
	b      *flowcontrol.Backoff
}

// New returns a tracker; clk is the clock (the real one when nil).
func New(policy Policy, clk clock.Clock) *Tracker {
	if clk == nil {
		clk = clock.RealClock{}
	}
	b := flowcontrol.NewFakeBackOff(policy.Base, policy.Max, clk)
	// eventTime is the container's exit, lastUpdate its last restart: a
	// container that ran ResetAfter between the two starts from Base again.
	b.HasExpiredFunc = func(eventTime, lastUpdate time.Time, _ time.Duration) bool {
		return eventTime.Sub(lastUpdate) >= policy.ResetAfter
	}
	return &Tracker{policy: policy, clock: clk, b: b}
}

// Decide answers for the container key that exited at finishedAt: wait is
// 0 when it may start now, else how long it must still wait, with reason
// saying why in words fit for an event.
func (t *Tracker) Decide(key string, finishedAt time.Time) (wait time.Duration, reason string) {
	if !t.b.IsInBackOffSince(key, finishedAt) {
		return 0, ""
	}
	delay := t.b.Get(key)
	wait = delay - t.clock.Since(finishedAt)
	if wait <= 0 {
		return 0, ""
	}
	return wait, fmt.Sprintf("back-off %s restarting failed container (%s left)", delay, wait.Round(time.Millisecond))
}

// Restarted records that the container that exited at finishedAt is
// started again now; the wait after its next exit doubles.
func (t *Tracker) Restarted(key string, finishedAt time.Time) {
	t.b.Next(key, finishedAt)
	t.b.GC() // entries of containers healthy for ResetAfter are no longer needed
}

// Delay is the wait that will be imposed after key's next exit (0 if none).
func (t *Tracker) Delay(key string) time.Duration { return t.b.Get(key) }

// InBackoff is Decide in the shape cri.RestartBackoff asks for.
func (t *Tracker) InBackoff(key string, finishedAt time.Time) (bool, time.Duration) {
	wait, _ := t.Decide(key, finishedAt)
	return wait > 0, wait
}

// Next is Restarted in the shape cri.RestartBackoff asks for.
func (t *Tracker) Next(key string, finishedAt time.Time) { t.Restarted(key, finishedAt) }
