package metrics

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"runtime"
	"syscall"
	"testing"
	"time"

	cadvisorapi "github.com/google/cadvisor/lib/model"
	"github.com/rs/zerolog"
	"go.uber.org/goleak"
	statsv1alpha1 "k8s.io/kubelet/pkg/apis/stats/v1alpha1"
)

func newTestCollector(t testing.TB, interval time.Duration) *Collector {
	t.Helper()
	c, err := New(context.Background(), Options{
		NodeName:             "test-node",
		HousekeepingInterval: interval,
		StateDir:             t.TempDir(),
	}, zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.InfoLevel))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// decodeStrict round-trips the summary through JSON and decodes it refusing
// unknown fields, as a consumer of the metrics topic would.
func decodeStrict(t testing.TB, s *statsv1alpha1.Summary) *statsv1alpha1.Summary {
	t.Helper()
	raw, err := json.Marshal(s)
	if err != nil {
		t.Fatalf("marshal: %v", err)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	var out statsv1alpha1.Summary
	if err := dec.Decode(&out); err != nil {
		t.Fatalf("strict decode of %s: %v", raw, err)
	}
	return &out
}

func val(p *uint64) uint64 {
	if p == nil {
		return 0
	}
	return *p
}

func TestSummaryMeasuresARealCgroup(t *testing.T) {
	c := newTestCollector(t, 50*time.Millisecond)
	tc := newBusyCgroup(t, c)
	pods := []PodInfo{{
		UID: tc.podUID, Name: "busy", Namespace: "default",
		Containers: map[string]string{tc.containerID: "spin"},
	}}

	var got *statsv1alpha1.Summary
	waitFor(t, 15*time.Second, 200*time.Millisecond, func() (bool, string) {
		s, err := c.Summary(context.Background(), pods, nil)
		if err != nil {
			return false, err.Error()
		}
		got = decodeStrict(t, s)
		if len(got.Pods) != 1 || len(got.Pods[0].Containers) != 1 {
			return false, fmt.Sprintf("want 1 pod with 1 container, got %+v", got.Pods)
		}
		ctr := got.Pods[0].Containers[0]
		if ctr.CPU == nil || val(ctr.CPU.UsageNanoCores) < 100_000_000 {
			return false, fmt.Sprintf("container cpu rate still below 0.1 core: %+v", ctr.CPU)
		}
		if ctr.Memory == nil || val(ctr.Memory.WorkingSetBytes) < busyAllocBytes/2 {
			return false, fmt.Sprintf("container working set still below %d: %s", busyAllocBytes/2, memoryString(ctr.Memory))
		}
		return true, ""
	})

	pod := got.Pods[0]
	if pod.PodRef != (statsv1alpha1.PodReference{Name: "busy", Namespace: "default", UID: tc.podUID}) {
		t.Errorf("podRef = %+v", pod.PodRef)
	}
	ctr := pod.Containers[0]
	if ctr.Name != "spin" {
		t.Errorf("container name = %q, want spin", ctr.Name)
	}
	if val(ctr.CPU.UsageCoreNanoSeconds) == 0 || val(ctr.Memory.UsageBytes) < val(ctr.Memory.WorkingSetBytes) || ctr.Memory.RSSBytes == nil {
		t.Errorf("container figures inconsistent: cpu %+v memory %+v", ctr.CPU, ctr.Memory)
	}
	if ctr.StartTime.IsZero() || pod.StartTime.IsZero() {
		t.Errorf("start times missing: pod %v container %v", pod.StartTime, ctr.StartTime)
	}
	// The pod cgroup contains the container cgroup.
	if pod.CPU == nil || val(pod.CPU.UsageCoreNanoSeconds) < val(ctr.CPU.UsageCoreNanoSeconds) {
		t.Errorf("pod cpu %+v below container cpu %+v", pod.CPU, ctr.CPU)
	}
	if pod.Memory == nil || val(pod.Memory.WorkingSetBytes) < val(ctr.Memory.WorkingSetBytes) {
		t.Errorf("pod memory %+v below container memory %+v", pod.Memory, ctr.Memory)
	}

	node := got.Node
	mi, err := c.MachineInfo()
	if err != nil {
		t.Fatalf("MachineInfo: %v", err)
	}
	if node.NodeName != "test-node" || node.StartTime.IsZero() {
		t.Errorf("node name/start = %q/%v", node.NodeName, node.StartTime)
	}
	if node.CPU == nil || val(node.CPU.UsageNanoCores) < val(ctr.CPU.UsageNanoCores)/2 || val(node.CPU.UsageCoreNanoSeconds) < val(ctr.CPU.UsageCoreNanoSeconds) {
		t.Errorf("node cpu %+v does not cover the busy container %+v", node.CPU, ctr.CPU)
	}
	if node.Memory == nil || val(node.Memory.WorkingSetBytes) < busyAllocBytes || val(node.Memory.AvailableBytes) == 0 ||
		val(node.Memory.AvailableBytes)+val(node.Memory.WorkingSetBytes) != mi.MemoryCapacity {
		t.Errorf("node memory %+v inconsistent with capacity %d", node.Memory, mi.MemoryCapacity)
	}
	if node.Network == nil || len(node.Network.Interfaces) == 0 || node.Network.Name == "" {
		t.Errorf("node network missing: %+v", node.Network)
	}
	if node.Fs == nil || val(node.Fs.CapacityBytes) == 0 || val(node.Fs.AvailableBytes) == 0 || val(node.Fs.UsedBytes) == 0 {
		t.Errorf("state dir filesystem missing: %+v", node.Fs)
	}
}

func TestSummaryPublishesMqletCountersAsSystemContainer(t *testing.T) {
	c := newTestCollector(t, time.Hour)
	s, err := c.Summary(context.Background(), nil, map[string]uint64{
		"messages_in": 12, "outbox_depth": 3, "reconnects": 1,
	})
	if err != nil {
		t.Fatalf("Summary: %v", err)
	}
	got := decodeStrict(t, s)
	if len(got.Node.SystemContainers) != 1 || got.Node.SystemContainers[0].Name != SystemContainerMqlet {
		t.Fatalf("systemContainers = %+v", got.Node.SystemContainers)
	}
	sys := got.Node.SystemContainers[0]
	want := []struct {
		name  string
		kind  statsv1alpha1.UserDefinedMetricType
		value float64
	}{
		{"messages_in", statsv1alpha1.MetricCumulative, 12},
		{"outbox_depth", statsv1alpha1.MetricGauge, 3},
		{"reconnects", statsv1alpha1.MetricCumulative, 1},
	}
	if len(sys.UserDefinedMetrics) != len(want) {
		t.Fatalf("userDefinedMetrics = %+v", sys.UserDefinedMetrics)
	}
	for i, w := range want {
		m := sys.UserDefinedMetrics[i]
		if m.Name != w.name || m.Type != w.kind || m.Value != w.value || m.Time.IsZero() {
			t.Errorf("metric %d = %+v, want %s %s %v", i, m, w.name, w.kind, w.value)
		}
	}
	if sys.CPU == nil || val(sys.CPU.UsageCoreNanoSeconds) == 0 || sys.Memory == nil || val(sys.Memory.RSSBytes) == 0 {
		t.Errorf("mqlet's own usage missing: cpu %+v memory %+v", sys.CPU, sys.Memory)
	}
	if sys.Rootfs == nil || val(sys.Rootfs.CapacityBytes) == 0 {
		t.Errorf("root filesystem missing: %+v", sys.Rootfs)
	}
	if got.Pods == nil || len(got.Pods) != 0 {
		t.Errorf("pods = %#v, want an empty list", got.Pods)
	}
}

func TestSummaryPublishesLabelledCountersUnderOneName(t *testing.T) {
	c := newTestCollector(t, time.Hour)
	key := LabelledName("cri_calls", map[string]string{"method": "RunPodSandbox", "a": "b"})
	if key != "cri_calls{a=b,method=RunPodSandbox}" {
		t.Fatalf("LabelledName = %q", key)
	}
	s, err := c.Summary(context.Background(), nil, map[string]uint64{
		key: 4, LabelledName("cri_calls", map[string]string{"method": "StopContainer"}): 2, "plain": 1,
	})
	if err != nil {
		t.Fatalf("Summary: %v", err)
	}
	got := decodeStrict(t, s).Node.SystemContainers[0].UserDefinedMetrics
	if len(got) != 3 {
		t.Fatalf("userDefinedMetrics = %+v", got)
	}
	for i, w := range []struct {
		name   string
		labels map[string]string
		value  float64
	}{
		{"cri_calls", map[string]string{"a": "b", "method": "RunPodSandbox"}, 4},
		{"cri_calls", map[string]string{"method": "StopContainer"}, 2},
		{"plain", nil, 1},
	} {
		m := got[i]
		if m.Name != w.name || m.Value != w.value || len(m.Labels) != len(w.labels) {
			t.Fatalf("metric %d = %+v, want %s %v %v", i, m, w.name, w.labels, w.value)
		}
		for k, v := range w.labels {
			if m.Labels[k] != v {
				t.Fatalf("metric %d labels %v, want %v", i, m.Labels, w.labels)
			}
		}
	}
}

func TestSummaryReportsPodWithoutCgroupWithoutUsage(t *testing.T) {
	c := newTestCollector(t, time.Hour)
	s, err := c.Summary(context.Background(), []PodInfo{{
		UID: "does-not-exist-" + randomHex(t, 4), Name: "ghost", Namespace: "ns",
		Containers: map[string]string{"abc": "app"},
	}}, nil)
	if err != nil {
		t.Fatalf("Summary: %v", err)
	}
	got := decodeStrict(t, s)
	if len(got.Pods) != 1 || got.Pods[0].PodRef.Name != "ghost" || got.Pods[0].CPU != nil || len(got.Pods[0].Containers) != 0 {
		t.Errorf("pods = %+v, want the ghost pod without usage", got.Pods)
	}
	if len(c.cgroups) != 1 {
		t.Errorf("collector keeps %d cgroups, want only the root", len(c.cgroups))
	}
}

func TestSummaryReusesFreshSamplesAndForgetsUnaskedCgroups(t *testing.T) {
	c := newTestCollector(t, time.Hour)
	tc := newBusyCgroup(t, c)
	pods := []PodInfo{{UID: tc.podUID, Name: "p", Namespace: "n", Containers: map[string]string{tc.containerID: "c"}}}
	first, err := c.Summary(context.Background(), pods, nil)
	if err != nil {
		t.Fatalf("Summary: %v", err)
	}
	second, err := c.Summary(context.Background(), pods, nil)
	if err != nil {
		t.Fatalf("Summary: %v", err)
	}
	// Within the housekeeping interval the same sample is served again.
	if !first.Pods[0].Containers[0].CPU.Time.Equal(&second.Pods[0].Containers[0].CPU.Time) ||
		val(first.Pods[0].Containers[0].CPU.UsageCoreNanoSeconds) != val(second.Pods[0].Containers[0].CPU.UsageCoreNanoSeconds) {
		t.Errorf("sample re-read within the housekeeping interval")
	}
	if first.Pods[0].Containers[0].CPU.UsageNanoCores != nil {
		t.Errorf("a rate from a single sample: %v", *first.Pods[0].Containers[0].CPU.UsageNanoCores)
	}
	if len(c.cgroups) != 3 {
		t.Errorf("tracking %d cgroups, want root, pod, container", len(c.cgroups))
	}
	if _, err := c.Summary(context.Background(), nil, nil); err != nil {
		t.Fatalf("Summary: %v", err)
	}
	if len(c.cgroups) != 1 {
		t.Errorf("tracking %d cgroups after the pod went away, want only the root", len(c.cgroups))
	}
}

func TestCollectorAfterClose(t *testing.T) {
	c := newTestCollector(t, time.Second)
	// goleak, not a goroutine count: it waits for goroutines that are
	// already ending, and names the one left behind.
	before := goleak.IgnoreCurrent()
	if _, err := c.Summary(context.Background(), nil, nil); err != nil {
		t.Fatalf("Summary: %v", err)
	}
	if err := goleak.Find(before); err != nil {
		t.Errorf("Summary left a goroutine behind: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if _, err := c.Summary(context.Background(), nil, nil); !errors.Is(err, ErrClosed) {
		t.Errorf("Summary after Close: %v, want ErrClosed", err)
	}
	if _, err := c.MachineInfo(); !errors.Is(err, ErrClosed) {
		t.Errorf("MachineInfo after Close: %v, want ErrClosed", err)
	}
}

func TestMachineInfo(t *testing.T) {
	c := newTestCollector(t, time.Second)
	mi, err := c.MachineInfo()
	if err != nil {
		t.Fatalf("MachineInfo: %v", err)
	}
	if mi.NumCores != runtime.NumCPU() {
		t.Errorf("NumCores = %d, want %d", mi.NumCores, runtime.NumCPU())
	}
	var si syscall.Sysinfo_t
	if err := syscall.Sysinfo(&si); err != nil {
		t.Fatalf("sysinfo: %v", err)
	}
	total := uint64(si.Totalram) * uint64(si.Unit)
	if mi.MemoryCapacity == 0 || mi.MemoryCapacity > total+total/10 || mi.MemoryCapacity < total-total/10 {
		t.Errorf("MemoryCapacity = %d, sysinfo says %d", mi.MemoryCapacity, total)
	}
	bootID, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		t.Fatalf("boot id: %v", err)
	}
	if mi.BootID != string(bytes.TrimSpace(bootID)) {
		t.Errorf("BootID = %q, want %q", mi.BootID, bytes.TrimSpace(bootID))
	}
	if len(mi.Filesystems) == 0 {
		t.Errorf("no filesystems")
	}
	// The caller gets a copy it may change.
	mi.NumCores = -1
	again, _ := c.MachineInfo()
	if again.NumCores == -1 {
		t.Errorf("MachineInfo returned shared state")
	}
}

func TestMemoryStatsAvailable(t *testing.T) {
	cases := []struct {
		name          string
		limit         uint64
		capacity      uint64
		workingSet    uint64
		wantAvailable *uint64
	}{
		{"limited", 100, 0, 30, ptr(70)},
		{"unlimited v1", 9223372036854771712, 0, 30, nil},
		{"root uses capacity", 0, 1000, 400, ptr(600)},
		{"over the limit", 100, 0, 150, ptr(0)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := sample{
				spec:  cadvisorapi.ContainerSpec{HasMemory: tc.limit != 0, Memory: cadvisorapi.MemorySpec{Limit: tc.limit}},
				stats: &cadvisorapi.ContainerStats{Memory: &cadvisorapi.MemoryStats{Usage: tc.workingSet + 5, WorkingSet: tc.workingSet}},
			}
			got := memoryStats(s, tc.capacity)
			if (got.AvailableBytes == nil) != (tc.wantAvailable == nil) || (got.AvailableBytes != nil && *got.AvailableBytes != *tc.wantAvailable) {
				t.Errorf("available = %v, want %v", got.AvailableBytes, tc.wantAvailable)
			}
			if val(got.WorkingSetBytes) != tc.workingSet || val(got.UsageBytes) != tc.workingSet+5 {
				t.Errorf("memory = %+v", got)
			}
		})
	}
}

func memoryString(m *statsv1alpha1.MemoryStats) string {
	if m == nil {
		return "none"
	}
	return fmt.Sprintf("usage %d workingSet %d rss %d available %d", val(m.UsageBytes), val(m.WorkingSetBytes), val(m.RSSBytes), val(m.AvailableBytes))
}

func ptr(v uint64) *uint64 { return &v }

// BenchmarkSummary measures the CPU time of one full collection (node, one
// pod with one container, counters), every cgroup read afresh.
func BenchmarkSummary(b *testing.B) {
	c := newTestCollector(b, time.Nanosecond)
	tc := newBusyCgroup(b, c)
	pods := []PodInfo{{UID: tc.podUID, Name: "p", Namespace: "n", Containers: map[string]string{tc.containerID: "c"}}}
	extra := map[string]uint64{"messages_in": 1, "outbox_depth": 2}
	cpuTime := func() time.Duration {
		var ru syscall.Rusage
		if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
			b.Fatalf("getrusage: %v", err)
		}
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	b.ReportAllocs()
	b.ResetTimer()
	start := cpuTime()
	for b.Loop() {
		if _, err := c.Summary(context.Background(), pods, extra); err != nil {
			b.Fatalf("Summary: %v", err)
		}
	}
	b.ReportMetric(float64(cpuTime()-start)/float64(b.N), "cpu-ns/op")
}
