// Package pending follows commands whose outcome depends on pods: an apply
// is succeeded when its pods run (or completed), failed when one of them
// fails for good or the deadline passes; a delete is succeeded when its pods
// are gone. The pod workers report what they see; this package answers.
package pending

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	apiv1 "github.com/mqlet/mqlet/api/v1"
)

// Outcome is a pod worker's latest view of one pod.
type Outcome struct {
	Generation int64 // the pod generation the view reflects
	Gone       bool  // the pod is not desired and nothing of it runs
	Done       bool  // the pod reached a verdict (running/completed or failed)
	OK         bool  // with Done: succeeded rather than failed
	Reason     string
	// Terminating: the pod is being killed and, until GraceEnds, given its
	// grace period. A delete waiting on it is not failed at its deadline
	// before then (see Tracker.Run).
	Terminating bool
	GraceEnds   time.Time
}

// terminatingSlack is how long after a grace period ends a delete still
// waits for the pod to be gone: the kill and the removal of what is left.
const terminatingSlack = 30 * time.Second

// Want is what a request waits for on one pod.
type Want struct {
	Generation int64 // at least this generation must be observed
	Gone       bool  // wait for the pod to be gone instead
}

// Sender publishes replies.
type Sender interface {
	Send(r apiv1.Reply) error
}

// deadlineKeeper is a Sender that also persists a request's deadline when
// the tracker moves it (a delete waiting out a grace period), so a restart
// does not fail the request at the deadline it had before.
type deadlineKeeper interface {
	KeepDeadline(requestID string, deadline time.Time)
}

type request struct {
	id       string
	verb     string
	deadline time.Time
	waiting  map[string]Want
	results  map[string]string // key → reason, for the final message
	// graceEnds is when the grace period of each terminating pod the
	// request waits to be gone ends.
	graceEnds map[string]time.Time
}

// Tracker matches outcomes to waiting requests. Safe for concurrent use.
type Tracker struct {
	sender Sender
	now    func() time.Time

	mu       sync.Mutex
	requests map[string]*request
	latest   map[string]Outcome // last outcome per pod key
	wake     chan struct{}
}

// New returns a Tracker; now is the clock (time.Now when nil).
func New(sender Sender, now func() time.Time) *Tracker {
	if now == nil {
		now = time.Now
	}
	return &Tracker{sender: sender, now: now, requests: map[string]*request{}, latest: map[string]Outcome{}, wake: make(chan struct{}, 1)}
}

// Add starts following request id until every pod in want is satisfied.
// Outcomes already observed count at once. An earlier request that waits
// for something else of one of these pods (a deleted pod's apply, a
// re-created pod's delete, an older spec) can no longer get it: it is
// answered failed at once, saying which request superseded it.
func (t *Tracker) Add(id, verb string, want map[string]Want, deadline time.Time) {
	t.mu.Lock()
	replies := t.supersedeLocked(id, verb, want)
	r := &request{id: id, verb: verb, deadline: deadline, waiting: map[string]Want{}, results: map[string]string{}}
	for k, w := range want {
		r.waiting[k] = w
	}
	t.requests[id] = r
	for k := range want {
		if out, ok := t.latest[k]; ok {
			replies = append(replies, t.applyLocked(k, out)...)
		}
	}
	if len(r.waiting) == 0 && t.requests[id] != nil {
		replies = append(replies, t.finishLocked(r, true, ""))
	}
	t.mu.Unlock()
	t.send(replies)
	select {
	case t.wake <- struct{}{}:
	default:
	}
}

// Observe records the latest outcome of the pod with key and answers every
// request it completes.
func (t *Tracker) Observe(key string, out Outcome) {
	t.mu.Lock()
	t.latest[key] = out
	if out.Gone {
		// keep the gone outcome so a later delete of the same pod completes at once
		t.latest[key] = Outcome{Gone: true}
	}
	replies := t.applyLocked(key, out)
	t.mu.Unlock()
	t.send(replies)
}

// Forget drops the remembered outcome of key (a pod re-created under the same name).
func (t *Tracker) Forget(key string) {
	t.mu.Lock()
	delete(t.latest, key)
	t.mu.Unlock()
}

// Len is the number of requests still waiting.
func (t *Tracker) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.requests)
}

func (t *Tracker) applyLocked(key string, out Outcome) []apiv1.Reply {
	var replies []apiv1.Reply
	for _, r := range t.requests {
		w, ok := r.waiting[key]
		if !ok {
			continue
		}
		switch {
		case w.Gone && out.Terminating && !out.GraceEnds.IsZero():
			if r.graceEnds == nil {
				r.graceEnds = map[string]time.Time{}
			}
			r.graceEnds[key] = out.GraceEnds
			continue
		case w.Gone && out.Gone:
			delete(r.waiting, key)
			r.results[key] = "deleted"
		case w.Gone || out.Gone || out.Generation < w.Generation || !out.Done:
			continue
		case !out.OK:
			replies = append(replies, t.finishLocked(r, false, key+": "+out.Reason))
			continue
		default:
			delete(r.waiting, key)
			r.results[key] = out.Reason
		}
		if len(r.waiting) == 0 {
			replies = append(replies, t.finishLocked(r, true, ""))
		}
	}
	return replies
}

// supersedeLocked ends the requests other than id that wait on a pod of
// want for a different outcome. A request with the same id (a repeat of a
// command without one) is replaced, not answered.
func (t *Tracker) supersedeLocked(id, verb string, want map[string]Want) []apiv1.Reply {
	var replies []apiv1.Reply
	for _, key := range sortedWant(want) {
		w := want[key]
		for _, old := range t.requests {
			ow, ok := old.waiting[key]
			if !ok || old.id == id || ow == w {
				continue
			}
			what := "replaced"
			if w.Gone {
				what = "deleted"
			} else if ow.Gone {
				what = "desired again"
			}
			replies = append(replies, t.finishLocked(old, false, fmt.Sprintf("superseded: %s %s by a later request %s (%s) before this one finished", key, what, id, verb)))
		}
	}
	return replies
}

func sortedWant(want map[string]Want) []string {
	keys := make([]string, 0, len(want))
	for k := range want {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func (t *Tracker) finishLocked(r *request, ok bool, why string) apiv1.Reply {
	delete(t.requests, r.id)
	if !ok {
		return apiv1.Reply{RequestID: r.id, Verb: r.verb, Phase: apiv1.Failed, Message: why}
	}
	keys := make([]string, 0, len(r.results))
	for k := range r.results {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, k+": "+r.results[k])
	}
	msg := strings.Join(parts, "; ")
	if msg == "" {
		msg = "done"
	}
	return apiv1.Reply{RequestID: r.id, Verb: r.verb, Phase: apiv1.Succeeded, Message: msg}
}

func (t *Tracker) send(replies []apiv1.Reply) {
	for _, r := range replies {
		_ = t.sender.Send(r) // the sender logs its own failures
	}
}

// Run fails requests whose deadline passed, until ctx ends. The pods keep
// being retried; only the answer is given.
func (t *Tracker) Run(ctx context.Context) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		next := t.expire()
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		if !next.IsZero() {
			timer.Reset(max(next.Sub(t.now()), time.Millisecond))
		}
		select {
		case <-ctx.Done():
			return
		case <-t.wake:
		case <-timer.C:
		}
	}
}

// expire answers overdue requests and returns the next deadline (zero if none).
func (t *Tracker) expire() time.Time {
	t.mu.Lock()
	now := t.now()
	var replies []apiv1.Reply
	var next time.Time
	for _, r := range t.requests {
		if !now.Before(r.deadline) {
			if ends, ok := r.stillGraceful(now); ok {
				// Stopping gracefully is not failing: the delete waits for
				// the grace period and says so.
				r.deadline = ends.Add(terminatingSlack)
				if k, ok := t.sender.(deadlineKeeper); ok {
					k.KeepDeadline(r.id, r.deadline)
				}
				replies = append(replies, apiv1.Reply{RequestID: r.id, Verb: r.verb, Phase: apiv1.InProgress,
					Message: fmt.Sprintf("terminating: grace period ends at %s; waiting for %s", ends.UTC().Format(time.RFC3339), strings.Join(sortedWant(r.waiting), ", "))})
			}
		}
		if !now.Before(r.deadline) {
			keys := make([]string, 0, len(r.waiting))
			for k := range r.waiting {
				detail := k
				if out, ok := t.latest[k]; ok && out.Reason != "" {
					detail += " (" + out.Reason + ")"
				}
				keys = append(keys, detail)
			}
			sort.Strings(keys)
			replies = append(replies, t.finishLocked(r, false, fmt.Sprintf("deadline passed; still waiting for %s; mqlet keeps retrying", strings.Join(keys, ", "))))
			continue
		}
		if next.IsZero() || r.deadline.Before(next) {
			next = r.deadline
		}
	}
	t.mu.Unlock()
	t.send(replies)
	return next
}

// stillGraceful reports whether every pod r still waits for is one being
// deleted within a grace period that ends after now, and when the last of
// them ends.
func (r *request) stillGraceful(now time.Time) (time.Time, bool) {
	var last time.Time
	for k, w := range r.waiting {
		ends, ok := r.graceEnds[k]
		if !w.Gone || !ok || !ends.After(now) {
			return time.Time{}, false
		}
		if ends.After(last) {
			last = ends
		}
	}
	return last, !last.IsZero()
}
