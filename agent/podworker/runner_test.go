package podworker

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"go.uber.org/goleak"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/mqlet/mqlet/agent/pending"
	"github.com/mqlet/mqlet/agent/restart"
	"github.com/mqlet/mqlet/cri"
)

// backoffRuntime restarts container "c" at every sync, asking the tracker
// it is handed first, as the runtime's SyncPod does.
type backoffRuntime struct {
	*scriptedRuntime
	mu     sync.Mutex
	waited map[string]bool // key → the tracker said wait at its last sync
}

func (b *backoffRuntime) SyncPod(ctx context.Context, in cri.SyncInput) error {
	pod, tr := in.Pod, in.Backoff
	key, exited := cri.BackoffKey(pod, &v1.Container{Name: "c"}), time.Now()
	wait, _ := tr.InBackoff(key, exited)
	if !wait {
		tr.Next(key, exited)
	}
	b.mu.Lock()
	b.waited[pod.Namespace+"/"+pod.Name] = wait
	b.mu.Unlock()
	return b.scriptedRuntime.SyncPod(ctx, in)
}

func (b *backoffRuntime) lastWaited(key string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.waited[key]
}

// Client-given uids can be prefixes of one another ("u" and "u2"); the
// deletion of one pod must not reset the crash-loop backoff of the other
// (a global tracker cleaned by uid prefix did).
func TestUIDPrefixesDoNotShareBackoff(t *testing.T) {
	rt := &backoffRuntime{scriptedRuntime: newScriptedRuntime(), waited: map[string]bool{}}
	x, y := testPod("x"), testPod("y")
	x.UID, y.UID = types.UID("u"), types.UID("u2")
	rt.pods = []cri.PodRef{{UID: "u", Name: "x", Namespace: "ns"}, {UID: "u2", Name: "y", Namespace: "ns"}}
	r := start(t, rt.scriptedRuntime, x, y)
	r.pool.rt = rt
	r.pool.Enqueue("ns/y")
	waitUntil(t, "y synced", func() bool { return rt.syncCount("ns/y") == 1 })
	r.pool.Enqueue("ns/x")
	waitUntil(t, "x synced", func() bool { return rt.syncCount("ns/x") == 1 })

	r.desired.mu.Lock()
	delete(r.desired.pods, "ns/x")
	r.desired.mu.Unlock()
	r.pool.EnqueueDelete("ns/x", nil)
	waitUntil(t, "x gone", func() bool { o, ok := r.out.last("ns/x"); return ok && o.Gone })

	r.pool.Enqueue("ns/y")
	waitUntil(t, "y synced again", func() bool { return rt.syncCount("ns/y") == 2 })
	if !rt.lastWaited("ns/y") {
		t.Fatal("y's crash-loop backoff was dropped with the deletion of x")
	}
}

// hangRuntime's SyncPod of the pods in hang blocks until its context is
// cancelled, as an image pull or a create that never ends.
type hangRuntime struct {
	*scriptedRuntime
	hang    map[string]bool
	started chan string
	mu      sync.Mutex
	graces  map[string]*int64
	// killHangs makes every kill wait until its context ends.
	killHangs bool
}

func (h *hangRuntime) SyncPod(ctx context.Context, in cri.SyncInput) error {
	pod := in.Pod
	if h.hang[pod.Name] {
		h.started <- pod.Name
		<-ctx.Done()
		return ctx.Err()
	}
	return h.scriptedRuntime.SyncPod(ctx, in)
}

func (h *hangRuntime) KillPodByRef(ctx context.Context, ref cri.PodRef, grace *int64) error {
	h.mu.Lock()
	h.graces[ref.Name] = grace
	h.mu.Unlock()
	if h.killHangs {
		<-ctx.Done()
		return ctx.Err()
	}
	return h.scriptedRuntime.KillPodByRef(ctx, ref, grace)
}

func startHang(t *testing.T, workers int, hang []string, pods ...*v1.Pod) (*rig, *hangRuntime) {
	rt := &hangRuntime{scriptedRuntime: newScriptedRuntime(), hang: map[string]bool{}, started: make(chan string, 64), graces: map[string]*int64{}}
	for _, n := range hang {
		rt.hang[n] = true
	}
	d := &mapDesired{pods: map[string]*v1.Pod{}}
	for _, p := range pods {
		d.pods[p.Namespace+"/"+p.Name] = p
		rt.pods = append(rt.pods, cri.PodRef{UID: string(p.UID), Name: p.Name, Namespace: p.Namespace})
	}
	r := &rig{desired: d, status: &fakeStatus{set: map[string]v1.PodStatus{}}, out: &outcomes{got: map[string][]pending.Outcome{}}, done: make(chan struct{})}
	r.pool = New(Options{Workers: workers, BackoffBase: 5 * time.Millisecond, BackoffMax: 40 * time.Millisecond}, rt, d, r.status, r.out, noEvents{}, zerolog.Nop())
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() { r.pool.Run(ctx); close(r.done) }()
	t.Cleanup(func() { cancel(); <-r.done })
	return r, rt
}

func (r *rig) undesire(keys ...string) {
	r.desired.mu.Lock()
	defer r.desired.mu.Unlock()
	for _, k := range keys {
		delete(r.desired.pods, k)
	}
}

func waitStarted(t *testing.T, rt *hangRuntime, name string) {
	t.Helper()
	select {
	case got := <-rt.started:
		if got != name {
			t.Fatalf("sync of %s started, want %s", got, name)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("sync of %s never started", name)
	}
}

// A delete of a pod whose sync hangs (an image pull, a create that never
// returns) cancels that sync and completes within the pod's grace period
// plus 2 s, instead of waiting for it.
func TestDeleteCancelsABlockedSync(t *testing.T) {
	pod := testPod("stuck")
	pod.Spec.TerminationGracePeriodSeconds = ptr(int64(1))
	r, rt := startHang(t, 1, []string{"stuck"}, pod)
	r.pool.Enqueue("ns/stuck")
	waitStarted(t, rt, "stuck")

	began := time.Now()
	r.undesire("ns/stuck")
	r.pool.EnqueueDelete("ns/stuck", nil)
	limit := time.Duration(*pod.Spec.TerminationGracePeriodSeconds)*time.Second + 2*time.Second
	for {
		if o, ok := r.out.last("ns/stuck"); ok && o.Gone {
			break
		}
		if time.Since(began) > limit {
			t.Fatalf("delete not done %v after it was asked (limit %v)", time.Since(began), limit)
		}
		time.Sleep(5 * time.Millisecond)
	}
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if g := rt.graces["stuck"]; g == nil || *g != 1 {
		t.Fatalf("killed with grace %v, want the pod's own 1 s", g)
	}
}

// Deletes and kills take no sync slot: with the only slot held by a sync
// that hangs, twenty other pods are still removed.
func TestDeletesDoNotWaitForASyncSlot(t *testing.T) {
	pods := []*v1.Pod{testPod("stuck")}
	var keys []string
	for i := range 20 {
		p := testPod("p" + string(rune('a'+i)))
		pods = append(pods, p)
		keys = append(keys, "ns/"+p.Name)
	}
	r, rt := startHang(t, 1, []string{"stuck"}, pods...)
	r.pool.Enqueue("ns/stuck")
	waitStarted(t, rt, "stuck")
	r.undesire(keys...)
	for _, k := range keys {
		r.pool.EnqueueDelete(k, nil)
	}
	waitUntil(t, "all twenty reported gone", func() bool {
		for _, k := range keys {
			if o, ok := r.out.last(k); !ok || !o.Gone {
				return false
			}
		}
		return true
	})
	if o, ok := r.out.last("ns/stuck"); ok {
		t.Fatalf("the hanging sync ended (outcome %+v); the test proves nothing", o)
	}
}

// A delete that comes while the pod waits for a slot cancels the wait.
func TestDeleteCancelsASyncWaitingForASlot(t *testing.T) {
	r, rt := startHang(t, 1, []string{"stuck"}, testPod("stuck"), testPod("next"))
	r.pool.Enqueue("ns/stuck")
	waitStarted(t, rt, "stuck")
	r.pool.Enqueue("ns/next") // waits for the slot
	waitUntil(t, "next waiting", func() bool { return r.pool.runners.find("ns/next") != nil })
	r.undesire("ns/next")
	r.pool.EnqueueDelete("ns/next", nil)
	waitUntil(t, "next gone", func() bool { o, ok := r.out.last("ns/next"); return ok && o.Gone })
	if n := rt.syncCount("ns/next"); n != 0 {
		t.Fatalf("the deleted pod was synced %d times", n)
	}
}

// Every known pod is synced again after the resync period without any
// other cause (drift PLEG missed).
func TestResyncSyncsKnownPodsAgain(t *testing.T) {
	rt := newScriptedRuntime()
	d := &mapDesired{pods: map[string]*v1.Pod{"ns/a": testPod("a")}}
	st, out := &fakeStatus{set: map[string]v1.PodStatus{}}, &outcomes{got: map[string][]pending.Outcome{}}
	pool := New(Options{Workers: 1, Resync: 20 * time.Millisecond}, rt, d, st, out, noEvents{}, zerolog.Nop())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { pool.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	pool.Enqueue("ns/a")
	waitUntil(t, "three syncs from one enqueue", func() bool { return rt.syncCount("ns/a") >= 3 })
	if rt.syncCount("ns/b") != 0 {
		t.Fatal("an unknown pod was synced")
	}
}

// Once Run returns, no goroutine of the pool is left: not the per-key
// ones (one hanging in a sync, one waiting for a slot), not a kill in
// flight, not the queue's timers nor the resync loop.
func TestNoGoroutineLeftAfterThePoolStops(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	hang := &hangRuntime{scriptedRuntime: newScriptedRuntime(), hang: map[string]bool{"stuck": true}, started: make(chan string, 4), graces: map[string]*int64{}, killHangs: true}
	hang.pods = []cri.PodRef{{UID: "uid-stubborn", Name: "stubborn", Namespace: "ns"}}
	d := &mapDesired{pods: map[string]*v1.Pod{"ns/stuck": testPod("stuck"), "ns/next": testPod("next")}}
	st, out := &fakeStatus{set: map[string]v1.PodStatus{}}, &outcomes{got: map[string][]pending.Outcome{}}
	pool := New(Options{Workers: 1, Resync: time.Hour}, hang, d, st, out, noEvents{}, zerolog.Nop())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { pool.Run(ctx); close(done) }()
	pool.Enqueue("ns/stuck")
	waitStarted(t, hang, "stuck")
	pool.Enqueue("ns/next")                // waits for the slot
	pool.EnqueueDelete("ns/stubborn", nil) // its kill blocks
	pool.queue.AddAfter("ns/later", time.Hour)
	waitUntil(t, "the kill started", func() bool {
		r := pool.runners.find("ns/stubborn")
		return r != nil && !r.idle()
	})
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
}

// exitedRuntime reports the pod's only container exited 0 with the
// sandbox up until StopPod, which waits until released.
type exitedRuntime struct {
	*scriptedRuntime
	inStop, release chan struct{}
	stopOnce        sync.Once
}

func (e *exitedRuntime) GetPodStatus(_ context.Context, uid, name, ns string) (*cri.PodStatus, error) {
	now := time.Now()
	e.mu.Lock()
	ready := !slices.Contains(e.stopped, uid)
	e.mu.Unlock()
	return &cri.PodStatus{UID: uid, Name: name, Namespace: ns,
		Sandboxes:  []cri.SandboxStatus{{ID: "sb", Ready: ready, CreatedAt: now.Add(-time.Minute)}},
		Containers: []cri.ContainerStatus{{ID: "c1", Name: "c", State: cri.ContainerExited, CreatedAt: now.Add(-time.Minute), StartedAt: now.Add(-time.Minute), FinishedAt: now, Reason: "Completed"}},
	}, nil
}

func (e *exitedRuntime) StopPod(ctx context.Context, pod *v1.Pod, ev cri.EventRecorder) error {
	e.stopOnce.Do(func() { close(e.inStop) })
	select {
	case <-e.release:
	case <-ctx.Done():
	}
	return e.scriptedRuntime.StopPod(ctx, pod, ev)
}

// The terminal status of a pod whose containers are done is published as
// soon as the sync sees it, before the sandbox is stopped; the stop holds
// no sync slot.
func TestTerminalStatusIsPublishedBeforeTheCleanUp(t *testing.T) {
	rt := &exitedRuntime{scriptedRuntime: newScriptedRuntime(), inStop: make(chan struct{}), release: make(chan struct{})}
	pod := testPod("job")
	pod.Spec.RestartPolicy = v1.RestartPolicyNever
	d := &mapDesired{pods: map[string]*v1.Pod{"ns/job": pod}}
	st, out := &fakeStatus{set: map[string]v1.PodStatus{}}, &outcomes{got: map[string][]pending.Outcome{}}
	pool := New(Options{Workers: 1}, rt, d, st, out, noEvents{}, zerolog.Nop())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { pool.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	pool.Enqueue("ns/job")
	select {
	case <-rt.inStop:
	case <-time.After(5 * time.Second):
		t.Fatal("never stopped")
	}
	st.mu.Lock()
	phase := st.set["ns/job"].Phase
	st.mu.Unlock()
	if phase != v1.PodSucceeded {
		t.Fatalf("phase while the sandbox is being stopped: %q, want Succeeded", phase)
	}
	// With the only slot's pod stopping, another pod is synced at once.
	d.mu.Lock()
	d.pods["ns/other"] = testPod("other")
	d.mu.Unlock()
	pool.Enqueue("ns/other")
	waitUntil(t, "another pod synced while the first stops", func() bool { return rt.syncCount("ns/other") >= 1 })
	close(rt.release)
	waitUntil(t, "the stopped pod synced after its stop", func() bool { return rt.syncCount("ns/job") >= 1 })
}

// listBlockedRuntime is an exitedRuntime whose ListPods (the listing of
// old runtime pods a sync makes) blocks until released.
type listBlockedRuntime struct {
	*exitedRuntime
	inList, releaseList chan struct{}
	once                sync.Once
}

func (l *listBlockedRuntime) ListPods(ctx context.Context) ([]cri.PodRef, error) {
	l.once.Do(func() { close(l.inList) })
	select {
	case <-l.releaseList:
	case <-ctx.Done():
	}
	return l.exitedRuntime.ListPods(ctx)
}

// The terminal status is published before the sync asks the runtime for
// anything but the pod's own status: no listing delays it.
func TestTerminalStatusIsPublishedBeforeTheListing(t *testing.T) {
	ex := &exitedRuntime{scriptedRuntime: newScriptedRuntime(), inStop: make(chan struct{}), release: make(chan struct{})}
	close(ex.release)
	rt := &listBlockedRuntime{exitedRuntime: ex, inList: make(chan struct{}), releaseList: make(chan struct{})}
	pod := testPod("job")
	pod.Spec.RestartPolicy = v1.RestartPolicyNever
	d := &mapDesired{pods: map[string]*v1.Pod{"ns/job": pod}}
	st, out := &fakeStatus{set: map[string]v1.PodStatus{}}, &outcomes{got: map[string][]pending.Outcome{}}
	pool := New(Options{Workers: 1}, rt, d, st, out, noEvents{}, zerolog.Nop())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { pool.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	pool.Enqueue("ns/job")
	select {
	case <-rt.inList:
	case <-time.After(5 * time.Second):
		t.Fatal("never listed the runtime pods")
	}
	st.mu.Lock()
	phase := st.set["ns/job"].Phase
	st.mu.Unlock()
	close(rt.releaseList)
	if phase != v1.PodSucceeded {
		t.Fatalf("phase while the runtime pods are listed: %q, want Succeeded", phase)
	}
}

// A failing stop of a finished pod is retried with a delay that grows to
// the maximum; one that works resets it.
func TestRunnerStopRetryDelay(t *testing.T) {
	r := newRunner("ns/p", restart.Policy{})
	fail := errors.New("stop sandbox: cni teardown failed")
	var got []time.Duration
	for range 5 {
		if !r.beginStop() {
			t.Fatal("a stop could not begin after the last one ended")
		}
		if r.beginStop() {
			t.Fatal("a second stop began while one runs")
		}
		got = append(got, r.stopEnded(fail, 10*time.Millisecond, 50*time.Millisecond))
	}
	want := []time.Duration{10 * time.Millisecond, 20 * time.Millisecond, 40 * time.Millisecond, 50 * time.Millisecond, 50 * time.Millisecond}
	if !slices.Equal(got, want) {
		t.Errorf("retry delays %v, want %v", got, want)
	}
	r.beginStop()
	if d := r.stopEnded(nil, 10*time.Millisecond, 50*time.Millisecond); d != 0 {
		t.Errorf("delay after a stop that worked: %v, want 0", d)
	}
	r.beginStop()
	if d := r.stopEnded(fail, 10*time.Millisecond, 50*time.Millisecond); d != 10*time.Millisecond {
		t.Errorf("delay after a failure following a success: %v, want 10ms", d)
	}
}

// The runtime pods are listed (for older uids of the pod's name) at the
// first sync of a uid only: later syncs of it skip the listing, and a pod
// re-created under a new uid is listed again.
func TestListingOncePerUID(t *testing.T) {
	rt := newScriptedRuntime()
	pod := testPod("web")
	d := &mapDesired{pods: map[string]*v1.Pod{"ns/web": pod}}
	pool := New(Options{Workers: 1}, rt, d, &fakeStatus{set: map[string]v1.PodStatus{}}, &outcomes{got: map[string][]pending.Outcome{}}, noEvents{}, zerolog.Nop())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { pool.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	lists := func() int {
		rt.mu.Lock()
		defer rt.mu.Unlock()
		return rt.lists
	}
	for i := 1; i <= 3; i++ {
		pool.Enqueue("ns/web")
		waitUntil(t, "the pod synced", func() bool { return rt.syncCount("ns/web") >= i })
	}
	if n := lists(); n != 1 {
		t.Errorf("%d listings for 3 syncs of one uid, want 1", n)
	}
	again := testPod("web")
	again.UID = "uid-web-2"
	d.mu.Lock()
	d.pods["ns/web"] = again
	d.mu.Unlock()
	pool.Enqueue("ns/web")
	waitUntil(t, "the re-created pod synced", func() bool { return rt.syncCount("ns/web") >= 4 })
	if n := lists(); n != 2 {
		t.Errorf("%d listings after the pod was re-created, want 2", n)
	}
}
