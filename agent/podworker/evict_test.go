package podworker

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	v1 "k8s.io/api/core/v1"

	"github.com/mqlet/mqlet/agent/pending"
	"github.com/mqlet/mqlet/cri"
)

type mapLedger struct {
	mu sync.Mutex
	m  map[string][]byte
}

func (l *mapLedger) Meta(key string) ([]byte, bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	v, ok := l.m[key]
	return v, ok, nil
}

func (l *mapLedger) SetMeta(key string, value []byte) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.m[key] = append([]byte(nil), value...)
	return nil
}

// graceRecorder records the grace period each stop was asked with.
type graceRecorder struct {
	*sandboxRuntime
	mu     sync.Mutex
	graces []int64
}

func (g *graceRecorder) StopPod(ctx context.Context, pod *v1.Pod, ev cri.EventRecorder) error {
	g.mu.Lock()
	if s := pod.Spec.TerminationGracePeriodSeconds; s != nil {
		g.graces = append(g.graces, *s)
	}
	g.mu.Unlock()
	return g.sandboxRuntime.StopPod(ctx, pod, ev)
}

func startEvictPool(t *testing.T, rt Runtime, pod *v1.Pod, ledger Ledger, released *[]string) (*Pool, *keptStatus) {
	t.Helper()
	d := &mapDesired{pods: map[string]*v1.Pod{pod.Namespace + "/" + pod.Name: pod}}
	st := &keptStatus{pods: map[string]*v1.Pod{}}
	var mu sync.Mutex
	tries := 0
	pool := New(Options{Workers: 2, BackoffBase: 5 * time.Millisecond, BackoffMax: 40 * time.Millisecond, Evictions: ledger,
		ReleaseStorage: func(_ context.Context, p *v1.Pod) error {
			mu.Lock()
			defer mu.Unlock()
			// The first try fails (the sandbox still stopping): Evict
			// must wait for the retry, not return with the storage held.
			if tries++; tries == 1 {
				return errors.New("still terminating")
			}
			*released = append(*released, string(p.UID))
			return nil
		}},
		rt, d, st, &outcomes{got: map[string][]pending.Outcome{}}, &recordedEvents{}, zerolog.Nop())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { pool.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return pool, st
}

// An evicted pod is published Failed (Evicted, the message), stopped with
// the eviction's grace period, its emptyDirs released, Evict returns once
// it is stopped, and it is never synced again, not after a restart either.
func TestEvictFailsAndStopsThePodForGood(t *testing.T) {
	rt := &graceRecorder{sandboxRuntime: &sandboxRuntime{scriptedRuntime: newScriptedRuntime(), created: time.Now()}}
	pod := testPod("filler")
	ledger := &mapLedger{m: map[string][]byte{}}
	var released []string
	pool, st := startEvictPool(t, rt, pod, ledger, &released)
	pool.Enqueue("ns/filler")
	waitUntil(t, "the pod is synced", func() bool { return rt.syncCount("ns/filler") >= 1 })

	const msg = `Usage of EmptyDir volume "scratch" exceeds the limit "1Mi". `
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := pool.Evict(ctx, pod, msg, 0); err != nil {
		t.Fatal(err)
	}
	p, ok := st.Get("ns", "filler")
	if !ok || p.Status.Phase != v1.PodFailed || p.Status.Reason != ReasonEvicted || p.Status.Message != msg {
		t.Fatalf("status %+v, want Failed/Evicted with the message", p.Status)
	}
	rt.mu.Lock()
	graces := append([]int64(nil), rt.graces...)
	rt.mu.Unlock()
	if len(graces) != 1 || graces[0] != 0 {
		t.Fatalf("stopped with graces %v, want one stop at 0 s", graces)
	}
	if len(released) != 1 || released[0] != string(pod.UID) {
		t.Fatalf("released %v, want the pod's storage once", released)
	}
	syncs := rt.syncCount("ns/filler")
	n := pool.Stats().Syncs
	pool.Enqueue("ns/filler")
	waitUntil(t, "the pod is looked at again", func() bool { return pool.Stats().Syncs > n })
	if got := rt.syncCount("ns/filler"); got != syncs {
		t.Fatalf("an evicted pod was synced again")
	}

	// A restarted mqlet (same ledger) keeps it failed and does not release twice.
	rt2 := &sandboxRuntime{scriptedRuntime: newScriptedRuntime(), created: time.Now()}
	var released2 []string
	pool2, st2 := startEvictPool(t, rt2, pod, ledger, &released2)
	pool2.Enqueue("ns/filler")
	waitUntil(t, "the pod is reported evicted after a restart", func() bool {
		p, ok := st2.Get("ns", "filler")
		return ok && p.Status.Reason == ReasonEvicted
	})
	if rt2.syncCount("ns/filler") != 0 {
		t.Fatal("the evicted pod was synced after a restart")
	}
	if len(released2) != 0 {
		t.Fatalf("released again after a restart: %v", released2)
	}

	// Applied again as a new pod (a new uid): runs.
	renewed := pod.DeepCopy()
	renewed.UID = "new-uid"
	if got, ok := pool2.evictions.get("ns/filler", string(renewed.UID)); ok {
		t.Fatalf("a new pod of the same name inherits the eviction %+v", got)
	}
}
