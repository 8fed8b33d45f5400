package telemetry

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	cadvisorapi "github.com/google/cadvisor/lib/model"
	"github.com/rs/zerolog"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	statsv1alpha1 "k8s.io/kubelet/pkg/apis/stats/v1alpha1"

	"github.com/mqlet/mqlet/cri"
	"github.com/mqlet/mqlet/metrics"
	"github.com/mqlet/mqlet/mqtt/outbox"
	"github.com/mqlet/mqlet/mqtt/session"
)

// fakeCollector records what Summary was asked.
type fakeCollector struct {
	mu     sync.Mutex
	calls  int
	pods   []metrics.PodInfo
	extra  map[string]uint64
	closed bool
}

func (c *fakeCollector) Summary(_ context.Context, pods []metrics.PodInfo, extra map[string]uint64) (*statsv1alpha1.Summary, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls++
	c.pods, c.extra = pods, extra
	cpu := uint64(42)
	s := &statsv1alpha1.Summary{Node: statsv1alpha1.NodeStats{NodeName: "gw1", CPU: &statsv1alpha1.CPUStats{Time: metav1.Now(), UsageCoreNanoSeconds: &cpu}}}
	for _, p := range pods {
		s.Pods = append(s.Pods, statsv1alpha1.PodStats{PodRef: statsv1alpha1.PodReference{Name: p.Name, Namespace: p.Namespace, UID: p.UID}})
	}
	return s, nil
}

func (c *fakeCollector) MachineInfo() (*cadvisorapi.MachineInfo, error) {
	return fakeMachine{}.MachineInfo()
}

func (c *fakeCollector) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	return nil
}

func (c *fakeCollector) snapshot() (int, []metrics.PodInfo, map[string]uint64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.calls, c.pods, c.extra, c.closed
}

func runtimeWithPods() *fakeRuntime {
	rt := newFakeRuntime(true)
	// u1's exited attempt c-old of app is not in the listing's running set.
	rt.pods = []cri.PodRef{
		{UID: "u1", Name: "web", Namespace: "default", Running: map[string]string{"c-new": "app", "c-side": "sidecar"}},
		{UID: "u2", Name: "gone", Namespace: "default"},
	}
	return rt
}

func TestMetricsTickPublishesSummaryWithPodsAndCounters(t *testing.T) {
	rt := runtimeWithPods()
	out := newFakePublisher()
	col := &fakeCollector{}
	counters := func() map[string]uint64 { return map[string]uint64{"pod_syncs": 7} }
	rep := NewMetricsReporter(MetricsOptions{Topics: testTopics, Interval: time.Hour}, col, rt, counters, out, zerolog.New(zerolog.NewTestWriter(t)))

	st, err := rep.Tick(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	m := out.next(t, "mqlet/v1/gw1/metrics", time.Second)
	if m.QoS != 0 || m.Retained || !m.Coalesce {
		t.Fatalf("metrics message qos=%d retained=%v coalesce=%v, want QoS 0, not retained, coalesced", m.QoS, m.Retained, m.Coalesce)
	}
	if st.PayloadBytes != len(m.Payload) || st.Pods != 2 {
		t.Fatalf("tick stats %+v for a %d-byte payload", st, len(m.Payload))
	}
	var summary statsv1alpha1.Summary
	decodeStrict(t, m.Payload, &summary)
	if len(summary.Pods) != 2 || *summary.Node.CPU.UsageCoreNanoSeconds != 42 {
		t.Fatalf("published summary %+v", summary)
	}
	_, pods, extra, _ := col.snapshot()
	if extra["pod_syncs"] != 7 {
		t.Fatalf("counters not passed to Summary: %v", extra)
	}
	web := pods[0]
	if web.UID != "u1" || len(web.Containers) != 2 || web.Containers["c-new"] != "app" || web.Containers["c-side"] != "sidecar" {
		t.Fatalf("pod info %+v: want the two running containers only", web)
	}
	if gone := pods[1]; gone.UID != "u2" || len(gone.Containers) != 0 {
		t.Fatalf("a pod without status should be listed without containers: %+v", gone)
	}
}

func TestMetricsWithRuntimeDownReportsTheNodeAlone(t *testing.T) {
	rt := runtimeWithPods()
	rt.ready = false
	col := &fakeCollector{}
	rep := NewMetricsReporter(MetricsOptions{Topics: testTopics, Interval: time.Hour}, col, rt, nil, newFakePublisher(), zerolog.Nop())
	if _, err := rep.Tick(context.Background()); err != nil {
		t.Fatal(err)
	}
	if calls, pods, _, _ := col.snapshot(); calls != 1 || len(pods) != 0 {
		t.Fatalf("Summary calls %d with %d pods, want 1 call with none", calls, len(pods))
	}
	rt.ready, rt.listErr = true, errors.New("rpc error: code = Unavailable")
	if _, err := rep.Tick(context.Background()); err != nil {
		t.Fatalf("a failed pod listing must not stop the node's metrics: %v", err)
	}
}

func TestMetricsReporterRunPublishesEveryInterval(t *testing.T) {
	out := newFakePublisher()
	rep := NewMetricsReporter(MetricsOptions{Topics: testTopics, Interval: 10 * time.Millisecond}, &fakeCollector{}, runtimeWithPods(), nil, out, zerolog.Nop())
	runInBackground(t, rep.Run)
	for i := 0; i < 3; i++ {
		out.next(t, "mqlet/v1/gw1/metrics", 5*time.Second)
	}
}

func TestMetricsDisabledAtZero(t *testing.T) {
	col := &fakeCollector{}
	rep := NewMetricsReporter(MetricsOptions{Topics: testTopics, Interval: 0}, col, runtimeWithPods(), nil, newFakePublisher(), zerolog.Nop())
	done := make(chan error, 1)
	go func() { done <- rep.Run(context.Background()) }() // a context that never ends
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run with interval 0 did not return")
	}
	if calls, _, _, _ := col.snapshot(); calls != 0 {
		t.Fatalf("Summary called %d times with metrics off", calls)
	}

	// Telemetry does not even create the collector.
	tel, err := New(context.Background(), Config{Topics: testTopics, MetricsInterval: 0, NodeStatusInterval: time.Hour, StateDir: t.TempDir()},
		Deps{Runtime: newFakeRuntime(true), Out: newFakePublisher(), Retained: newFakePublisher(), NewCollector: func(context.Context, metrics.Options, zerolog.Logger) (Collector, error) {
			t.Error("collector created with metrics off")
			return col, nil
		}}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	if tel.MetricsEnabled() {
		t.Fatal("MetricsEnabled with interval 0")
	}
}

func TestTelemetryRunsBothAndClosesTheCollector(t *testing.T) {
	col := &fakeCollector{}
	out := newFakePublisher()
	var gotOpts metrics.Options
	tel, err := New(context.Background(), Config{Topics: testTopics, MetricsInterval: 10 * time.Millisecond, NodeStatusInterval: time.Hour, StateDir: "/var/lib/mqlet-test", CgroupRoot: "/mqlet-x", MemoryAvailable: "64Mi"},
		Deps{Runtime: runtimeWithPods(), Out: out, Retained: out, Host: fakeHost, MemoryAvailable: newMemoryGauge(plentyOfMemory).read,
			NewCollector: func(_ context.Context, opts metrics.Options, _ zerolog.Logger) (Collector, error) {
				gotOpts = opts
				return col, nil
			}},
		zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	if gotOpts.NodeName != "gw1" || gotOpts.CgroupRoot != "/mqlet-x" || gotOpts.StateDir != "/var/lib/mqlet-test" {
		t.Fatalf("collector options %+v", gotOpts)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- tel.Run(ctx) }()
	out.next(t, "mqlet/v1/gw1/node", 5*time.Second)
	out.next(t, "mqlet/v1/gw1/metrics", 5*time.Second)
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Telemetry.Run did not stop")
	}
	if _, _, _, closed := col.snapshot(); !closed {
		t.Fatal("collector not closed after Run")
	}
}

func TestNewRejectsABadMemoryThreshold(t *testing.T) {
	_, err := New(context.Background(), Config{Topics: testTopics, MemoryAvailable: "lots"}, Deps{Runtime: newFakeRuntime(true), Out: newFakePublisher(), Retained: newFakePublisher()}, zerolog.Nop())
	if err == nil {
		t.Fatal("memory threshold \"lots\" accepted")
	}
}

type fixedOutbox outbox.Stats

func (f fixedOutbox) Stats() outbox.Stats { return outbox.Stats(f) }

type fixedSession session.Stats

func (f fixedSession) Stats() session.Stats { return session.Stats(f) }

func TestCountersMergeAgentOutboxAndSession(t *testing.T) {
	got := Counters(func() map[string]uint64 { return map[string]uint64{"pod_syncs": 3} },
		fixedOutbox{Depth: 4, Bytes: 900, Dropped: 2, DroppedFinal: 1, Sent: 10},
		fixedSession{Connected: true, MessagesIn: 5, MessagesOut: 6, Reconnects: 1, ConnectFailures: 8, Failovers: 2})()
	want := map[string]uint64{
		"pod_syncs": 3, "outbox_depth": 4, "outbox_bytes": 900, "outbox_dropped": 2, "outbox_dropped_final_replies": 1, "outbox_sent": 10,
		"mqtt_messages_in": 5, "mqtt_messages_out": 6, "mqtt_reconnects": 1, "mqtt_connect_failures": 8, "mqtt_failovers": 2, "mqtt_connected": 1,
	}
	if len(got) != len(want) {
		t.Fatalf("counters %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Fatalf("counter %s = %d, want %d (all: %v)", k, got[k], v, got)
		}
	}
	if n := len(Counters(nil, nil, nil)()); n != 0 {
		t.Fatalf("no sources gave %d counters", n)
	}
}

func TestCollectorFailureTurnsMetricsOffNotTheNode(t *testing.T) {
	out := newFakePublisher()
	tel, err := New(context.Background(), Config{Topics: testTopics, MetricsInterval: time.Millisecond, NodeStatusInterval: time.Hour},
		Deps{Runtime: newFakeRuntime(true), Out: out, Retained: out, Host: fakeHost, MemoryAvailable: newMemoryGauge(plentyOfMemory).read,
			NewCollector: func(context.Context, metrics.Options, zerolog.Logger) (Collector, error) {
				return nil, errors.New("no cgroup mounts")
			}}, zerolog.Nop())
	if err != nil {
		t.Fatalf("a collector failure must not stop mqlet: %v", err)
	}
	if tel.MetricsEnabled() {
		t.Fatal("metrics on without a collector")
	}
	runInBackground(t, tel.Run)
	node := decodeNode(t, out.next(t, "mqlet/v1/gw1/node", 5*time.Second))
	if node.Status.Capacity.Cpu().Value() < 1 {
		t.Fatalf("node capacity without a collector: %v (MachineInfo should come from the host)", node.Status.Capacity)
	}
}

// runtimeWithDisk is a runtime that also reports container disk use.
type runtimeWithDisk struct {
	*fakeRuntime
	disk map[string]cri.ContainerFs
}

func (r runtimeWithDisk) ContainerFilesystems(context.Context) (map[string]cri.ContainerFs, error) {
	return r.disk, nil
}

func TestMetricsCarryContainerDiskUse(t *testing.T) {
	rt := runtimeWithDisk{fakeRuntime: runtimeWithPods(), disk: map[string]cri.ContainerFs{
		"c-new": {RootfsUsedBytes: 4096, RootfsMount: "/var/lib/containerd", LogsUsedBytes: 77, LogsDir: "/var/log/pods/x/app"},
		"c-old": {RootfsUsedBytes: 1},
	}}
	col := &fakeCollector{}
	rep := NewMetricsReporter(MetricsOptions{Topics: testTopics, Interval: time.Hour}, col, rt, func() map[string]uint64 { return nil }, newFakePublisher(), zerolog.New(zerolog.NewTestWriter(t)))
	if _, err := rep.Tick(context.Background()); err != nil {
		t.Fatal(err)
	}
	_, pods, _, _ := col.snapshot()
	got := pods[0].Filesystems
	want := metrics.ContainerFilesystem{RootfsUsedBytes: 4096, RootfsDir: "/var/lib/containerd", LogsUsedBytes: 77, LogsDir: "/var/log/pods/x/app"}
	if len(got) != 1 || got["c-new"] != want {
		t.Fatalf("filesystems %+v: want only the running container's, %+v", got, want)
	}
}

type fixedCallStats map[string]cri.CallStat

func (f fixedCallStats) CallStats() map[string]cri.CallStat { return f }

func TestCRICountersPerMethodAndMerge(t *testing.T) {
	src := fixedCallStats{"RunPodSandbox": {Calls: 3, Errors: 1}, "ListContainers": {Calls: 40}}
	got := Merge(func() map[string]uint64 { return map[string]uint64{"pod_syncs": 2} }, nil, CRICounters(src))()
	want := map[string]uint64{
		"pod_syncs":                              2,
		"cri_calls{method=RunPodSandbox}":        3,
		"cri_call_errors{method=RunPodSandbox}":  1,
		"cri_calls{method=ListContainers}":       40,
		"cri_call_errors{method=ListContainers}": 0,
	}
	if len(got) != len(want) {
		t.Fatalf("counters %v, want %v", got, want)
	}
	for k, v := range want {
		if n, ok := got[k]; !ok || n != v {
			t.Fatalf("counter %s = %d (present %v), want %d (all: %v)", k, n, ok, v, got)
		}
	}
}
