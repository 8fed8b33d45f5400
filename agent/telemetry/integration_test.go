package telemetry

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	cadvisorcontainer "github.com/google/cadvisor/lib/container"
	"github.com/google/cadvisor/lib/container/libcontainer"
	"github.com/rs/zerolog"
	"google.golang.org/grpc"
	v1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	statsv1alpha1 "k8s.io/kubelet/pkg/apis/stats/v1alpha1"

	"github.com/mqlet/mqlet/agent/nodestatus"
	"github.com/mqlet/mqlet/cri"
	"github.com/mqlet/mqlet/metrics"
	"github.com/mqlet/mqlet/mqtt/outbox"
)

func randomHex(t testing.TB, n int) string {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatalf("random: %v", err)
	}
	return hex.EncodeToString(b)
}

// testPods creates n pod cgroups with one container cgroup each under
// cgroupRoot in the cpu, cpuacct and memory v1 hierarchies, and puts a busy
// shell loop in the first container. Everything is removed at cleanup.
func testPods(t testing.TB, cgroupRoot string, n int) []cri.PodRef {
	t.Helper()
	mounts, err := libcontainer.GetCgroupSubsystems(cadvisorcontainer.MetricSet{cadvisorcontainer.CpuUsageMetrics: {}, cadvisorcontainer.MemoryUsageMetrics: {}})
	if err != nil {
		t.Fatalf("finding cgroup mounts: %v", err)
	}
	var hierarchies []string
	seen := map[string]bool{}
	for _, ctrl := range []string{"cpu", "cpuacct", "memory"} {
		m := mounts[ctrl]
		if m == "" {
			t.Fatalf("this test needs the %s cgroup v1 controller; found %v", ctrl, mounts)
		}
		if !seen[m] {
			seen[m] = true
			hierarchies = append(hierarchies, m)
		}
	}
	var dirs []string // removal order: deepest first
	t.Cleanup(func() {
		deadline := time.Now().Add(5 * time.Second)
		for i := len(dirs) - 1; i >= 0; i-- {
			for {
				err := os.Remove(dirs[i])
				if err == nil || errors.Is(err, os.ErrNotExist) {
					break
				}
				if !errors.Is(err, syscall.EBUSY) || time.Now().After(deadline) {
					t.Errorf("removing cgroup %s: %v", dirs[i], err)
					break
				}
				<-time.After(20 * time.Millisecond) // poll: the killed loop is still leaving the cgroup
			}
		}
	})
	for _, h := range hierarchies {
		dirs = append(dirs, filepath.Join(h, cgroupRoot))
	}
	var refs []cri.PodRef
	var busyDirs []string
	for i := 0; i < n; i++ {
		uid := fmt.Sprintf("%s-%d", randomHex(t, 4), i)
		cid := randomHex(t, 32)
		for _, h := range hierarchies {
			pod := filepath.Join(h, cgroupRoot, "pod"+uid)
			container := filepath.Join(pod, cid)
			if err := os.MkdirAll(container, 0o755); err != nil {
				t.Fatalf("creating cgroup %s (this test needs root): %v", container, err)
			}
			dirs = append(dirs, pod, container)
			if i == 0 {
				busyDirs = append(busyDirs, container)
			}
		}
		name := fmt.Sprintf("pod-%d", i)
		refs = append(refs, cri.PodRef{UID: uid, Name: name, Namespace: "default", Running: map[string]string{cid: "app"}})
	}
	busy := exec.Command("sh", "-c", "read go; while :; do :; done")
	busy.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stdin, err := busy.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := busy.Start(); err != nil {
		t.Fatalf("starting the busy loop: %v", err)
	}
	t.Cleanup(func() {
		_ = syscall.Kill(-busy.Process.Pid, syscall.SIGKILL)
		_ = busy.Wait()
	})
	for _, dir := range busyDirs {
		if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(busy.Process.Pid)), 0o644); err != nil {
			t.Fatalf("moving the busy loop into %s: %v", dir, err)
		}
	}
	if _, err := stdin.Write([]byte("go\n")); err != nil {
		t.Fatal(err)
	}
	// Wait until the loop has burnt some CPU inside its cgroup.
	waitUntil(t, 5*time.Second, func() bool {
		for _, dir := range busyDirs {
			raw, err := os.ReadFile(filepath.Join(dir, "cpuacct.usage"))
			if err == nil {
				v, _ := strconv.ParseUint(string(raw[:len(raw)-1]), 10, 64)
				return v > 10_000_000
			}
		}
		return false
	})
	return refs
}

func waitUntil(t testing.TB, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %s", timeout)
		}
		<-tick.C
	}
}

// TestIntegrationRealCollector runs Telemetry with the real cAdvisor
// collector, the real host readers and real pod cgroups.
func TestIntegrationRealCollector(t *testing.T) {
	const pods = 3
	cgroupRoot := "/mqlet-telemetry-test-" + randomHex(t, 4)
	rt := newFakeRuntime(true)
	rt.pods = testPods(t, cgroupRoot, pods)
	out := newFakePublisher()
	agentCounters := func() map[string]uint64 { return map[string]uint64{"pod_syncs": 12, "pod_queue_depth": 1} }
	tel, err := New(context.Background(), Config{
		Topics: testTopics, Version: "v0.0.0-test", StateDir: t.TempDir(), CgroupRoot: cgroupRoot,
		MetricsInterval: 50 * time.Millisecond, NodeStatusInterval: time.Hour,
		MemoryAvailable: "100Mi", DiskAvailablePct: 10, PIDAvailablePct: 5,
	}, Deps{Runtime: rt, Out: out, Retained: out, Counters: Counters(agentCounters, fixedOutbox{Depth: 3, Bytes: 2048, Dropped: 1}, fixedSession{Connected: true, MessagesIn: 9})},
		zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.InfoLevel))
	if err != nil {
		t.Fatal(err)
	}
	if !tel.MetricsEnabled() {
		t.Fatal("metrics off with a 50ms interval")
	}
	runInBackground(t, tel.Run)

	nodeMsg := out.next(t, "mqlet/v1/gw1/node", 10*time.Second)
	node := decodeNode(t, nodeMsg)
	if node.Status.Capacity.Cpu().Value() < 1 || node.Status.Capacity.Memory().Value() <= 0 {
		t.Fatalf("node capacity %v", node.Status.Capacity)
	}
	if node.Status.NodeInfo.BootID == "" || node.Status.NodeInfo.KernelVersion == "" {
		t.Fatalf("node info %+v", node.Status.NodeInfo)
	}
	for _, ct := range []v1.NodeConditionType{v1.NodeReady, v1.NodeMemoryPressure, v1.NodeDiskPressure, v1.NodePIDPressure} {
		if c := condition(t, node, ct); c.Status == v1.ConditionUnknown {
			t.Fatalf("condition %s is Unknown on a real host: %s", ct, c.Message)
		}
	}

	metricsMsg := out.next(t, "mqlet/v1/gw1/metrics", 10*time.Second)
	var summary statsv1alpha1.Summary
	decodeStrict(t, metricsMsg.Payload, &summary)
	n := summary.Node
	if n.CPU == nil || n.CPU.UsageCoreNanoSeconds == nil || *n.CPU.UsageCoreNanoSeconds == 0 {
		t.Fatalf("node cpu %+v", n.CPU)
	}
	if n.Memory == nil || n.Memory.WorkingSetBytes == nil || *n.Memory.WorkingSetBytes == 0 || n.Memory.AvailableBytes == nil {
		t.Fatalf("node memory %+v", n.Memory)
	}
	if len(summary.Pods) != pods {
		t.Fatalf("%d pods in the summary, want %d", len(summary.Pods), pods)
	}
	var busyCPU uint64
	for _, p := range summary.Pods {
		if len(p.Containers) != 1 || p.Containers[0].Name != "app" || p.Containers[0].CPU == nil {
			t.Fatalf("pod %s containers %+v", p.PodRef.Name, p.Containers)
		}
		if p.PodRef.Name == "pod-0" {
			busyCPU = *p.Containers[0].CPU.UsageCoreNanoSeconds
		}
	}
	if busyCPU == 0 {
		t.Fatal("the busy container shows no CPU time")
	}
	counters := map[string]float64{}
	for _, sc := range n.SystemContainers {
		if sc.Name == metrics.SystemContainerMqlet {
			for _, m := range sc.UserDefinedMetrics {
				counters[m.Name] = m.Value
				if m.Name == "outbox_depth" && m.Type != statsv1alpha1.MetricGauge {
					t.Fatalf("outbox_depth is %s, want a gauge", m.Type)
				}
			}
		}
	}
	if counters["pod_syncs"] != 12 || counters["outbox_depth"] != 3 || counters["outbox_dropped"] != 1 || counters["mqtt_messages_in"] != 9 {
		t.Fatalf("mqlet counters in the summary: %v", counters)
	}
	t.Logf("payloads with %d pods: node %d bytes, metrics %d bytes", pods, len(nodeMsg.Payload), len(metricsMsg.Payload))
}

// fakeCRI answers the CRI handshake (Version, ImageFsInfo) on a unix
// socket, so the real cri.Manager can connect and lose it.
type fakeCRI struct {
	runtimeapi.UnimplementedRuntimeServiceServer
	runtimeapi.UnimplementedImageServiceServer
}

func (fakeCRI) Version(context.Context, *runtimeapi.VersionRequest) (*runtimeapi.VersionResponse, error) {
	return &runtimeapi.VersionResponse{Version: "0.1.0", RuntimeName: "fakecri", RuntimeVersion: "9.9.9", RuntimeApiVersion: "v1"}, nil
}

func (fakeCRI) ImageFsInfo(context.Context, *runtimeapi.ImageFsInfoRequest) (*runtimeapi.ImageFsInfoResponse, error) {
	return &runtimeapi.ImageFsInfoResponse{}, nil
}

func serveFakeCRI(t *testing.T, socket string) *grpc.Server {
	t.Helper()
	_ = os.Remove(socket)
	lis, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatalf("listening on %s: %v", socket, err)
	}
	srv := grpc.NewServer()
	runtimeapi.RegisterRuntimeServiceServer(srv, fakeCRI{})
	runtimeapi.RegisterImageServiceServer(srv, fakeCRI{})
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return srv
}

// TestIntegrationRuntimeDownAndBack drives the real cri.Manager against
// a CRI endpoint that goes away and comes back: the published node turns
// Ready=False with ContainerRuntimeUnreachable, then Ready=True, without
// waiting for a heartbeat.
func TestIntegrationRuntimeDownAndBack(t *testing.T) {
	socket := filepath.Join(t.TempDir(), "cri.sock")
	endpoint := "unix://" + socket
	srv := serveFakeCRI(t, socket)
	rt := cri.NewManager(cri.Config{
		Endpoint: endpoint, ConnectTimeout: time.Second, RequestTimeout: time.Second,
		RuntimeRetryMin: 50 * time.Millisecond, RuntimeRetryMax: 200 * time.Millisecond, HealthInterval: 100 * time.Millisecond,
	}, zerolog.New(zerolog.NewTestWriter(t)))
	runInBackground(t, func(ctx context.Context) error { rt.Run(ctx); return nil })

	builder, err := nodestatus.NewBuilder(nodestatus.Options{NodeName: "gw1"})
	if err != nil {
		t.Fatal(err)
	}
	out, events := newFakePublisher(), &fakeEvents{}
	rep := NewNodeReporter(NodeOptions{Topics: testTopics, Interval: time.Hour, CheckInterval: time.Hour, RuntimeEndpoint: endpoint},
		builder, NodeSources{Machine: fakeMachine{}, Runtime: rt, Host: fakeHost, MemoryAvailable: newMemoryGauge(plentyOfMemory).read},
		out, events, zerolog.New(zerolog.NewTestWriter(t)))
	runInBackground(t, rep.Run)

	readyIs := func(want v1.ConditionStatus) (*v1.Node, time.Duration) {
		start := time.Now()
		for {
			node := decodeNode(t, out.next(t, "mqlet/v1/gw1/node", 10*time.Second))
			if condition(t, node, v1.NodeReady).Status == want {
				return node, time.Since(start)
			}
		}
	}
	up, _ := readyIs(v1.ConditionTrue)
	if up.Status.NodeInfo.ContainerRuntimeVersion != "fakecri://9.9.9" {
		t.Fatalf("runtime version %q", up.Status.NodeInfo.ContainerRuntimeVersion)
	}

	srv.Stop()
	down, took := readyIs(v1.ConditionFalse)
	if c := condition(t, down, v1.NodeReady); c.Reason != nodestatus.ReasonRuntimeUnreachable {
		t.Fatalf("Ready=False reason %q, want %q", c.Reason, nodestatus.ReasonRuntimeUnreachable)
	}
	t.Logf("Ready=False published %s after the CRI endpoint stopped", took.Round(time.Millisecond))

	serveFakeCRI(t, socket)
	_, took = readyIs(v1.ConditionTrue)
	t.Logf("Ready=True published %s after the CRI endpoint came back", took.Round(time.Millisecond))
	if _, ok := events.find("NodeNotReady"); !ok {
		t.Fatalf("no NodeNotReady event: %v", events.reasons())
	}
}

// BenchmarkMetricsTick measures one metrics collection (runtime listing,
// cAdvisor sampling of the node and N one-container pods, JSON encoding) as
// the reporter does it, with every cgroup read afresh (in production the
// 30s interval exceeds the collector's 10s sample reuse).
func BenchmarkMetricsTick(b *testing.B) {
	for _, pods := range []int{0, 5, 20} {
		b.Run(fmt.Sprintf("pods=%d", pods), func(b *testing.B) { benchmarkMetricsTick(b, pods) })
	}
}

func benchmarkMetricsTick(b *testing.B, pods int) {
	cgroupRoot := "/mqlet-telemetry-bench-" + randomHex(b, 4)
	rt := newFakeRuntime(true)
	if pods > 0 {
		rt.pods = testPods(b, cgroupRoot, pods)
	}
	col, err := metrics.New(context.Background(), metrics.Options{NodeName: "gw1", CgroupRoot: cgroupRoot, StateDir: b.TempDir(), HousekeepingInterval: time.Nanosecond}, zerolog.Nop())
	if err != nil {
		b.Fatal(err)
	}
	defer col.Close()
	rep := NewMetricsReporter(MetricsOptions{Topics: testTopics, Interval: time.Hour}, col, rt,
		Counters(func() map[string]uint64 { return map[string]uint64{"pod_syncs": 1} }, fixedOutbox{}, fixedSession{}), discardPublisher{}, zerolog.Nop())
	var cpu time.Duration
	var bytes int
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		st, err := rep.Tick(context.Background())
		if err != nil {
			b.Fatal(err)
		}
		cpu += st.CPU
		bytes = st.PayloadBytes
	}
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/op")
	b.ReportMetric(float64(bytes), "payload-bytes")
}

type discardPublisher struct{}

func (discardPublisher) Put(outbox.Message) error { return nil }
