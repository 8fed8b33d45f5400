package podworker

import (
	"context"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	v1 "k8s.io/api/core/v1"

	"github.com/mqlet/mqlet/agent/inflight"
	"github.com/mqlet/mqlet/agent/pending"
	"github.com/mqlet/mqlet/agent/restart"
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
	d := &mapDesired{pods: map[string]*v1.Pod{}}
	for _, p := range pods {
		d.pods[p.Namespace+"/"+p.Name] = p
	}
	ev := &recEvents{}
	r := &rig{desired: d, status: &fakeStatus{set: map[string]v1.PodStatus{}}, out: &outcomes{got: map[string][]pending.Outcome{}}, done: make(chan struct{})}
	r.pool = New(Options{Workers: 2, BackoffBase: 5 * time.Millisecond, BackoffMax: 40 * time.Millisecond, Marks: marks, Quarantines: st}, rt, d, r.status, r.out,
		restart.New(restart.DefaultPolicy, nil), ev, zerolog.Nop())
	if err := r.pool.Recover(left); err != nil {
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
	if !slices.Equal(during.Left(), []string{"ns/a"}) || len(after.Left()) != 0 {
		t.Fatalf("marks during the sync %q, after %q", during.Left(), after.Left())
	}
}

// TestPodWhoseSyncStoppedTheAgentIsQuarantined simulates the crash: a mark
// written and never cleared, the file reopened by the "next process".
func TestPodWhoseSyncStoppedTheAgentIsQuarantined(t *testing.T) {
	path := filepath.Join(t.TempDir(), "syncs")
	crashed, err := inflight.Open(path, 2)
	if err != nil {
		t.Fatal(err)
	}
	if err := crashed.Set(1, "ns/a"); err != nil {
		t.Fatal(err)
	}
	_ = crashed.Close() // the process died here: the mark stays
	marks, err := inflight.Open(path, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer marks.Close()
	st := openStore(t)
	rt := newScriptedRuntime()
	r := startGuarded(t, rt, marks, st, marks.Left(), testPod("a"), testPod("b"))
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
	// The quarantine is persisted: a further restart keeps it.
	if q, ok, _ := st.GetQuarantine("ns/a"); !ok || q.Reason != MsgStoppedAgent {
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
