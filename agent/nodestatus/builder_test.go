package nodestatus

import (
	"bytes"
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	cadvisorapi "github.com/google/cadvisor/lib/model"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

const gi = 1 << 30

func u64(v uint64) *uint64 { return &v }

func healthyInputs() Inputs {
	return Inputs{
		Machine: &cadvisorapi.MachineInfo{
			NumCores: 4, MemoryCapacity: 8 * gi,
			MachineID: "machine-1", SystemUUID: "uuid-1", BootID: "boot-1",
		},
		Host: HostInfo{
			KernelVersion: "6.1.0-18-amd64", OSImage: "Debian GNU/Linux 12 (bookworm)",
			OperatingSystem: "linux", Architecture: "arm64", Hostname: "gw-1",
			InternalIPs: []string{"192.168.1.20", "fd00::20"},
		},
		Runtime:              RuntimeInfo{Name: "containerd", Version: "1.6.20", Ready: true},
		MemoryAvailableBytes: u64(4 * gi),
		Disk:                 &DiskUsage{CapacityBytes: 100 * gi, AvailableBytes: 50 * gi},
		PIDs:                 &PIDUsage{Running: 300, Max: 32768},
	}
}

func newTestBuilder(t *testing.T) *Builder {
	t.Helper()
	b, err := NewBuilder(Options{NodeName: "gw-1", Version: "v0.3.0", Labels: map[string]string{"site": "north", v1.LabelHostname: "spoofed"}})
	if err != nil {
		t.Fatalf("NewBuilder: %v", err)
	}
	return b
}

func condition(t *testing.T, n *v1.Node, ct v1.NodeConditionType) v1.NodeCondition {
	t.Helper()
	c := findCondition(n.Status.Conditions, ct)
	if c == nil {
		t.Fatalf("no %s condition in %+v", ct, n.Status.Conditions)
	}
	return *c
}

func TestBuildHealthyNode(t *testing.T) {
	now := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	n := newTestBuilder(t).Build(healthyInputs(), nil, now)

	wantLabels := map[string]string{"site": "north", v1.LabelHostname: "gw-1", v1.LabelOSStable: "linux", v1.LabelArchStable: "arm64"}
	if len(n.Labels) != len(wantLabels) {
		t.Errorf("labels = %v, want %v", n.Labels, wantLabels)
	}
	for k, v := range wantLabels {
		if n.Labels[k] != v {
			t.Errorf("label %s = %q, want %q", k, n.Labels[k], v)
		}
	}
	if n.Name != "gw-1" || n.Kind != "Node" || n.APIVersion != "v1" {
		t.Errorf("identity = %s %s/%s", n.Name, n.APIVersion, n.Kind)
	}

	quantities := []struct {
		list v1.ResourceList
		name v1.ResourceName
		want string
	}{
		{n.Status.Capacity, v1.ResourceCPU, "4"},
		{n.Status.Capacity, v1.ResourceMemory, "8Gi"},
		{n.Status.Capacity, v1.ResourcePods, "110"},
		{n.Status.Capacity, v1.ResourceEphemeralStorage, "100Gi"},
		{n.Status.Allocatable, v1.ResourceCPU, "4"},
		{n.Status.Allocatable, v1.ResourceMemory, "8092Mi"}, // 8Gi − 100Mi
		{n.Status.Allocatable, v1.ResourcePods, "110"},
		{n.Status.Allocatable, v1.ResourceEphemeralStorage, "90Gi"}, // 10% kept free
	}
	for _, q := range quantities {
		got, ok := q.list[q.name]
		if want := resource.MustParse(q.want); !ok || got.Cmp(want) != 0 {
			t.Errorf("%s = %s, want %s", q.name, got.String(), q.want)
		}
	}

	want := v1.NodeSystemInfo{
		MachineID: "machine-1", SystemUUID: "uuid-1", BootID: "boot-1",
		KernelVersion: "6.1.0-18-amd64", OSImage: "Debian GNU/Linux 12 (bookworm)",
		ContainerRuntimeVersion: "containerd://1.6.20", KubeletVersion: "v0.3.0",
		OperatingSystem: "linux", Architecture: "arm64",
	}
	if n.Status.NodeInfo != want {
		t.Errorf("nodeInfo = %+v, want %+v", n.Status.NodeInfo, want)
	}
	wantAddrs := []v1.NodeAddress{
		{Type: v1.NodeInternalIP, Address: "192.168.1.20"},
		{Type: v1.NodeInternalIP, Address: "fd00::20"},
		{Type: v1.NodeHostName, Address: "gw-1"},
	}
	if len(n.Status.Addresses) != len(wantAddrs) {
		t.Fatalf("addresses = %+v", n.Status.Addresses)
	}
	for i := range wantAddrs {
		if n.Status.Addresses[i] != wantAddrs[i] {
			t.Errorf("address %d = %+v, want %+v", i, n.Status.Addresses[i], wantAddrs[i])
		}
	}
	for _, c := range n.Status.Conditions {
		if !c.LastHeartbeatTime.Time.Equal(now) || !c.LastTransitionTime.Time.Equal(now) {
			t.Errorf("%s times = %v / %v, want %v", c.Type, c.LastHeartbeatTime, c.LastTransitionTime, now)
		}
	}
}

func TestConditions(t *testing.T) {
	cases := []struct {
		name       string
		change     func(*Inputs)
		thresholds Thresholds
		cond       v1.NodeConditionType
		status     v1.ConditionStatus
		reason     string
		message    string // substring
	}{
		{"ready", nil, Thresholds{}, v1.NodeReady, v1.ConditionTrue, ReasonReady, "ready"},
		{"runtime down", func(in *Inputs) {
			in.Runtime = RuntimeInfo{Name: "containerd", Ready: false, Reason: "Unavailable", Message: "dial unix /run/containerd/containerd.sock: connect: no such file"}
		}, Thresholds{}, v1.NodeReady, v1.ConditionFalse, ReasonRuntimeUnreachable, "containerd is not ready: Unavailable: dial unix"},

		{"memory fine", nil, Thresholds{}, v1.NodeMemoryPressure, v1.ConditionFalse, ReasonSufficientMemory, ""},
		{"memory below default 100Mi", func(in *Inputs) { in.MemoryAvailableBytes = u64(99 << 20) }, Thresholds{},
			v1.NodeMemoryPressure, v1.ConditionTrue, ReasonInsufficientMemory, "below the threshold 100Mi"},
		{"memory exactly at threshold", func(in *Inputs) { in.MemoryAvailableBytes = u64(100 << 20) }, Thresholds{},
			v1.NodeMemoryPressure, v1.ConditionFalse, ReasonSufficientMemory, ""},
		{"memory below custom 1Gi", func(in *Inputs) { in.MemoryAvailableBytes = u64(512 << 20) }, Thresholds{MemoryAvailable: resource.MustParse("1Gi")},
			v1.NodeMemoryPressure, v1.ConditionTrue, ReasonInsufficientMemory, "1Gi"},
		{"memory unknown", func(in *Inputs) { in.MemoryAvailableBytes = nil }, Thresholds{},
			v1.NodeMemoryPressure, v1.ConditionUnknown, ReasonStatsUnavailable, "memory"},

		{"disk fine", nil, Thresholds{}, v1.NodeDiskPressure, v1.ConditionFalse, ReasonNoDiskPressure, ""},
		{"disk 9% free under default 10%", func(in *Inputs) { in.Disk = &DiskUsage{CapacityBytes: 100, AvailableBytes: 9} }, Thresholds{},
			v1.NodeDiskPressure, v1.ConditionTrue, ReasonDiskPressure, "9.0%"},
		{"disk 10% free at default", func(in *Inputs) { in.Disk = &DiskUsage{CapacityBytes: 100, AvailableBytes: 10} }, Thresholds{},
			v1.NodeDiskPressure, v1.ConditionFalse, ReasonNoDiskPressure, ""},
		{"disk 15% free under custom 20%", func(in *Inputs) { in.Disk = &DiskUsage{CapacityBytes: 100, AvailableBytes: 15} }, Thresholds{DiskAvailablePercent: 20},
			v1.NodeDiskPressure, v1.ConditionTrue, ReasonDiskPressure, "20%"},
		{"disk check disabled", func(in *Inputs) { in.Disk = &DiskUsage{CapacityBytes: 100, AvailableBytes: 0} }, Thresholds{DiskAvailablePercent: -1},
			v1.NodeDiskPressure, v1.ConditionFalse, ReasonNoDiskPressure, ""},
		{"disk unknown", func(in *Inputs) { in.Disk = nil }, Thresholds{},
			v1.NodeDiskPressure, v1.ConditionUnknown, ReasonStatsUnavailable, "filesystem"},

		{"pids fine", nil, Thresholds{}, v1.NodePIDPressure, v1.ConditionFalse, ReasonSufficientPID, ""},
		{"pids 96% used over default 5%", func(in *Inputs) { in.PIDs = &PIDUsage{Running: 960, Max: 1000} }, Thresholds{},
			v1.NodePIDPressure, v1.ConditionTrue, ReasonInsufficientPID, "960 of 1000"},
		{"pids 95% used at default", func(in *Inputs) { in.PIDs = &PIDUsage{Running: 950, Max: 1000} }, Thresholds{},
			v1.NodePIDPressure, v1.ConditionFalse, ReasonSufficientPID, ""},
		{"pids over the limit", func(in *Inputs) { in.PIDs = &PIDUsage{Running: 1200, Max: 1000} }, Thresholds{},
			v1.NodePIDPressure, v1.ConditionTrue, ReasonInsufficientPID, ""},
		{"pids unknown", func(in *Inputs) { in.PIDs = nil }, Thresholds{},
			v1.NodePIDPressure, v1.ConditionUnknown, ReasonStatsUnavailable, "process IDs"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b, err := NewBuilder(Options{NodeName: "n", Thresholds: tc.thresholds})
			if err != nil {
				t.Fatalf("NewBuilder: %v", err)
			}
			in := healthyInputs()
			if tc.change != nil {
				tc.change(&in)
			}
			n := b.Build(in, nil, time.Now())
			if len(n.Status.Conditions) != 4 {
				t.Errorf("want 4 conditions, got %+v", n.Status.Conditions)
			}
			c := condition(t, n, tc.cond)
			if c.Status != tc.status || c.Reason != tc.reason || !strings.Contains(c.Message, tc.message) {
				t.Errorf("%s = %s/%s %q, want %s/%s containing %q", tc.cond, c.Status, c.Reason, c.Message, tc.status, tc.reason, tc.message)
			}
		})
	}
}

func TestTransitionTimes(t *testing.T) {
	b := newTestBuilder(t)
	t0 := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	t1, t2 := t0.Add(10*time.Second), t0.Add(20*time.Second)

	first := b.Build(healthyInputs(), nil, t0)
	second := b.Build(healthyInputs(), first, t1)
	for _, c := range second.Status.Conditions {
		if !c.LastTransitionTime.Time.Equal(t0) || !c.LastHeartbeatTime.Time.Equal(t1) {
			t.Errorf("unchanged %s: transition %v heartbeat %v, want %v / %v", c.Type, c.LastTransitionTime, c.LastHeartbeatTime, t0, t1)
		}
	}
	if !second.CreationTimestamp.Time.Equal(t0) {
		t.Errorf("creationTimestamp moved to %v", second.CreationTimestamp)
	}
	if Changed(first, second) {
		t.Errorf("Changed reports a heartbeat-only difference")
	}

	down := healthyInputs()
	down.Runtime.Ready, down.Runtime.Reason = false, "Unavailable"
	third := b.Build(down, second, t2)
	if c := condition(t, third, v1.NodeReady); !c.LastTransitionTime.Time.Equal(t2) || c.Status != v1.ConditionFalse {
		t.Errorf("Ready after the runtime went down = %+v, want False since %v", c, t2)
	}
	if c := condition(t, third, v1.NodeMemoryPressure); !c.LastTransitionTime.Time.Equal(t0) {
		t.Errorf("MemoryPressure transition moved to %v", c.LastTransitionTime)
	}
	if !Changed(second, third) {
		t.Errorf("Changed misses a Ready transition")
	}
}

func TestChanged(t *testing.T) {
	b := newTestBuilder(t)
	now := time.Now()
	base := b.Build(healthyInputs(), nil, now)
	cases := []struct {
		name   string
		change func(*Inputs)
		want   bool
	}{
		{"nothing", func(*Inputs) {}, false},
		{"memory moves but stays sufficient", func(in *Inputs) { in.MemoryAvailableBytes = u64(3 * gi) }, false},
		{"new address", func(in *Inputs) { in.Host.InternalIPs = []string{"10.0.0.5"} }, true},
		{"runtime upgraded", func(in *Inputs) { in.Runtime.Version = "1.7.0" }, true},
		{"reboot", func(in *Inputs) { in.Machine.BootID = "boot-2" }, true},
		{"disk pressure", func(in *Inputs) { in.Disk.AvailableBytes = 1 }, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			in := healthyInputs()
			tc.change(&in)
			next := b.Build(in, base, now.Add(time.Minute))
			if got := Changed(base, next); got != tc.want {
				t.Errorf("Changed = %v, want %v", got, tc.want)
			}
		})
	}
	if !Changed(nil, base) || Changed(nil, nil) {
		t.Errorf("Changed with nil nodes is wrong")
	}
}

func TestNodeDecodesStrictly(t *testing.T) {
	b := newTestBuilder(t)
	prev := b.Build(healthyInputs(), nil, time.Now())
	n := b.Build(healthyInputs(), prev, time.Now().Add(time.Second))
	raw, err := json.Marshal(n)
	if err != nil {
		t.Fatalf("marshal: %v", err)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	var back v1.Node
	if err := dec.Decode(&back); err != nil {
		t.Fatalf("strict decode of %s: %v", raw, err)
	}
	// Heartbeats are whole seconds, so the round trip loses nothing.
	if Changed(n, &back) || !back.Status.Conditions[0].LastHeartbeatTime.Equal(&n.Status.Conditions[0].LastHeartbeatTime) {
		t.Errorf("round trip changed the node:\n%s", raw)
	}
}

func TestNewBuilderRejectsBadOptions(t *testing.T) {
	if _, err := NewBuilder(Options{}); err == nil {
		t.Errorf("empty node name accepted")
	}
	if _, err := NewBuilder(Options{NodeName: "n", Thresholds: Thresholds{DiskAvailablePercent: 150}}); err == nil {
		t.Errorf("150%% disk threshold accepted")
	}
}

func TestBuildListsImages(t *testing.T) {
	b, err := NewBuilder(Options{NodeName: "gw1"})
	if err != nil {
		t.Fatal(err)
	}
	in := healthyInputs()
	in.Images = []v1.ContainerImage{{Names: []string{"r/big:1", "r/big@sha256:aa"}, SizeBytes: 200 << 20}, {Names: []string{"r/small:1"}, SizeBytes: 1 << 20}}
	n := b.Build(in, nil, time.Now())
	if len(n.Status.Images) != 2 || n.Status.Images[0].Names[0] != "r/big:1" || n.Status.Images[1].SizeBytes != 1<<20 {
		t.Fatalf("status.images %+v", n.Status.Images)
	}
}

// Configured labels are published and pods are admitted against them; the
// kubelet's well-known ones come from the node and the host and win.
func TestLabelsAndAllocatable(t *testing.T) {
	b, err := NewBuilder(Options{NodeName: "gw1", Labels: map[string]string{"site": "a", v1.LabelHostname: "spoofed"}})
	if err != nil {
		t.Fatal(err)
	}
	n := b.Build(Inputs{Host: HostInfo{Architecture: "arm64"},
		Machine: &cadvisorapi.MachineInfo{NumCores: 4, MemoryCapacity: 2 << 30}}, nil, time.Now())
	want := map[string]string{"site": "a", v1.LabelHostname: "gw1", v1.LabelOSStable: "linux", v1.LabelArchStable: "arm64"}
	if !maps.Equal(n.Labels, want) {
		t.Fatalf("labels %v, want %v", n.Labels, want)
	}
	alloc := Allocatable(4, 2<<30, resource.Quantity{})
	for _, name := range []v1.ResourceName{v1.ResourceCPU, v1.ResourceMemory} {
		got, published := alloc[name], n.Status.Allocatable[name]
		if got.Cmp(published) != 0 {
			t.Errorf("allocatable %s: %s, published %s", name, got.String(), published.String())
		}
	}
	if mem := alloc[v1.ResourceMemory]; mem.Value() != 2<<30-100<<20 {
		t.Errorf("allocatable memory %d", mem.Value())
	}
}

func TestReadMemTotal(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "meminfo"), []byte("MemTotal:        2048 kB\nMemFree:  1 kB\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, err := ReadMemTotal(dir); err != nil || got != 2048*1024 {
		t.Fatalf("ReadMemTotal = %d, %v", got, err)
	}
	if _, err := ReadMemTotal(t.TempDir()); err == nil {
		t.Fatal("no meminfo: no error")
	}
}

// With the eviction manager's pressure states, the pressure conditions
// are its (True with its message, False, or Unknown when unmeasured), not
// the builder's thresholds; the reserve is left out of allocatable.
func TestPressureFromEvictionAndReserve(t *testing.T) {
	b, err := NewBuilder(Options{NodeName: "gw-1", Thresholds: Thresholds{ReservedMemory: 48 << 20, ReservedStorage: 64 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	in := healthyInputs()
	in.Pressure = []PressureState{
		{Type: v1.NodeDiskPressure, Known: true, Under: true, Message: "nodefs.available available 5Mi is below the threshold 10Mi"},
		{Type: v1.NodeMemoryPressure, Known: true},
	}
	n := b.Build(in, nil, time.Now())
	if c := condition(t, n, v1.NodeDiskPressure); c.Status != v1.ConditionTrue || c.Reason != ReasonDiskPressure || c.Message != in.Pressure[0].Message {
		t.Errorf("DiskPressure %+v", c)
	}
	if c := condition(t, n, v1.NodeMemoryPressure); c.Status != v1.ConditionFalse {
		t.Errorf("MemoryPressure %+v", c)
	}
	if c := condition(t, n, v1.NodePIDPressure); c.Status != v1.ConditionUnknown {
		t.Errorf("PIDPressure %+v, want Unknown (no signal measured)", c)
	}
	if mem := n.Status.Allocatable[v1.ResourceMemory]; mem.Value() != 8*gi-100<<20-48<<20 {
		t.Errorf("allocatable memory %d", mem.Value())
	}
	if disk := n.Status.Allocatable[v1.ResourceEphemeralStorage]; disk.Value() != 100*gi-10*gi-64<<20 {
		t.Errorf("allocatable ephemeral-storage %d", disk.Value())
	}
}

// Live labels (the node's groups') are read at every build and win over
// the configured ones; the well-known ones win over both.
func TestLiveLabelsFollowEachBuild(t *testing.T) {
	live := map[string]string{"group.mqlet.io/line-1": "true"}
	b, err := NewBuilder(Options{NodeName: "gw1", Labels: map[string]string{"site": "a"}, LiveLabels: func() map[string]string {
		return map[string]string{"group.mqlet.io/line-1": live["group.mqlet.io/line-1"], v1.LabelHostname: "spoofed"}
	}})
	if err != nil {
		t.Fatal(err)
	}
	n := b.Build(Inputs{}, nil, time.Now())
	if n.Labels["group.mqlet.io/line-1"] != "true" || n.Labels["site"] != "a" || n.Labels[v1.LabelHostname] != "gw1" {
		t.Fatalf("labels %v", n.Labels)
	}
	live["group.mqlet.io/line-1"] = ""
	next := b.Build(Inputs{}, n, time.Now())
	if next.Labels["group.mqlet.io/line-1"] != "" || !Changed(n, next) {
		t.Fatalf("a live label change is not in the next build (or not a change): %v", next.Labels)
	}
}
