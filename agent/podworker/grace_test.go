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

type fakeRuntime struct {
	mu     sync.Mutex
	synced chan struct{}
	killed chan *int64
	refs   []cri.PodRef
}

func (f *fakeRuntime) GetPodStatus(_ context.Context, uid, name, namespace string) (*cri.PodStatus, error) {
	return &cri.PodStatus{UID: uid, Name: name, Namespace: namespace}, nil
}

func (f *fakeRuntime) SyncPod(_ context.Context, in cri.SyncInput) error {
	pod := in.Pod
	f.mu.Lock()
	f.refs = []cri.PodRef{{UID: string(pod.UID), Name: pod.Name, Namespace: pod.Namespace}}
	f.mu.Unlock()
	f.synced <- struct{}{}
	return nil
}

func (f *fakeRuntime) KillPodByRef(_ context.Context, _ cri.PodRef, grace *int64) error {
	f.mu.Lock()
	f.refs = nil
	f.mu.Unlock()
	f.killed <- grace
	return nil
}

func (f *fakeRuntime) StopPod(context.Context, *v1.Pod, cri.EventRecorder) error { return nil }

func (f *fakeRuntime) ListPods(context.Context) ([]cri.PodRef, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]cri.PodRef(nil), f.refs...), nil
}

func (f *fakeRuntime) RuntimeInfo() (string, string) { return "fake", "1" }

type fakeDesired struct {
	mu  sync.Mutex
	pod *v1.Pod
}

func (d *fakeDesired) DesiredPod(string, string) (*v1.Pod, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.pod, nil
}
func (d *fakeDesired) ConfigMap(string, string) (*v1.ConfigMap, error) { return nil, nil }
func (d *fakeDesired) Secret(string, string) (*v1.Secret, error)       { return nil, nil }

type nopStatus struct{}

func (nopStatus) Set(*v1.Pod, v1.PodStatus) error       { return nil }
func (nopStatus) Get(string, string) (*v1.Pod, bool)    { return nil, false }
func (nopStatus) Remove(string, string) error           { return nil }
func (nopStatus) Retained(string, string) bool          { return false }
func (nopStatus) Observe(string, pending.Outcome)       {}
func (nopStatus) Event(*v1.Pod, string, string, string) {}

// A pod deleted from the desired state is gone from the store when its
// worker kills it; its own terminationGracePeriodSeconds must still apply,
// not the runtime's 30 s default.
func TestDeletedPodKeepsItsOwnGracePeriod(t *testing.T) {
	for _, tc := range []struct {
		name     string
		override *int64
		want     int64
	}{
		{name: "pod's own", want: 2},
		{name: "delete command's override", override: ptr(int64(0)), want: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rt := &fakeRuntime{synced: make(chan struct{}, 4), killed: make(chan *int64, 4)}
			pod := &v1.Pod{}
			pod.Name, pod.Namespace, pod.UID = "web", "default", "uid-1"
			pod.Spec.TerminationGracePeriodSeconds = ptr(int64(2))
			desired := &fakeDesired{pod: pod}
			pool := New(Options{Workers: 1, BackoffBase: time.Millisecond, BackoffMax: time.Millisecond},
				rt, desired, nopStatus{}, nopStatus{}, nopStatus{}, zerolog.Nop())
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { pool.Run(ctx); close(done) }()
			defer func() { cancel(); <-done }()

			pool.Enqueue("default/web")
			select {
			case <-rt.synced:
			case <-time.After(5 * time.Second):
				t.Fatal("pod was not synced")
			}
			desired.mu.Lock()
			desired.pod = nil
			desired.mu.Unlock()
			pool.EnqueueDelete("default/web", tc.override)
			select {
			case grace := <-rt.killed:
				if grace == nil || *grace != tc.want {
					t.Fatalf("killed with grace %v, want %d", grace, tc.want)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("pod was not killed")
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }
