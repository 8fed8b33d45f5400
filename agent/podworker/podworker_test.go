package podworker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/mqlet/mqlet/agent/pending"
	"github.com/mqlet/mqlet/cri"
)

// scriptedRuntime records syncs; it fails the first failures syncs of each pod.
type scriptedRuntime struct {
	mu        sync.Mutex
	failures  int
	backoffs  int
	syncs     map[string][]time.Time
	active    map[string]int
	maxActive int
	pods      []cri.PodRef
	killed    []string
	stopped   []string
	lists     int
}

func newScriptedRuntime() *scriptedRuntime {
	return &scriptedRuntime{syncs: map[string][]time.Time{}, active: map[string]int{}}
}

func (f *scriptedRuntime) GetPodStatus(_ context.Context, uid, name, ns string) (*cri.PodStatus, error) {
	return &cri.PodStatus{UID: uid, Name: name, Namespace: ns}, nil
}

func (f *scriptedRuntime) SyncPod(_ context.Context, in cri.SyncInput) error {
	pod := in.Pod
	key := pod.Namespace + "/" + pod.Name
	f.mu.Lock()
	f.active[key]++
	if f.active[key] > f.maxActive {
		f.maxActive = f.active[key]
	}
	n := len(f.syncs[key])
	f.syncs[key] = append(f.syncs[key], time.Now())
	f.mu.Unlock()
	<-time.After(2 * time.Millisecond) // the work takes a while, so overlapping syncs would show
	f.mu.Lock()
	f.active[key]--
	f.mu.Unlock()
	switch {
	case n < f.failures:
		return errors.New("runtime says no")
	case n < f.failures+f.backoffs:
		return &cri.BackoffError{Container: "c", Wait: 20 * time.Millisecond}
	}
	return nil
}

func (f *scriptedRuntime) KillPodByRef(_ context.Context, ref cri.PodRef, _ *int64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.killed = append(f.killed, ref.UID)
	return nil
}

func (f *scriptedRuntime) StopPod(_ context.Context, pod *v1.Pod, _ cri.EventRecorder) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.stopped = append(f.stopped, string(pod.UID))
	return nil
}

func (f *scriptedRuntime) ListPods(context.Context) ([]cri.PodRef, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lists++
	return append([]cri.PodRef(nil), f.pods...), nil
}

func (f *scriptedRuntime) RuntimeInfo() (string, string) { return "containerd", "1.6" }

func (f *scriptedRuntime) syncCount(key string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.syncs[key])
}

type mapDesired struct {
	mu   sync.Mutex
	pods map[string]*v1.Pod
}

func (d *mapDesired) DesiredPod(ns, name string) (*v1.Pod, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.pods[ns+"/"+name], nil
}
func (d *mapDesired) ConfigMap(string, string) (*v1.ConfigMap, error) { return nil, errors.New("none") }
func (d *mapDesired) Secret(string, string) (*v1.Secret, error)       { return nil, errors.New("none") }

type fakeStatus struct {
	mu       sync.Mutex
	set      map[string]v1.PodStatus
	removed  []string
	retained map[string]bool // statuses an earlier process left at the broker
	sets     int             // every Set
}

func (s *fakeStatus) Retained(ns, name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.set[ns+"/"+name]
	return ok || s.retained[ns+"/"+name]
}

func (s *fakeStatus) Set(pod *v1.Pod, st v1.PodStatus) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.set[pod.Namespace+"/"+pod.Name] = st
	s.sets++
	return nil
}
func (s *fakeStatus) Get(string, string) (*v1.Pod, bool) { return nil, false }
func (s *fakeStatus) Remove(ns, name string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.removed = append(s.removed, ns+"/"+name)
	return nil
}

type outcomes struct {
	mu  sync.Mutex
	got map[string][]pending.Outcome
}

func (o *outcomes) Observe(key string, out pending.Outcome) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.got[key] = append(o.got[key], out)
}

func (o *outcomes) last(key string) (pending.Outcome, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	l := o.got[key]
	if len(l) == 0 {
		return pending.Outcome{}, false
	}
	return l[len(l)-1], true
}

type noEvents struct{}

func (noEvents) Event(*v1.Pod, string, string, string) {}

func testPod(name string) *v1.Pod {
	return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: types.UID("uid-" + name), Generation: 1},
		Spec: v1.PodSpec{RestartPolicy: v1.RestartPolicyAlways, Containers: []v1.Container{{Name: "c", Image: "i"}}}}
}

type rig struct {
	pool    *Pool
	rt      *scriptedRuntime
	desired *mapDesired
	status  *fakeStatus
	out     *outcomes
	cancel  context.CancelFunc
	done    chan struct{}
}

func start(t *testing.T, rt *scriptedRuntime, pods ...*v1.Pod) *rig {
	d := &mapDesired{pods: map[string]*v1.Pod{}}
	for _, p := range pods {
		d.pods[p.Namespace+"/"+p.Name] = p
	}
	r := &rig{rt: rt, desired: d, status: &fakeStatus{set: map[string]v1.PodStatus{}}, out: &outcomes{got: map[string][]pending.Outcome{}}, done: make(chan struct{})}
	r.pool = New(Options{Workers: 4, BackoffBase: 5 * time.Millisecond, BackoffMax: 40 * time.Millisecond}, rt, d, r.status, r.out, noEvents{}, zerolog.Nop())
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() { r.pool.Run(ctx); close(r.done) }()
	t.Cleanup(func() { cancel(); <-r.done })
	return r
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.After(5 * time.Second)
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-tick.C:
		case <-deadline:
			t.Fatalf("timed out waiting until %s", what)
		}
	}
}

func TestOnePodIsNeverSyncedTwiceAtOnce(t *testing.T) {
	rt := newScriptedRuntime()
	r := start(t, rt, testPod("a"), testPod("b"))
	for range 200 {
		r.pool.Enqueue("ns/a")
		r.pool.Enqueue("ns/b")
	}
	waitUntil(t, "both pods synced", func() bool { return rt.syncCount("ns/a") > 0 && rt.syncCount("ns/b") > 0 })
	r.cancel()
	<-r.done
	if rt.maxActive > 1 {
		t.Fatalf("a pod was synced by %d workers at once", rt.maxActive)
	}
	if n := rt.syncCount("ns/a"); n >= 200 {
		t.Fatalf("queued duplicates were not collapsed: %d syncs", n)
	}
}

func TestFailingSyncIsRetriedWithGrowingDelays(t *testing.T) {
	rt := newScriptedRuntime()
	rt.failures = 4
	r := start(t, rt, testPod("a"))
	r.pool.Enqueue("ns/a")
	waitUntil(t, "the sync to succeed after 4 failures", func() bool { return rt.syncCount("ns/a") >= 5 })
	rt.mu.Lock()
	times := append([]time.Time(nil), rt.syncs["ns/a"]...)
	rt.mu.Unlock()
	// base 5 ms doubling: gaps of at least 5, 10, 20, 40 (capped) ms
	want := []time.Duration{5, 10, 20, 40}
	for i, w := range want {
		if gap := times[i+1].Sub(times[i]); gap < w*time.Millisecond {
			t.Fatalf("retry %d came after %v, want at least %v", i+1, gap, w*time.Millisecond)
		}
	}
	waitUntil(t, "success observed", func() bool { o, ok := r.out.last("ns/a"); return ok && o.Generation == 1 })
	if s := r.pool.Stats(); s.Failures != 4 {
		t.Fatalf("failures counted %d", s.Failures)
	}
}

func TestCrashLoopBackoffRequeuesAfterTheWait(t *testing.T) {
	rt := newScriptedRuntime()
	rt.backoffs = 2
	r := start(t, rt, testPod("a"))
	r.pool.Enqueue("ns/a")
	waitUntil(t, "two backoffs then a clean sync", func() bool { return rt.syncCount("ns/a") >= 3 })
	rt.mu.Lock()
	gap := rt.syncs["ns/a"][1].Sub(rt.syncs["ns/a"][0])
	rt.mu.Unlock()
	if gap < 20*time.Millisecond {
		t.Fatalf("resynced after %v, before the 20ms back-off ended", gap)
	}
	r.status.mu.Lock()
	st := r.status.set["ns/a"]
	r.status.mu.Unlock()
	if st.Phase == "" {
		t.Fatal("no status published")
	}
	if s := r.pool.Stats(); s.Backoffs != 2 {
		t.Fatalf("backoffs counted %d", s.Backoffs)
	}
}

func TestUndesiredPodIsKilledAndReportedGone(t *testing.T) {
	rt := newScriptedRuntime()
	rt.pods = []cri.PodRef{{UID: "old-uid", Name: "gone", Namespace: "ns"}, {UID: "other", Name: "keep", Namespace: "ns"}}
	r := start(t, rt)
	r.pool.EnqueueDelete("ns/gone", nil)
	waitUntil(t, "gone observed", func() bool { o, ok := r.out.last("ns/gone"); return ok && o.Gone })
	rt.mu.Lock()
	killed := append([]string(nil), rt.killed...)
	rt.mu.Unlock()
	if len(killed) != 1 || killed[0] != "old-uid" {
		t.Fatalf("killed %v, want only old-uid", killed)
	}
	r.status.mu.Lock()
	defer r.status.mu.Unlock()
	if len(r.status.removed) != 1 || r.status.removed[0] != "ns/gone" {
		t.Fatalf("status removed %v", r.status.removed)
	}
}

func TestRecreatedPodReplacesTheOldUID(t *testing.T) {
	rt := newScriptedRuntime()
	rt.pods = []cri.PodRef{{UID: "uid-before", Name: "a", Namespace: "ns"}}
	r := start(t, rt, testPod("a"))
	r.pool.Enqueue("ns/a")
	waitUntil(t, "synced", func() bool { return rt.syncCount("ns/a") == 1 })
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if len(rt.killed) != 1 || rt.killed[0] != "uid-before" {
		t.Fatalf("old pod under the same name not removed: %v", rt.killed)
	}
	if !r.pool.EnqueueUID("uid-a") {
		t.Fatal("PLEG events for the pod's uid are not routed")
	}
}

func TestWaitingReasonsForEveryFailedContainer(t *testing.T) {
	err := errors.Join(
		&cri.BackoffError{Container: "a", Wait: time.Second},
		fmt.Errorf("sync: %w", &cri.ContainerError{Container: "b", Reason: "ErrImageNeverPull", Err: errors.New("no image")}),
	)
	got := waitingFrom(err)
	if got["a"].Reason != "CrashLoopBackOff" || got["b"].Reason != "ErrImageNeverPull" || len(got) != 2 {
		t.Fatalf("waiting reasons %+v", got)
	}
	if waitingFrom(errors.New("plain")) == nil || len(waitingFrom(errors.New("plain"))) != 0 {
		t.Fatal("a plain error names no container")
	}
}

// A runtime pod left by an older mqlet with a path as its uid is not
// killed: the runtime would remove <podDir>/<uid>, outside the pods dir.
func TestRuntimePodWithPathUIDIsNotRemoved(t *testing.T) {
	rt := newScriptedRuntime()
	rt.pods = []cri.PodRef{{UID: "../../x", Name: "a", Namespace: "ns"}, {UID: "legacy-uid", Name: "a", Namespace: "ns"}}
	r := start(t, rt, testPod("a"))
	r.pool.Enqueue("ns/a")
	waitUntil(t, "synced", func() bool { return rt.syncCount("ns/a") == 1 })
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if len(rt.killed) != 1 || rt.killed[0] != "legacy-uid" {
		t.Fatalf("killed %v, want only legacy-uid", rt.killed)
	}
}
