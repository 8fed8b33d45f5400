package podworker

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	v1 "k8s.io/api/core/v1"

	"github.com/mqlet/mqlet/agent/pending"
	"github.com/mqlet/mqlet/cri"
)

// blockingKills is a runtime whose kills of one uid wait until released,
// as a pod that ignores SIGTERM holds its termination for its grace period.
type blockingKills struct {
	*scriptedRuntime
	mu      sync.Mutex
	release chan struct{}
	killed  map[string]bool
}

func (b *blockingKills) KillPodByRef(ctx context.Context, ref cri.PodRef, grace *int64) error {
	if ref.Name == "stubborn" {
		select {
		case <-b.release:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	b.mu.Lock()
	b.killed[ref.Name] = true
	b.mu.Unlock()
	return b.scriptedRuntime.KillPodByRef(ctx, ref, grace)
}

// A pod that ignores SIGTERM holds its termination for its whole grace
// period. With the kill run on the worker, one such pod per worker stopped
// every other pod's sync (starts, restarts, deletes) for that long; the
// kill runs beside the workers and the pod is reported gone when it ends.
func TestStubbornTerminationDoesNotHoldTheWorkers(t *testing.T) {
	rt := &blockingKills{scriptedRuntime: newScriptedRuntime(), release: make(chan struct{}), killed: map[string]bool{}}
	rt.pods = []cri.PodRef{{UID: "uid-stubborn", Name: "stubborn", Namespace: "ns"}}
	d := &mapDesired{pods: map[string]*v1.Pod{"ns/next": testPod("next")}}
	st, out := &fakeStatus{set: map[string]v1.PodStatus{}}, &outcomes{got: map[string][]pending.Outcome{}}
	pool := New(Options{Workers: 1, BackoffBase: 5 * time.Millisecond, BackoffMax: 40 * time.Millisecond}, rt, d, st, out, noEvents{}, zerolog.Nop())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { pool.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })

	pool.EnqueueDelete("ns/stubborn", nil)
	pool.Enqueue("ns/next")
	waitUntil(t, "the next pod synced while the other terminates", func() bool { return rt.syncCount("ns/next") == 1 })
	if o, ok := out.last("ns/stubborn"); ok && o.Gone {
		t.Fatal("reported gone before its termination ended")
	}
	close(rt.release)
	waitUntil(t, "the stubborn pod reported gone", func() bool { o, ok := out.last("ns/stubborn"); return ok && o.Gone })
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if !rt.killed["stubborn"] {
		t.Fatal("never killed")
	}
}
