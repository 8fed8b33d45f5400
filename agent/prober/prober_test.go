package prober

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	v1 "k8s.io/api/core/v1"
	"k8s.io/kubernetes/pkg/probe"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/mqlet/mqlet/cri"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// call is one check a worker made.
type call struct {
	kind Kind
	id   string
	at   time.Time
}

// fakeChecks answers each check from a script per probe kind and records it.
type fakeChecks struct {
	clk    *clocktesting.FakeClock
	mu     sync.Mutex
	calls  []call
	script map[Kind]func(n int) probe.Result // n: how many checks of this kind came before
}

func (f *fakeChecks) check(_ context.Context, w *worker) (probe.Result, string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, c := range f.calls {
		if c.kind == w.kind && c.id == w.containerID {
			n++
		}
	}
	f.calls = append(f.calls, call{w.kind, w.containerID, f.clk.Now()})
	return f.script[w.kind](n), fmt.Sprintf("check %d", n), nil
}

func (f *fakeChecks) count(kind Kind) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, c := range f.calls {
		if c.kind == kind {
			n++
		}
	}
	return n
}

func (f *fakeChecks) snapshot() []call {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]call(nil), f.calls...)
}

type recorded struct {
	ref    v1.ObjectReference
	reason string
	msg    string
}

type fakeEvents struct {
	mu  sync.Mutex
	got []recorded
}

func (e *fakeEvents) ObjectEvent(ref v1.ObjectReference, _, reason, msg string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.got = append(e.got, recorded{ref, reason, msg})
}

func (e *fakeEvents) reasons(reason string) []recorded {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []recorded
	for _, r := range e.got {
		if r.reason == reason {
			out = append(out, r)
		}
	}
	return out
}

type harness struct {
	t       *testing.T
	clk     *clocktesting.FakeClock
	m       *Manager
	checks  *fakeChecks
	events  *fakeEvents
	changes chan string
}

func newHarness(t *testing.T, script map[Kind]func(int) probe.Result) *harness {
	t.Helper()
	clk := clocktesting.NewFakeClock(t0)
	h := &harness{t: t, clk: clk, checks: &fakeChecks{clk: clk, script: script}, events: &fakeEvents{}, changes: make(chan string, 100)}
	h.m = New(Options{Clock: clk, Events: h.events, OnChange: func(uid string) { h.changes <- uid }, Log: zerolog.Nop()})
	h.m.check = h.checks.check
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { h.m.Run(ctx); close(done) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Error("the manager did not stop its workers")
		}
	})
	return h
}

// until polls cond (real time, generous) and fails the test if it never holds.
func (h *harness) until(what string, cond func() bool) {
	h.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			h.t.Fatalf("timed out waiting for %s; checks so far: %+v", what, h.checks.snapshot())
		}
		time.Sleep(time.Millisecond)
	}
}

// step waits until n workers wait on the clock, then moves it by d.
func (h *harness) step(n int, d time.Duration) {
	h.t.Helper()
	h.until(fmt.Sprintf("%d workers waiting", n), func() bool { return h.clk.Waiters() == n })
	h.clk.Step(d)
}

func always(r probe.Result) func(int) probe.Result { return func(int) probe.Result { return r } }

func defaulted(p *v1.Probe) *v1.Probe {
	if p.PeriodSeconds == 0 {
		p.PeriodSeconds = 10
	}
	if p.TimeoutSeconds == 0 {
		p.TimeoutSeconds = 1
	}
	if p.SuccessThreshold == 0 {
		p.SuccessThreshold = 1
	}
	if p.FailureThreshold == 0 {
		p.FailureThreshold = 3
	}
	p.Exec = &v1.ExecAction{Command: []string{"true"}}
	return p
}

func testPod(c v1.Container) *v1.Pod {
	pod := &v1.Pod{Spec: v1.PodSpec{Containers: []v1.Container{c}}}
	pod.Name, pod.Namespace, pod.UID = "web", "default", "uid-1"
	return pod
}

func running(id string, started time.Time) *cri.PodStatus {
	return &cri.PodStatus{UID: "uid-1", Sandboxes: []cri.SandboxStatus{{ID: "sb", Ready: true, IP: "10.0.0.5"}},
		Containers: []cri.ContainerStatus{{ID: id, Name: "main", State: cri.ContainerRunning, StartedAt: started}}}
}

// A liveness probe fails only after failureThreshold failures in a row,
// is then reported once (OnChange, Unhealthy) and stops checking the
// attempt being killed; each failure is an Unhealthy event.
func TestLivenessFailsAfterThreshold(t *testing.T) {
	h := newHarness(t, map[Kind]func(int) probe.Result{
		// success, failure, success (streak broken), then failures
		Liveness: func(n int) probe.Result {
			if n == 0 || n == 2 {
				return probe.Success
			}
			return probe.Failure
		},
	})
	pod := testPod(v1.Container{Name: "main", LivenessProbe: defaulted(&v1.Probe{FailureThreshold: 3})})
	h.m.Track(pod, running("c1", t0))
	h.until("first check", func() bool { return h.checks.count(Liveness) == 1 })
	if r, ok := h.m.Result("c1", Liveness); !ok || r != Success {
		t.Fatalf("liveness result before any failure = %v %v, want Success", r, ok)
	}
	for i := 2; i <= 6; i++ {
		h.step(1, 10*time.Second)
		h.until(fmt.Sprintf("check %d", i), func() bool { return h.checks.count(Liveness) == i })
		if i < 6 && h.m.Get("c1", cri.ProbeLiveness) != cri.ProbeSuccess {
			t.Fatalf("after %d checks (fewer than 3 failures in a row) the container is already unhealthy", i)
		}
	}
	h.until("the failure to be stored", func() bool { r, _ := h.m.Result("c1", Liveness); return r == Failure })
	if got := h.m.Get("c1", cri.ProbeLiveness); got != cri.ProbeFailure {
		t.Fatalf("planner sees liveness %v, want failure", got)
	}
	if got := h.m.Get("c1", cri.ProbeReadiness); got != cri.ProbeUnknown {
		t.Fatalf("planner sees readiness %v of a container without one, want unknown", got)
	}
	select {
	case uid := <-h.changes:
		if uid != "uid-1" {
			t.Fatalf("OnChange got %q", uid)
		}
	case <-time.After(10 * time.Second):
		// The result is stored before OnChange is called.
		t.Fatal("OnChange was not called when liveness failed")
	}
	if ev := h.events.reasons(ReasonUnhealthy); len(ev) != 4 || ev[0].msg != "Liveness probe failed: check 1" || ev[0].ref.FieldPath != "spec.containers{main}" {
		t.Fatalf("Unhealthy events = %+v, want 4, the first \"Liveness probe failed: check 1\" on spec.containers{main}", ev)
	}
	// On hold: further ticks run no check.
	h.step(1, 10*time.Second)
	h.step(1, 10*time.Second)
	h.step(1, 0) // the worker is back waiting: both ticks were handled
	if n := h.checks.count(Liveness); n != 6 {
		t.Fatalf("%d checks after the failure was reported, want none after the 6th", n)
	}
}

// Readiness starts as not ready, needs successThreshold successes, and
// goes back to not ready after failureThreshold failures.
func TestReadinessThresholds(t *testing.T) {
	h := newHarness(t, map[Kind]func(int) probe.Result{
		Readiness: func(n int) probe.Result {
			if n < 2 {
				return probe.Success
			}
			return probe.Failure
		},
	})
	pod := testPod(v1.Container{Name: "main", ReadinessProbe: defaulted(&v1.Probe{SuccessThreshold: 2, FailureThreshold: 2})})
	h.m.Track(pod, running("c1", t0))
	if st := h.m.States("uid-1")["c1"]; st.Ready || !st.Started {
		t.Fatalf("before any check: %+v, want started and not ready", st)
	}
	h.until("first check", func() bool { return h.checks.count(Readiness) == 1 })
	// Checked once, though below its threshold: a verdict, not the initial result.
	h.until("the probe counted as run", func() bool { return !h.m.Unchecked("uid-1") })
	if st := h.m.States("uid-1")["c1"]; st.Ready {
		t.Fatal("ready after one success with successThreshold 2")
	}
	h.step(1, 10*time.Second)
	h.until("ready", func() bool { return h.m.States("uid-1")["c1"].Ready })
	h.step(1, 10*time.Second)
	h.until("third check", func() bool { return h.checks.count(Readiness) == 3 })
	if !h.m.States("uid-1")["c1"].Ready {
		t.Fatal("not ready after one failure with failureThreshold 2")
	}
	h.step(1, 10*time.Second)
	h.until("unready", func() bool { return !h.m.States("uid-1")["c1"].Ready })
	if got := h.m.Get("c1", cri.ProbeReadiness); got != cri.ProbeFailure {
		t.Fatalf("planner sees readiness %v, want failure", got)
	}
}

// No check runs before startedAt + initialDelaySeconds; the first runs then.
func TestInitialDelay(t *testing.T) {
	h := newHarness(t, map[Kind]func(int) probe.Result{Readiness: always(probe.Success)})
	pod := testPod(v1.Container{Name: "main", ReadinessProbe: defaulted(&v1.Probe{InitialDelaySeconds: 30, PeriodSeconds: 5})})
	// Started 5 s ago: the first check is due in 25 s.
	h.clk.SetTime(t0.Add(5 * time.Second))
	h.m.Track(pod, running("c1", t0))
	h.step(1, 24*time.Second)
	h.step(1, 0) // the timer was not yet due: the worker still waits on it
	if n := h.checks.count(Readiness); n != 0 || !h.m.Unchecked("uid-1") {
		t.Fatalf("%d checks before the initial delay (unchecked %v)", n, h.m.Unchecked("uid-1"))
	}
	h.clk.Step(time.Second)
	h.until("first check", func() bool { return h.checks.count(Readiness) == 1 })
	h.until("the probe counted as run", func() bool { return !h.m.Unchecked("uid-1") })
	if at := h.checks.snapshot()[0].at; at.Before(t0.Add(30 * time.Second)) {
		t.Fatalf("first check at %v, before started+30s", at.Sub(t0))
	}
	h.step(1, 5*time.Second)
	h.until("second check", func() bool { return h.checks.count(Readiness) == 2 })
	if got := h.checks.snapshot()[1].at.Sub(t0); got != 35*time.Second {
		t.Fatalf("second check at %v, want 35s (period 5s)", got)
	}
}

// Liveness and readiness wait for the startup probe; Started follows it.
func TestStartupHoldsOthersBack(t *testing.T) {
	h := newHarness(t, map[Kind]func(int) probe.Result{
		Startup: func(n int) probe.Result {
			if n < 3 {
				return probe.Failure
			}
			return probe.Success
		},
		Liveness:  always(probe.Success),
		Readiness: always(probe.Success),
	})
	pod := testPod(v1.Container{Name: "main",
		StartupProbe:   defaulted(&v1.Probe{FailureThreshold: 10, PeriodSeconds: 1}),
		LivenessProbe:  defaulted(&v1.Probe{PeriodSeconds: 1}),
		ReadinessProbe: defaulted(&v1.Probe{PeriodSeconds: 1})})
	h.m.Track(pod, running("c1", t0))
	h.until("first startup check", func() bool { return h.checks.count(Startup) == 1 })
	if st := h.m.States("uid-1")["c1"]; st.Started || st.Ready {
		t.Fatalf("before the startup probe passed: %+v, want neither started nor ready", st)
	}
	for i := 2; i <= 4; i++ {
		h.step(3, time.Second)
		h.until(fmt.Sprintf("startup check %d", i), func() bool { return h.checks.count(Startup) == i })
	}
	h.until("started", func() bool { return h.m.States("uid-1")["c1"].Started })
	for h.checks.count(Liveness) == 0 || h.checks.count(Readiness) == 0 {
		h.step(3, time.Second)
	}
	h.until("ready", func() bool { return h.m.States("uid-1")["c1"].Ready })
	calls := h.checks.snapshot()
	for i, c := range calls {
		// The 4th startup check is the one that passed.
		if c.kind != Startup && h.countBefore(calls, i, Startup) < 4 {
			t.Fatalf("a %s check ran before the startup probe passed: %+v", c.kind, calls)
		}
	}
	if n := h.checks.count(Startup); n != 4 {
		t.Fatalf("%d startup checks, want none after it passed", n)
	}
}

func (h *harness) countBefore(calls []call, i int, kind Kind) int {
	n := 0
	for _, c := range calls[:i] {
		if c.kind == kind {
			n++
		}
	}
	return n
}

// A container that stops running loses its workers and results; a new
// attempt gets new ones; Forget and Run's end stop everything.
func TestWorkersFollowContainers(t *testing.T) {
	h := newHarness(t, map[Kind]func(int) probe.Result{Liveness: always(probe.Success), Readiness: always(probe.Success)})
	pod := testPod(v1.Container{Name: "main", LivenessProbe: defaulted(&v1.Probe{}), ReadinessProbe: defaulted(&v1.Probe{})})
	h.m.Track(pod, running("c1", t0))
	h.m.Track(pod, running("c1", t0)) // again: no second set of workers
	h.until("two workers", func() bool { return h.clk.Waiters() == 2 })
	h.until("ready", func() bool { return h.m.States("uid-1")["c1"].Ready })

	exited := running("c1", t0)
	exited.Containers[0].State = cri.ContainerExited
	h.m.Track(pod, exited)
	if _, ok := h.m.Result("c1", Liveness); ok {
		t.Fatal("the exited container still has a liveness result")
	}
	if len(h.m.States("uid-1")) != 0 {
		t.Fatalf("States of a pod with no running container = %v", h.m.States("uid-1"))
	}
	h.until("the workers to stop", func() bool { return h.clk.Waiters() == 0 })

	h.m.Track(pod, running("c2", t0.Add(time.Minute)))
	h.until("the new attempt's workers", func() bool { return h.clk.Waiters() == 2 })
	if st, ok := h.m.States("uid-1")["c2"]; !ok || st.Ready {
		t.Fatalf("new attempt: %+v %v, want tracked and not ready before its own check", st, ok)
	}
	h.m.Forget("uid-1")
	h.until("Forget to stop the workers", func() bool { return h.clk.Waiters() == 0 })
	if _, ok := h.m.Result("c2", Readiness); ok {
		t.Fatal("Forget left a result")
	}
}

// Probes of a container that is not running, and of containers without
// probes, start nothing.
func TestNothingToProbe(t *testing.T) {
	h := newHarness(t, map[Kind]func(int) probe.Result{})
	pod := testPod(v1.Container{Name: "main"})
	h.m.Track(pod, running("c1", t0))
	withProbe := testPod(v1.Container{Name: "main", LivenessProbe: defaulted(&v1.Probe{})})
	created := running("c1", t0)
	created.Containers[0].State = cri.ContainerCreated
	h.m.Track(withProbe, created)
	h.m.Track(withProbe, nil)
	if n := h.clk.Waiters(); n != 0 {
		t.Fatalf("%d workers for nothing to probe", n)
	}
}
