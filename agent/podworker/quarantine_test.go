package podworker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
	v1 "k8s.io/api/core/v1"

	"github.com/mqlet/mqlet/agent/inflight"
	"github.com/mqlet/mqlet/agent/pending"
	"github.com/mqlet/mqlet/agent/podstatus"
	"github.com/mqlet/mqlet/agent/store"
	"github.com/mqlet/mqlet/cri"
)

type recEvents struct {
	mu      sync.Mutex
	reasons []string
}

func (e *recEvents) Event(_ *v1.Pod, _, reason, _ string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.reasons = append(e.reasons, reason)
}

func (e *recEvents) count(reason string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for _, r := range e.reasons {
		if r == reason {
			n++
		}
	}
	return n
}

// hookRuntime is a scriptedRuntime whose SyncPod first calls hook.
type hookRuntime struct {
	*scriptedRuntime
	hook func(pod *v1.Pod)
}

func (h *hookRuntime) SyncPod(ctx context.Context, in cri.SyncInput) error {
	h.hook(in.Pod)
	return h.scriptedRuntime.SyncPod(ctx, in)
}

type qrig struct {
	*rig
	events *recEvents
	st     *store.Store
}

func startGuarded(t *testing.T, rt Runtime, marks Marker, st *store.Store, left []string, pods ...*v1.Pod) *qrig {
	return startAfterDeath(t, rt, marks, st, left, Death{}, pods...)
}

// startAfterDeath starts a pool as a process would after the previous one
// left marks left and ended as death says.
func startAfterDeath(t *testing.T, rt Runtime, marks Marker, st *store.Store, left []string, death Death, pods ...*v1.Pod) *qrig {
	d := &mapDesired{pods: map[string]*v1.Pod{}}
	for _, p := range pods {
		d.pods[p.Namespace+"/"+p.Name] = p
	}
	ev := &recEvents{}
	r := &rig{desired: d, status: &fakeStatus{set: map[string]v1.PodStatus{}}, out: &outcomes{got: map[string][]pending.Outcome{}}, done: make(chan struct{})}
	r.pool = New(Options{Workers: 2, BackoffBase: 5 * time.Millisecond, BackoffMax: 40 * time.Millisecond, Marks: marks, Quarantines: st, Deaths: st}, rt, d, r.status, r.out, ev, zerolog.Nop())
	if err := r.pool.Recover(left, death); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() { r.pool.Run(ctx); close(r.done) }()
	t.Cleanup(func() { cancel(); <-r.done })
	return &qrig{rig: r, events: ev, st: st}
}

func openStore(t *testing.T) *store.Store {
	st, err := store.Open(filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// TestSyncIsMarkedWhileRunning reads the mark file (as the next process
// would) while a sync is blocked, then after it ended.
func TestSyncIsMarkedWhileRunning(t *testing.T) {
	path := filepath.Join(t.TempDir(), "syncs")
	marks, err := inflight.Open(path, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer marks.Close()
	inSync, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	rt := &hookRuntime{scriptedRuntime: newScriptedRuntime(), hook: func(*v1.Pod) {
		once.Do(func() { close(inSync); <-release })
	}}
	r := startGuarded(t, rt, marks, openStore(t), nil, testPod("a"))
	r.pool.Enqueue("ns/a")
	<-inSync
	during, err := inflight.Open(path, 2)
	if err != nil {
		t.Fatal(err)
	}
	_ = during.Close()
	close(release)
	waitUntil(t, "sync done", func() bool { _, ok := r.out.last("ns/a"); return ok })
	after, err := inflight.Open(path, 2)
	if err != nil {
		t.Fatal(err)
	}
	_ = after.Close()
	if m := onlyMark(t, during.Left()); m.key != "ns/a" || m.phase != phaseSync || m.goroutine == 0 || len(after.Left()) != 0 {
		t.Fatalf("marks during the sync %q, after %q", during.Left(), after.Left())
	}
}

func onlyMark(t *testing.T, left []string) syncMark {
	t.Helper()
	if len(left) != 1 {
		t.Fatalf("marks %q, want one", left)
	}
	m, ok := parseMark(left[0])
	if !ok {
		t.Fatalf("mark %q does not parse", left[0])
	}
	return m
}

func TestParseMark(t *testing.T) {
	for v, want := range map[string]struct {
		m  syncMark
		ok bool
	}{
		"ns/a sync 42":  {syncMark{"ns/a", phaseSync, 42}, true},
		"ns/a read 7":   {syncMark{"ns/a", phaseRead, 7}, true},
		"ns/a":          {syncMark{"ns/a", phaseSync, 0}, true}, // an older mqlet's mark
		"ns/a nap 7":    {syncMark{}, false},
		"ns/a sync x":   {syncMark{}, false},
		"ns/a sync 1 2": {syncMark{}, false},
	} {
		if m, ok := parseMark(v); m != want.m || ok != want.ok {
			t.Errorf("parseMark(%q) = %+v %v, want %+v %v", v, m, ok, want.m, want.ok)
		}
		if want.ok && want.m.goroutine != 0 && want.m.String() != v {
			t.Errorf("%+v prints as %q, want %q", want.m, want.m.String(), v)
		}
	}
}

// death is one previous process's end, as the next start finds it.
type death struct {
	marks  []string // the marks left
	death  Death
	synced bool  // the next process completed a sync of ns/a before dying
	spec   int64 // ns/a's generation at that start (0: 1)
}

// TestQuarantineOnlyWhatIsProven replays a history of agent deaths against
// one store and checks whether the last start quarantines ns/a: one death,
// deaths while reading, a crash of another goroutine, or deaths broken by a
// completed sync or a spec change never do; SuspectDeaths in a row with the
// sync past its read, or a Go crash in the sync's goroutine (or one it
// started), do.
func TestQuarantineOnlyWhatIsProven(t *testing.T) {
	inSync := func(g uint64) []string { return []string{syncMark{"ns/a", phaseSync, g}.String()} }
	reading := []string{syncMark{"ns/a", phaseRead, 9}.String()}
	crashIn := func(ids ...uint64) Death { return Death{Crashed: true, Goroutines: ids} }
	repeat := func(n int, d death) []death {
		out := make([]death, n)
		for i := range out {
			out[i] = d
		}
		return out
	}
	for name, tc := range map[string]struct {
		history    []death
		quarantine bool
		reason     string
	}{
		"one kill during the sync":            {history: []death{{marks: inSync(5)}}},
		"deaths in a row, one short":          {history: repeat(SuspectDeaths-1, death{marks: inSync(5)})},
		"deaths in a row":                     {history: repeat(SuspectDeaths, death{marks: inSync(5)}), quarantine: true, reason: "times in a row"},
		"deaths in a row but one":             {history: append(append(repeat(SuspectDeaths-1, death{marks: inSync(5)}), death{marks: []string{"ns/b sync 5"}}), repeat(SuspectDeaths-1, death{marks: inSync(5)})...)},
		"deaths in a row, some while reading": {history: append(append(repeat(SuspectDeaths-1, death{marks: inSync(5)}), death{marks: reading}), death{marks: inSync(6)}), quarantine: true},
		"kills while waiting on the runtime":  {history: repeat(2*SuspectDeaths, death{marks: reading})},
		"a completed sync between": {history: append(append(repeat(SuspectDeaths-2, death{marks: inSync(5)}),
			death{marks: inSync(5), synced: true}), repeat(SuspectDeaths-1, death{marks: inSync(5)})...)},
		"a new spec between": {history: append(repeat(SuspectDeaths-1, death{marks: inSync(5)}),
			death{marks: inSync(5), spec: 2}, death{marks: inSync(5), spec: 2})},
		"Go crash in the sync's goroutine":         {history: []death{{marks: inSync(5), death: crashIn(5)}}, quarantine: true, reason: "Go runtime error"},
		"Go crash in a goroutine the sync started": {history: []death{{marks: inSync(5), death: crashIn(77, 5)}}, quarantine: true, reason: "Go runtime error"},
		"Go crash while reading":                   {history: []death{{marks: reading, death: crashIn(9)}}, quarantine: true},
		"Go crash elsewhere":                       {history: []death{{marks: inSync(5), death: crashIn(77, 1)}}},
		"Go crash, mark of an older mqlet":         {history: []death{{marks: []string{"ns/a"}, death: crashIn(0)}}},
	} {
		t.Run(name, func(t *testing.T) {
			st := openStore(t)
			for _, d := range tc.history {
				pod := testPod("a")
				if d.spec != 0 {
					pod.Generation = d.spec
				}
				rt := newScriptedRuntime()
				// Only the last start runs: the others died before any sync completed.
				pool := New(Options{Workers: 2, Quarantines: st, Deaths: st}, rt, &mapDesired{pods: map[string]*v1.Pod{"ns/a": pod, "ns/b": testPod("b")}}, &fakeStatus{set: map[string]v1.PodStatus{}}, &outcomes{got: map[string][]pending.Outcome{}}, noEvents{}, zerolog.Nop())
				if err := pool.Recover(d.marks, d.death); err != nil {
					t.Fatal(err)
				}
				if _, ok, _ := st.GetQuarantine("ns/a"); ok {
					break
				}
				if d.synced {
					r := startGuarded(t, rt, nil, st, nil, pod)
					r.pool.Enqueue("ns/a")
					waitUntil(t, "ns/a synced", func() bool { return rt.syncCount("ns/a") == 1 })
					r.cancel()
					<-r.done
				}
			}
			q, ok, err := st.GetQuarantine("ns/a")
			if err != nil {
				t.Fatal(err)
			}
			if ok != tc.quarantine || !strings.Contains(q.Reason, tc.reason) || (ok && !strings.HasPrefix(q.Reason, MsgStoppedAgent)) {
				t.Fatalf("quarantined %v (%+v), want %v with a reason saying %q", ok, q, tc.quarantine, tc.reason)
			}
		})
	}
}

// A completed sync clears the count, and writes the store once only.
func TestCompletedSyncClearsTheDeathCount(t *testing.T) {
	st := openStore(t)
	rt := newScriptedRuntime()
	r := startAfterDeath(t, rt, nil, st, []string{"ns/a sync 3"}, Death{}, testPod("a"))
	r.pool.Enqueue("ns/a")
	waitUntil(t, "ns/a synced", func() bool { return rt.syncCount("ns/a") == 1 })
	waitUntil(t, "the count cleared", func() bool {
		raw, _, _ := st.Meta(deathsKey)
		return string(raw) == "{}"
	})
	r.pool.suspects.mu.Lock()
	n := len(r.pool.suspects.counts)
	r.pool.suspects.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d counts left in memory", n)
	}
}

// runningRuntime reports every pod with one running container.
type runningRuntime struct{ *scriptedRuntime }

func (runningRuntime) GetPodStatus(_ context.Context, uid, name, ns string) (*cri.PodStatus, error) {
	return &cri.PodStatus{UID: uid, Name: name, Namespace: ns,
		Sandboxes:  []cri.SandboxStatus{{ID: "sb-" + name, Ready: true, CreatedAt: time.Unix(1000, 0), IP: "10.0.0.2"}},
		Containers: []cri.ContainerStatus{{ID: "cid-" + name, Name: "c", State: cri.ContainerRunning, CreatedAt: time.Unix(1001, 0), StartedAt: time.Unix(1002, 0), Image: "i", RestartCount: 2}},
	}, nil
}

// TestQuarantinedPodIsReportedAsItRuns: a quarantined pod is not synced
// (no SyncPod), it is announced once, its commands fail, and its status
// is the runtime's view (running, its container id and restart count)
// with reason Quarantined, never a fresh Pending. A new spec lifts it.
func TestQuarantinedPodIsReportedAsItRuns(t *testing.T) {
	st := openStore(t)
	rt := runningRuntime{newScriptedRuntime()}
	r := startAfterDeath(t, rt, nil, st, []string{"ns/a sync 5"}, Death{Crashed: true, Goroutines: []uint64{5}}, testPod("a"), testPod("b"))
	r.pool.Enqueue("ns/a")
	r.pool.Enqueue("ns/b")
	waitUntil(t, "b synced and a reported", func() bool {
		_, ok := r.out.last("ns/a")
		return rt.syncCount("ns/b") == 1 && ok
	})
	r.pool.Enqueue("ns/a") // again: still not synced, announced once
	waitUntil(t, "a reported twice", func() bool { r.out.mu.Lock(); defer r.out.mu.Unlock(); return len(r.out.got["ns/a"]) == 2 })
	if n := rt.syncCount("ns/a"); n != 0 {
		t.Fatalf("quarantined pod synced %d times", n)
	}
	out, _ := r.out.last("ns/a")
	r.status.mu.Lock()
	status := r.status.set["ns/a"]
	r.status.mu.Unlock()
	if !out.Done || out.OK || status.Reason != ReasonQuarantined || r.events.count(ReasonQuarantined) != 1 {
		t.Fatalf("outcome %+v, status reason %q, Quarantined events %d", out, status.Reason, r.events.count(ReasonQuarantined))
	}
	if status.Phase != v1.PodRunning || len(status.ContainerStatuses) != 1 || status.ContainerStatuses[0].ContainerID != "containerd://cid-a" ||
		status.ContainerStatuses[0].State.Running == nil || status.ContainerStatuses[0].RestartCount != 2 {
		t.Fatalf("a running quarantined pod is reported as %s", dumpJSON(status))
	}
	if q, ok, _ := st.GetQuarantine("ns/a"); !ok || !strings.HasPrefix(q.Reason, MsgStoppedAgent) {
		t.Fatalf("quarantine record %+v %v", q, ok)
	}

	// A new spec (generation 2) lifts it.
	next := testPod("a")
	next.Generation = 2
	r.desired.mu.Lock()
	r.desired.pods["ns/a"] = next
	r.desired.mu.Unlock()
	r.pool.Enqueue("ns/a")
	waitUntil(t, "a synced after the spec changed", func() bool { return rt.syncCount("ns/a") == 1 })
	if _, ok, _ := st.GetQuarantine("ns/a"); ok || r.events.count(ReasonQuarantineLifted) != 1 {
		t.Fatalf("quarantine not lifted (record %v, lifted events %d)", ok, r.events.count(ReasonQuarantineLifted))
	}
}

// A quarantine whose sync died in its runtime read does not read the
// runtime again (this runtime would say running): a pod whose status an
// earlier process left retained is published with phase Unknown and the
// quarantine, not left with the retained view that hid the quarantine
// (chaos run: a quarantined pod showed as Pending with no reason), and not
// as Pending.
func TestQuarantinedInReadIsPublishedUnknown(t *testing.T) {
	st := openStore(t)
	rt := runningRuntime{newScriptedRuntime()}
	r := startAfterDeath(t, rt, nil, st, []string{"ns/a read 5"}, Death{Crashed: true, Goroutines: []uint64{5}}, testPod("a"))
	r.status.mu.Lock()
	r.status.retained = map[string]bool{"ns/a": true}
	r.status.mu.Unlock()
	r.pool.Enqueue("ns/a")
	waitUntil(t, "a reported", func() bool { _, ok := r.out.last("ns/a"); return ok })
	r.status.mu.Lock()
	sets, got := r.status.sets, r.status.set["ns/a"]
	r.status.mu.Unlock()
	if sets != 1 || got.Phase != v1.PodUnknown || got.Reason != ReasonQuarantined || !strings.Contains(got.Message, "not read") {
		t.Fatalf("%d statuses published, the last %s %s %q; want one, Unknown, Quarantined, saying the runtime was not read", sets, got.Phase, got.Reason, got.Message)
	}
	if n := r.events.count(ReasonQuarantined); n != 1 {
		t.Fatalf("%d Quarantined events, want 1", n)
	}
}

// A quarantine recorded by an older mqlet (for any death) is lifted.
func TestOlderRuleQuarantineIsLifted(t *testing.T) {
	st := openStore(t)
	pod := testPod("a")
	if err := st.SetQuarantine("ns/a", store.Quarantine{UID: pod.UID, Generation: pod.Generation, Reason: MsgStoppedAgent, Since: time.Now()}); err != nil {
		t.Fatal(err)
	}
	rt := newScriptedRuntime()
	r := startGuarded(t, rt, nil, st, nil, pod)
	r.pool.Enqueue("ns/a")
	waitUntil(t, "a synced", func() bool { return rt.syncCount("ns/a") == 1 })
	if _, ok, _ := st.GetQuarantine("ns/a"); ok || r.events.count(ReasonQuarantineLifted) != 1 {
		t.Fatalf("older quarantine not lifted (record %v, lifted events %d)", ok, r.events.count(ReasonQuarantineLifted))
	}
}

func TestPanicInSyncDoesNotStopTheWorkers(t *testing.T) {
	var mu sync.Mutex
	panics := 0
	rt := &hookRuntime{scriptedRuntime: newScriptedRuntime(), hook: func(*v1.Pod) {
		mu.Lock()
		defer mu.Unlock()
		if panics == 0 {
			panics++
			panic("boom")
		}
	}}
	r := startGuarded(t, rt, nil, openStore(t), nil, testPod("a"))
	r.pool.Enqueue("ns/a")
	waitUntil(t, "a synced after the panic", func() bool { return rt.syncCount("ns/a") == 1 })
	if r.events.count(ReasonSyncPanicked) != 1 || r.pool.Stats().Failures != 1 {
		t.Fatalf("SyncPanicked events %d, failures %d", r.events.count(ReasonSyncPanicked), r.pool.Stats().Failures)
	}
}

// listHangs is a scriptedRuntime whose first ListPods waits until released,
// as with a runtime that stopped answering.
type listHangs struct {
	*scriptedRuntime
	once             sync.Once
	inList, released chan struct{}
}

func (l *listHangs) ListPods(ctx context.Context) ([]cri.PodRef, error) {
	l.once.Do(func() {
		close(l.inList)
		<-l.released
	})
	return l.scriptedRuntime.ListPods(ctx)
}

// The mark covers every runtime call of a desired pod's sync: a runtime
// hanging on the listing that comes first still leaves the pod marked.
func TestSyncIsMarkedFromItsFirstRuntimeCall(t *testing.T) {
	path := filepath.Join(t.TempDir(), "syncs")
	marks, err := inflight.Open(path, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer marks.Close()
	rt := &listHangs{scriptedRuntime: newScriptedRuntime(), inList: make(chan struct{}), released: make(chan struct{})}
	r := startGuarded(t, rt, marks, openStore(t), nil, testPod("a"))
	r.pool.Enqueue("ns/a")
	select {
	case <-rt.inList:
	case <-time.After(5 * time.Second):
		t.Fatal("the pod's sync never listed the runtime's pods")
	}
	during, err := inflight.Open(path, 2)
	if err != nil {
		t.Fatal(err)
	}
	_ = during.Close()
	close(rt.released)
	if m := onlyMark(t, during.Left()); m.key != "ns/a" || m.phase != phaseRead {
		t.Fatalf("marks while the listing hangs: %q", during.Left())
	}
}

func dumpJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// unreachableRuntime cannot be asked anything.
type unreachableRuntime struct{ *scriptedRuntime }

func (unreachableRuntime) GetPodStatus(context.Context, string, string, string) (*cri.PodStatus, error) {
	return nil, errors.New("connection refused")
}

// TestUnreachableRuntimeKeepsTheRetainedView: while the runtime cannot be
// read, a pod whose status an earlier process left at the broker gets
// nothing new (a status built without the runtime says Pending, no
// container); a pod with no status anywhere is reported not started, with
// the reason.
func TestUnreachableRuntimeKeepsTheRetainedView(t *testing.T) {
	rt := unreachableRuntime{newScriptedRuntime()}
	r := startGuarded(t, rt, nil, openStore(t), nil, testPod("old"), testPod("new"))
	r.status.mu.Lock()
	r.status.retained = map[string]bool{"ns/old": true}
	r.status.mu.Unlock()
	r.pool.Enqueue("ns/old")
	r.pool.Enqueue("ns/new")
	waitUntil(t, "new reported", func() bool {
		r.status.mu.Lock()
		defer r.status.mu.Unlock()
		_, ok := r.status.set["ns/new"]
		return ok
	})
	waitUntil(t, "old tried again", func() bool { return r.pool.Stats().Failures >= 4 })
	r.status.mu.Lock()
	defer r.status.mu.Unlock()
	if st, ok := r.status.set["ns/old"]; ok {
		t.Fatalf("a status was published over the retained one while the runtime was unreachable: %s", dumpJSON(st))
	}
	if st := r.status.set["ns/new"]; st.Phase != v1.PodPending {
		t.Fatalf("a pod never reported is %s", dumpJSON(st))
	}
}

// A sync that cannot read the runtime (at a start, before the runtime is
// connected) proves nothing: the count stays.
func TestUnreadSyncKeepsTheDeathCount(t *testing.T) {
	st := openStore(t)
	rt := unreachableRuntime{newScriptedRuntime()}
	r := startAfterDeath(t, rt, nil, st, []string{"ns/a sync 3"}, Death{}, testPod("a"))
	r.pool.Enqueue("ns/a")
	waitUntil(t, "ns/a tried twice", func() bool { return r.pool.Stats().Failures >= 2 })
	raw, _, _ := st.Meta(deathsKey)
	var counts map[string]suspect
	if err := json.Unmarshal(raw, &counts); err != nil || counts["ns/a"].Deaths != 1 {
		t.Fatalf("counts after syncs that could not read the runtime: %s (%v)", raw, err)
	}
}

// unprobed is a prober whose probes have not run until ran is set.
type unprobed struct{ ran atomic.Bool }

func (u *unprobed) Get(string, cri.ProbeType) cri.ProbeResult { return cri.ProbeSuccess }
func (u *unprobed) Track(*v1.Pod, *cri.PodStatus)             {}
func (u *unprobed) Forget(string)                             {}
func (u *unprobed) Unchecked(string) bool                     { return !u.ran.Load() }
func (u *unprobed) States(string) map[string]podstatus.Probed {
	return map[string]podstatus.Probed{"cid-a": {Started: true, Ready: u.ran.Load()}}
}

// TestFirstStatusWaitsForTheFirstProbes: after a restart, a pod whose
// status an earlier process retained is not published as not ready just
// because its readiness probe has not run again yet; it is published once
// the probe has run, and after the probes' timeouts at the latest.
func TestFirstStatusWaitsForTheFirstProbes(t *testing.T) {
	for _, probeRuns := range []bool{true, false} {
		t.Run(fmt.Sprintf("probe runs %v", probeRuns), func(t *testing.T) {
			pod := testPod("a")
			pod.Spec.Containers[0].ReadinessProbe = &v1.Probe{TimeoutSeconds: 1}
			d := &mapDesired{pods: map[string]*v1.Pod{"ns/a": pod}}
			status := &fakeStatus{set: map[string]v1.PodStatus{}, retained: map[string]bool{"ns/a": true}}
			pr := &unprobed{}
			rt := runningRuntime{newScriptedRuntime()}
			pool := New(Options{Workers: 1, Probes: pr}, rt, d, status, &outcomes{got: map[string][]pending.Outcome{}}, noEvents{}, zerolog.Nop())
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { pool.Run(ctx); close(done) }()
			t.Cleanup(func() { cancel(); <-done })
			began := time.Now()
			pool.Enqueue("ns/a")
			waitUntil(t, "a synced", func() bool { return pool.Stats().Syncs >= 1 })
			status.mu.Lock()
			early := status.sets
			status.mu.Unlock()
			if early != 0 {
				t.Fatalf("published before the first probe ran")
			}
			if probeRuns {
				pr.ran.Store(true)
				pool.Enqueue("ns/a") // the prober's OnChange
			}
			waitUntil(t, "a published", func() bool { status.mu.Lock(); defer status.mu.Unlock(); return status.sets > 0 })
			status.mu.Lock()
			st := status.set["ns/a"]
			status.mu.Unlock()
			took := time.Since(began)
			if probeRuns && (!podReady(st) || took > time.Second) {
				t.Fatalf("after the probe ran: published %s after %v", dumpJSON(st.Conditions), took)
			}
			if !probeRuns && took < 2*time.Second {
				t.Fatalf("published %v after the first sync, before the probe's timeout and a second", took)
			}
		})
	}
}

func podReady(st v1.PodStatus) bool {
	for _, c := range st.Conditions {
		if c.Type == v1.PodReady {
			return c.Status == v1.ConditionTrue
		}
	}
	return false
}
