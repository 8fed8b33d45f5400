package agent

import (
	"context"
	"io"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"go.uber.org/goleak"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/mqlet/mqlet/agent/store"
	apiv1 "github.com/mqlet/mqlet/api/v1"
	"github.com/mqlet/mqlet/cri"
	"github.com/mqlet/mqlet/internal/liveperiod"
	"github.com/mqlet/mqlet/mqtt/broker"
	"github.com/mqlet/mqlet/mqtt/outbox"
	"github.com/mqlet/mqlet/mqtt/session"
)

// loopRuntime is a runtime whose pod runs at once; its PLEG reports the
// pod's container started every period until its context ends.
type loopRuntime struct {
	mu      sync.Mutex
	synced  int
	changes chan struct{}
	uid     string // of the pod PLEG reports on
}

func (r *loopRuntime) GetPodStatus(_ context.Context, uid, name, ns string) (*cri.PodStatus, error) {
	return &cri.PodStatus{UID: uid, Name: name, Namespace: ns}, nil
}

func (r *loopRuntime) SyncPod(context.Context, cri.SyncInput) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.synced++
	return nil
}

func (r *loopRuntime) syncs() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.synced
}

func (r *loopRuntime) KillPodByRef(context.Context, cri.PodRef, *int64) error    { return nil }
func (r *loopRuntime) StopPod(context.Context, *v1.Pod, cri.EventRecorder) error { return nil }
func (r *loopRuntime) ListPods(context.Context) ([]cri.PodRef, error)            { return nil, nil }
func (r *loopRuntime) RuntimeInfo() (string, string)                             { return "fake", "1" }
func (r *loopRuntime) Run(ctx context.Context)                                   { <-ctx.Done() }
func (r *loopRuntime) Ready() bool                                               { return true }
func (r *loopRuntime) Changes() <-chan struct{}                                  { return r.changes }
func (r *loopRuntime) GarbageCollect(context.Context, cri.GCPolicy, func(string) bool) error {
	return nil
}
func (r *loopRuntime) RotateLogs(context.Context, cri.LogRotation) error { return nil }
func (r *loopRuntime) CallStats() map[string]cri.CallStat                { return nil }

func (r *loopRuntime) RunPLEG(ctx context.Context, period liveperiod.Source, out chan<- cri.PodLifecycleEvent) {
	for period.Wait(ctx) {
		select {
		case out <- cri.PodLifecycleEvent{PodUID: r.uid, Type: cri.ContainerStarted}:
		case <-ctx.Done():
			return
		}
	}
}

// Once Run returns, no goroutine the agent started is left: its loops, the
// pod pool's per-pod goroutines, the PLEG reader, the reply group, the
// MQTT session and telemetry (the broker is the test's).
func TestRunLeavesNoGoroutine(t *testing.T) {
	dir := t.TempDir()
	log := zerolog.Nop()
	b, err := broker.Start(context.Background(), broker.Options{Listen: "127.0.0.1:0"}, log)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	st, err := store.Open(filepath.Join(dir, "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	box, err := outbox.Open(filepath.Join(dir, "outbox.db"), 1<<20, log)
	if err != nil {
		t.Fatal(err)
	}
	defer box.Close()
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default", Generation: 1},
		Spec: v1.PodSpec{RestartPolicy: v1.RestartPolicyAlways, Containers: []v1.Container{{Name: "c", Image: "i"}}}}
	if _, err := st.Apply([]runtime.Object{pod}); err != nil {
		t.Fatal(err)
	}
	stored, err := st.Pod("default", "web")
	if err != nil {
		t.Fatal(err)
	}
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())

	rt := &loopRuntime{changes: make(chan struct{}), uid: string(stored.UID)}
	opts := Options{Topics: apiv1.Scheme{Prefix: "mqlet", Node: "gw-1"}, MaxPayloadBytes: 1 << 20, Workers: 2, PLEGPeriod: 5 * time.Millisecond,
		GCInterval: time.Hour, PodStatusResync: time.Hour, PodResync: 10 * time.Millisecond, ApplyDeadline: time.Minute,
		LogRotationPeriod: time.Hour, Version: "test",
		Session: session.Options{BrokerURL: "tcp://" + b.Addr(), ClientID: session.ClientID("gw-1"), KeepAlive: 30 * time.Second}}
	opts.Telemetry.NodeStatusInterval = time.Hour
	a, err := New(context.Background(), opts, Deps{Store: st, Outbox: box, Runtime: rt}, log)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	deadline := time.Now().Add(10 * time.Second)
	for rt.syncs() < 3 { // the start, then PLEG and resync
		if time.Now().After(deadline) {
			cancel()
			t.Fatalf("the pod was synced %d times", rt.syncs())
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
}

func (r *loopRuntime) ExecSync(context.Context, string, []string, time.Duration) ([]byte, []byte, int, error) {
	return nil, nil, 0, nil
}

func (r *loopRuntime) ContainerLogs(context.Context, cri.LogRequest, io.Writer) error { return nil }

func (r *loopRuntime) ExecInteractive(context.Context, cri.PodKey, string, []string, cri.TermSize, cri.ShellIO) (int, error) {
	return 0, cri.ErrNoContainer
}

func (r *loopRuntime) ExecInPod(context.Context, cri.PodKey, string, []string, time.Duration) (*cri.ExecResult, error) {
	return &cri.ExecResult{}, nil
}
