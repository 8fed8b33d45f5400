package podworker

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	v1 "k8s.io/api/core/v1"

	"github.com/mqlet/mqlet/agent/pending"
	"github.com/mqlet/mqlet/cri"
)

// sandboxRuntime is a scriptedRuntime whose pods have a sandbox made at created.
type sandboxRuntime struct {
	*scriptedRuntime
	created time.Time
}

// GetPodStatus reports the sandbox ready until the pod was stopped.
func (s *sandboxRuntime) GetPodStatus(_ context.Context, uid, name, ns string) (*cri.PodStatus, error) {
	s.mu.Lock()
	ready := !slices.Contains(s.stopped, uid)
	s.mu.Unlock()
	return &cri.PodStatus{UID: uid, Name: name, Namespace: ns,
		Sandboxes: []cri.SandboxStatus{{ID: "sb", Ready: ready, CreatedAt: s.created}}}, nil
}

// keptStatus keeps what is set, as the status manager does.
type keptStatus struct {
	mu   sync.Mutex
	pods map[string]*v1.Pod
}

func (k *keptStatus) Set(pod *v1.Pod, st v1.PodStatus) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	p := pod.DeepCopy()
	p.Status = st
	k.pods[pod.Namespace+"/"+pod.Name] = p
	return nil
}

func (k *keptStatus) Get(ns, name string) (*v1.Pod, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	p, ok := k.pods[ns+"/"+name]
	if !ok {
		return nil, false
	}
	return p.DeepCopy(), true
}

func (k *keptStatus) Remove(string, string) error  { return nil }
func (k *keptStatus) Retained(string, string) bool { return false }

type recordedEvents struct {
	mu      sync.Mutex
	reasons []string
}

func (r *recordedEvents) Event(_ *v1.Pod, _, reason, _ string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reasons = append(r.reasons, reason)
}

func (r *recordedEvents) count(reason string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, x := range r.reasons {
		if x == reason {
			n++
		}
	}
	return n
}

func startDeadline(t *testing.T, rt Runtime, pod *v1.Pod) (*Pool, *keptStatus, *recordedEvents) {
	t.Helper()
	d := &mapDesired{pods: map[string]*v1.Pod{pod.Namespace + "/" + pod.Name: pod}}
	st := &keptStatus{pods: map[string]*v1.Pod{}}
	ev := &recordedEvents{}
	pool := New(Options{Workers: 2, BackoffBase: 5 * time.Millisecond, BackoffMax: 40 * time.Millisecond},
		rt, d, st, &outcomes{got: map[string][]pending.Outcome{}}, ev, zerolog.Nop())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { pool.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return pool, st, ev
}

func failedByDeadline(st *keptStatus, key string) bool {
	ns, name, _ := strings.Cut(key, "/")
	p, ok := st.Get(ns, name)
	return ok && p.Status.Phase == v1.PodFailed && p.Status.Reason == ReasonDeadlineExceeded && p.Status.Message == MsgDeadlineExceeded
}

// The runner's timer fails the pod at its deadline: stopped, Failed with
// DeadlineExceeded, one event, and not synced (restarted) again.
func TestActiveDeadlineFailsThePodAtItsDeadline(t *testing.T) {
	rt := &sandboxRuntime{scriptedRuntime: newScriptedRuntime(), created: time.Now()}
	pod := testPod("deadline")
	pod.Spec.ActiveDeadlineSeconds = ptr(int64(1))
	pool, st, ev := startDeadline(t, rt, pod)
	pool.Enqueue("ns/deadline")
	waitUntil(t, "the pod is synced", func() bool { return rt.syncCount("ns/deadline") >= 1 })
	began := time.Now()
	waitUntil(t, "the pod is failed by its deadline", func() bool { return failedByDeadline(st, "ns/deadline") })
	if took := time.Since(began); took > 3*time.Second {
		t.Errorf("failed %v after the first sync, want about 1 s", took)
	}
	waitUntil(t, "the pod is stopped", func() bool {
		rt.mu.Lock()
		defer rt.mu.Unlock()
		return len(rt.stopped) > 0
	})
	syncs, worked := rt.syncCount("ns/deadline"), pool.Stats().Syncs
	for range 3 {
		n := pool.Stats().Syncs // read first: the look may end before a read after Enqueue
		pool.Enqueue("ns/deadline")
		waitUntil(t, "the pod is looked at again", func() bool { return pool.Stats().Syncs > n })
	}
	if pool.Stats().Syncs < worked+3 {
		t.Fatalf("the pod was looked at %d more times, want 3", pool.Stats().Syncs-worked)
	}
	if !failedByDeadline(st, "ns/deadline") {
		t.Error("a later look at the pod dropped its DeadlineExceeded status")
	}
	rt.mu.Lock()
	stops := len(rt.stopped)
	rt.mu.Unlock()
	if stops != 1 {
		t.Errorf("stopped %d times, want once: nothing of the pod ran after the first stop", stops)
	}
	if got := rt.syncCount("ns/deadline"); got != syncs {
		t.Errorf("a pod past its deadline was synced %d more times", got-syncs)
	}
	if n := ev.count(ReasonDeadlineExceeded); n != 1 {
		t.Errorf("%d DeadlineExceeded events, want 1", n)
	}
	// A restart request is answered at once, not at its own deadline.
	answered := make(chan error, 1)
	if err := pool.RequestRestart("ns/deadline", string(pod.UID), "", "test", time.Now().Add(time.Minute), func(err error) { answered <- err }); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-answered:
		if err == nil || !strings.Contains(err.Error(), ReasonDeadlineExceeded) {
			t.Errorf("restart answered %v, want a refusal naming %s", err, ReasonDeadlineExceeded)
		}
	case <-time.After(5 * time.Second):
		t.Error("the restart request was not answered")
	}
	if got := rt.syncCount("ns/deadline"); got != syncs {
		t.Errorf("synced after the restart request")
	}
}

// After a restart (no status kept) the deadline counts from the pod's
// first sandbox: a pod long past it is failed without a sync.
func TestActiveDeadlineCountsFromTheSandboxAfterARestart(t *testing.T) {
	rt := &sandboxRuntime{scriptedRuntime: newScriptedRuntime(), created: time.Now().Add(-time.Hour)}
	pod := testPod("old")
	pod.Spec.ActiveDeadlineSeconds = ptr(int64(60))
	pool, st, _ := startDeadline(t, rt, pod)
	pool.Enqueue("ns/old")
	waitUntil(t, "the pod is failed by its deadline", func() bool { return failedByDeadline(st, "ns/old") })
	if n := rt.syncCount("ns/old"); n != 0 {
		t.Errorf("synced %d times, want 0", n)
	}
	p, _ := st.Get("ns", "old")
	if p.Status.StartTime == nil || time.Since(p.Status.StartTime.Time) < 59*time.Minute {
		t.Errorf("startTime %v, want the sandbox's creation an hour ago", p.Status.StartTime)
	}
}

// A pod without a deadline, or before it, is synced as usual.
func TestActiveDeadlineNotYetPassed(t *testing.T) {
	rt := &sandboxRuntime{scriptedRuntime: newScriptedRuntime(), created: time.Now()}
	pod := testPod("young")
	pod.Spec.ActiveDeadlineSeconds = ptr(int64(3600))
	pool, st, _ := startDeadline(t, rt, pod)
	pool.Enqueue("ns/young")
	waitUntil(t, "the pod is synced", func() bool { return rt.syncCount("ns/young") >= 1 })
	if failedByDeadline(st, "ns/young") {
		t.Error("failed before its deadline")
	}
	r := pool.runnerFor("ns/young")
	r.mu.Lock()
	armed := r.deadlineTimer != nil && r.deadline.After(time.Now().Add(59*time.Minute))
	r.mu.Unlock()
	if !armed {
		t.Error("the runner's deadline timer is not armed for the pod's deadline")
	}
}
