package pending

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	apiv1 "github.com/mqlet/mqlet/api/v1"
)

type sink struct {
	mu      sync.Mutex
	replies []apiv1.Reply
	got     chan apiv1.Reply
}

func newSink() *sink { return &sink{got: make(chan apiv1.Reply, 16)} }

func (s *sink) Send(r apiv1.Reply) error {
	s.mu.Lock()
	s.replies = append(s.replies, r)
	s.mu.Unlock()
	s.got <- r
	return nil
}

func (s *sink) count() int { s.mu.Lock(); defer s.mu.Unlock(); return len(s.replies) }

func TestApplySucceedsWhenAllPodsRun(t *testing.T) {
	s := newSink()
	tr := New(s, nil)
	tr.Add("r1", "apply", map[string]Want{"default/a": {Generation: 2}, "default/b": {Generation: 1}}, time.Now().Add(time.Hour))
	tr.Observe("default/a", Outcome{Generation: 1, Done: true, OK: true, Reason: "old generation"})
	tr.Observe("default/a", Outcome{Generation: 2, Done: true, OK: true, Reason: "running"})
	if s.count() != 0 {
		t.Fatal("answered before b ran")
	}
	tr.Observe("default/b", Outcome{Generation: 1, Done: false, Reason: "ContainerCreating"})
	tr.Observe("default/b", Outcome{Generation: 1, Done: true, OK: true, Reason: "running"})
	r := <-s.got
	if r.Phase != apiv1.Succeeded || r.RequestID != "r1" || !strings.Contains(r.Message, "default/a: running") {
		t.Fatalf("unexpected reply %+v", r)
	}
	if tr.Len() != 0 {
		t.Fatal("request still tracked")
	}
}

func TestFailureAnswersAtOnce(t *testing.T) {
	s := newSink()
	tr := New(s, nil)
	tr.Add("r2", "apply", map[string]Want{"ns/x": {Generation: 1}, "ns/y": {Generation: 1}}, time.Now().Add(time.Hour))
	tr.Observe("ns/y", Outcome{Generation: 1, Done: true, OK: false, Reason: "ErrImageNeverPull"})
	r := <-s.got
	if r.Phase != apiv1.Failed || !strings.Contains(r.Message, "ns/y: ErrImageNeverPull") {
		t.Fatalf("unexpected reply %+v", r)
	}
}

func TestOutcomeSeenBeforeAddCounts(t *testing.T) {
	s := newSink()
	tr := New(s, nil)
	tr.Observe("ns/x", Outcome{Generation: 3, Done: true, OK: true, Reason: "running"})
	tr.Add("r3", "apply", map[string]Want{"ns/x": {Generation: 3}}, time.Now().Add(time.Hour))
	if r := <-s.got; r.Phase != apiv1.Succeeded {
		t.Fatalf("unexpected reply %+v", r)
	}
}

func TestDeleteWaitsForGone(t *testing.T) {
	s := newSink()
	tr := New(s, nil)
	tr.Add("d1", "delete", map[string]Want{"ns/x": {Gone: true}}, time.Now().Add(time.Hour))
	tr.Observe("ns/x", Outcome{Generation: 3, Done: true, OK: true})
	if s.count() != 0 {
		t.Fatal("delete answered while pod still there")
	}
	tr.Observe("ns/x", Outcome{Gone: true})
	if r := <-s.got; r.Phase != apiv1.Succeeded || !strings.Contains(r.Message, "deleted") {
		t.Fatalf("unexpected reply %+v", r)
	}
}

func TestEmptyWantSucceedsAtOnce(t *testing.T) {
	s := newSink()
	tr := New(s, nil)
	tr.Add("c1", "apply", nil, time.Now().Add(time.Hour))
	if r := <-s.got; r.Phase != apiv1.Succeeded {
		t.Fatalf("unexpected reply %+v", r)
	}
}

func TestDeadlineFailsButNamesTheReason(t *testing.T) {
	s := newSink()
	tr := New(s, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() { tr.Run(ctx); close(done) }()
	tr.Observe("ns/slow", Outcome{Generation: 1, Reason: "CrashLoopBackOff"})
	tr.Add("r4", "apply", map[string]Want{"ns/slow": {Generation: 1}}, time.Now().Add(50*time.Millisecond))
	select {
	case r := <-s.got:
		if r.Phase != apiv1.Failed || !strings.Contains(r.Message, "CrashLoopBackOff") || !strings.Contains(r.Message, "deadline") {
			t.Fatalf("unexpected reply %+v", r)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("deadline never fired")
	}
	cancel()
	<-done
}

// A request whose pod a later command deletes or replaces cannot get what
// it waits for: it ends at once, failed, naming the later request, instead
// of at its deadline minutes later.
func TestSupersededRequestEndsAtOnce(t *testing.T) {
	hour := time.Now().Add(time.Hour)
	cases := map[string]struct {
		first, later Want
		want         string
	}{
		"apply then delete":       {Want{Generation: 1}, Want{Gone: true}, "superseded: default/web deleted by a later request r2 (later) before this one finished"},
		"apply then re-created":   {Want{Generation: 5}, Want{Generation: 1}, "superseded: default/web replaced by a later request r2 (later) before this one finished"},
		"apply then newer spec":   {Want{Generation: 1}, Want{Generation: 2}, "superseded: default/web replaced by a later request r2 (later) before this one finished"},
		"delete then apply again": {Want{Gone: true}, Want{Generation: 1}, "superseded: default/web desired again by a later request r2 (later) before this one finished"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			s := newSink()
			tr := New(s, nil)
			tr.Add("r1", "first", map[string]Want{"default/web": c.first, "default/other": {Generation: 1}}, hour)
			tr.Add("r2", "later", map[string]Want{"default/web": c.later}, hour)
			if s.count() != 1 {
				t.Fatalf("%d replies, want r1's final", s.count())
			}
			r := <-s.got
			if r.RequestID != "r1" || r.Phase != apiv1.Failed || r.Message != c.want {
				t.Fatalf("reply %+v", r)
			}
			if tr.Len() != 1 {
				t.Fatalf("%d requests tracked, want r2 only", tr.Len())
			}
			// r1 is done: an outcome for its other pod answers nothing more.
			tr.Observe("default/other", Outcome{Generation: 1, Done: true, OK: true})
			if s.count() != 1 {
				t.Fatalf("r1 answered again: %+v", s.replies)
			}
		})
	}
}

// Requests that wait for the same outcome (a re-apply of the same spec, a
// second delete) are both answered by it; a repeat under the same id
// replaces the request without answering it.
func TestSameWantIsNotSuperseded(t *testing.T) {
	s := newSink()
	tr := New(s, nil)
	hour := time.Now().Add(time.Hour)
	tr.Add("r1", "apply", map[string]Want{"default/web": {Generation: 1}}, hour)
	tr.Add("r2", "apply", map[string]Want{"default/web": {Generation: 1}}, hour)
	tr.Add("r2", "apply", map[string]Want{"default/web": {Generation: 2}}, hour)
	if s.count() != 1 || (<-s.got).RequestID != "r1" {
		t.Fatalf("replies %+v", s.replies)
	}
	tr.Add("d1", "delete", map[string]Want{"ns/x": {Gone: true}}, hour)
	tr.Add("d2", "delete", map[string]Want{"ns/x": {Gone: true}}, hour)
	tr.Observe("ns/x", Outcome{Gone: true})
	if s.count() != 3 {
		t.Fatalf("replies %+v", s.replies)
	}
}

// A delete whose pod is still within its grace period at the deadline is
// answered in_progress, saying when the grace ends, and keeps waiting; it
// succeeds when the pod is gone, or fails once the grace period and the
// slack after it passed. A delete waiting on a pod that is not
// terminating, or whose grace already ended, fails at its deadline.
func TestDeleteWaitsForTheGracePeriod(t *testing.T) {
	base := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	cases := []struct {
		name      string
		observe   []Outcome
		at        time.Time // when the deadline is looked at
		extended  bool
		thenGone  bool
		wantFinal string // the final phase
	}{
		{name: "within grace, then gone", observe: []Outcome{{Terminating: true, GraceEnds: base.Add(2 * time.Minute)}},
			at: base.Add(time.Minute), extended: true, thenGone: true, wantFinal: apiv1.Succeeded},
		{name: "within grace, still there", observe: []Outcome{{Terminating: true, GraceEnds: base.Add(2 * time.Minute)}},
			at: base.Add(time.Minute), extended: true, wantFinal: apiv1.Failed},
		{name: "grace already over", observe: []Outcome{{Terminating: true, GraceEnds: base.Add(30 * time.Second)}},
			at: base.Add(time.Minute), wantFinal: apiv1.Failed},
		{name: "not terminating", at: base.Add(time.Minute), wantFinal: apiv1.Failed},
		{name: "grace unknown", observe: []Outcome{{Terminating: true}}, at: base.Add(time.Minute), wantFinal: apiv1.Failed},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			now := base
			s := newSink()
			tr := New(s, func() time.Time { return now })
			tr.Add("d1", "delete", map[string]Want{"ns/slow": {Gone: true}}, base.Add(time.Minute))
			for _, o := range c.observe {
				tr.Observe("ns/slow", o)
			}
			now = c.at
			next := tr.expire()
			if c.extended {
				r := <-s.got
				if r.Phase != apiv1.InProgress || !strings.Contains(r.Message, "terminating: grace period ends at 2026-01-01T12:02:00Z") {
					t.Fatalf("reply at the deadline %+v, want in_progress naming the end of the grace period", r)
				}
				if want := base.Add(2*time.Minute + terminatingSlack); !next.Equal(want) {
					t.Fatalf("next deadline %v, want %v", next, want)
				}
				if c.thenGone {
					tr.Observe("ns/slow", Outcome{Gone: true})
				} else {
					now = next
					tr.expire()
				}
			}
			var final apiv1.Reply
			for r := range s.got {
				if r.Final() {
					final = r
					break
				}
			}
			if final.Phase != c.wantFinal {
				t.Fatalf("final reply %+v, want %s", final, c.wantFinal)
			}
			if tr.Len() != 0 {
				t.Fatal("request still tracked after its final reply")
			}
		})
	}
}

// An apply is never extended by a terminating pod: it waits for a pod to
// run, not to stop.
func TestApplyIsNotExtendedByGrace(t *testing.T) {
	base := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	now := base
	s := newSink()
	tr := New(s, func() time.Time { return now })
	tr.Add("a1", "apply", map[string]Want{"ns/p": {Generation: 2}}, base.Add(time.Minute))
	tr.Observe("ns/p", Outcome{Terminating: true, GraceEnds: base.Add(time.Hour)})
	now = base.Add(time.Minute)
	tr.expire()
	if r := <-s.got; r.Phase != apiv1.Failed || !strings.Contains(r.Message, "deadline passed") {
		t.Fatalf("reply %+v, want failed: deadline passed", r)
	}
}
