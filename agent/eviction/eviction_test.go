package eviction

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

type fakeStats struct {
	mu   sync.Mutex
	node NodeStats
	pods map[types.UID]PodUsage
	// afterReclaim, when set, replaces node at the next Reclaim.
	afterReclaim NodeStats
}

func (f *fakeStats) Node(context.Context) (NodeStats, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := NodeStats{}
	for k, v := range f.node {
		out[k] = v
	}
	return out, nil
}

func (f *fakeStats) Pods(_ context.Context, pods []*v1.Pod) (map[types.UID]PodUsage, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[types.UID]PodUsage{}
	for _, p := range pods {
		if u, ok := f.pods[p.UID]; ok {
			out[p.UID] = u
		}
	}
	return out, nil
}

type eviction struct {
	pod     string
	message string
	grace   int64
}

type fakeKiller struct{ evictions []eviction }

func (k *fakeKiller) Evict(_ context.Context, pod *v1.Pod, message string, grace int64) error {
	k.evictions = append(k.evictions, eviction{pod: pod.Name, message: message, grace: grace})
	return nil
}

type fakeReclaimer struct {
	stats *fakeStats
	calls int
}

func (r *fakeReclaimer) Reclaim(context.Context) error {
	r.calls++
	if r.stats.afterReclaim != nil {
		r.stats.node = r.stats.afterReclaim
	}
	return nil
}

type fakeEvents struct{ pod, node []string }

func (e *fakeEvents) Event(pod *v1.Pod, eventType, reason, message string) {
	e.pod = append(e.pod, fmt.Sprintf("%s %s %s %s", pod.Name, eventType, reason, message))
}
func (e *fakeEvents) NodeEvent(eventType, reason, message string) {
	e.node = append(e.node, fmt.Sprintf("%s %s %s", eventType, reason, message))
}

type harness struct {
	m       *Manager
	stats   *fakeStats
	killer  *fakeKiller
	reclaim *fakeReclaimer
	events  *fakeEvents
	pods    []*v1.Pod
	now     time.Time
}

func newHarness(t *testing.T, cfg Config, pods ...*v1.Pod) *harness {
	t.Helper()
	h := &harness{stats: &fakeStats{node: NodeStats{}, pods: map[types.UID]PodUsage{}}, killer: &fakeKiller{}, events: &fakeEvents{}, pods: pods,
		now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	h.reclaim = &fakeReclaimer{stats: h.stats}
	m, err := New(cfg, Deps{Stats: h.stats, ActivePods: func() []*v1.Pod { return h.pods }, Killer: h.killer, Reclaimer: h.reclaim, Events: h.events}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	m.now = func() time.Time { return h.now }
	h.m = m
	return h
}

func (h *harness) pass(t *testing.T) []string {
	t.Helper()
	evicted, err := h.m.Synchronize(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range evicted {
		names = append(names, p.Name)
	}
	return names
}

func mustValue(t testing.TB, s Signal, v string) Value {
	t.Helper()
	val, err := ParseValue(s, v)
	if err != nil {
		t.Fatal(err)
	}
	return val
}

func pod(name string, mutate ...func(*v1.Pod)) *v1.Pod {
	p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID("uid-" + name)},
		Spec: v1.PodSpec{Containers: []v1.Container{{Name: "c", Image: "busybox"}}}}
	for _, f := range mutate {
		f(p)
	}
	return p
}

func requests(r v1.ResourceName, q string) func(*v1.Pod) {
	return func(p *v1.Pod) {
		p.Spec.Containers[0].Resources.Requests = v1.ResourceList{r: resource.MustParse(q)}
	}
}

func limits(r v1.ResourceName, q string) func(*v1.Pod) {
	return func(p *v1.Pod) {
		if p.Spec.Containers[0].Resources.Limits == nil {
			p.Spec.Containers[0].Resources.Limits = v1.ResourceList{}
		}
		p.Spec.Containers[0].Resources.Limits[r] = resource.MustParse(q)
	}
}

func priority(v int32) func(*v1.Pod) { return func(p *v1.Pod) { p.Spec.Priority = &v } }

func emptyDir(name, limit string) func(*v1.Pod) {
	return func(p *v1.Pod) {
		ed := &v1.EmptyDirVolumeSource{}
		if limit != "" {
			q := resource.MustParse(limit)
			ed.SizeLimit = &q
		}
		p.Spec.Volumes = append(p.Spec.Volumes, v1.Volume{Name: name, VolumeSource: v1.VolumeSource{EmptyDir: ed}})
	}
}

const mi = 1 << 20

// Each of the pod's own storage bounds evicts it with the kubelet's
// message and event, whatever the node's state; a pod within its bounds
// stays.
func TestLocalStorageLimits(t *testing.T) {
	tests := []struct {
		name string
		pod  *v1.Pod
		use  PodUsage
		want string
	}{
		{"emptyDir past its sizeLimit", pod("e", emptyDir("scratch", "1Mi")),
			PodUsage{EmptyDirs: map[string]VolumeUsage{"scratch": {Bytes: 2 * mi}}},
			`Usage of EmptyDir volume "scratch" exceeds the limit "1Mi". `},
		{"emptyDir within its sizeLimit", pod("e", emptyDir("scratch", "4Mi")),
			PodUsage{EmptyDirs: map[string]VolumeUsage{"scratch": {Bytes: 2 * mi}}}, ""},
		{"emptyDir without a limit", pod("e", emptyDir("scratch", "")),
			PodUsage{EmptyDirs: map[string]VolumeUsage{"scratch": {Bytes: 200 * mi}}}, ""},
		{"pod past its containers' total (emptyDir counted)", pod("p", limits(v1.ResourceEphemeralStorage, "1Mi"), emptyDir("scratch", "")),
			PodUsage{Containers: map[string]ContainerUsage{"c": {RootfsBytes: mi / 2}}, EmptyDirs: map[string]VolumeUsage{"scratch": {Bytes: mi}}},
			"Pod ephemeral local storage usage exceeds the total limit of containers 1Mi. "},
		{"container's writable layer and logs past its limit", pod("c", limits(v1.ResourceEphemeralStorage, "1Mi"), func(p *v1.Pod) {
			p.Spec.Containers = append(p.Spec.Containers, v1.Container{Name: "big", Resources: v1.ResourceRequirements{Limits: v1.ResourceList{v1.ResourceEphemeralStorage: resource.MustParse("10Mi")}}})
		}),
			PodUsage{Containers: map[string]ContainerUsage{"c": {RootfsBytes: mi, LogsBytes: mi}, "big": {}}},
			`Container c exceeded its local ephemeral storage limit "1Mi". `},
		{"within its limit", pod("c", limits(v1.ResourceEphemeralStorage, "10Mi")),
			PodUsage{Containers: map[string]ContainerUsage{"c": {RootfsBytes: mi, LogsBytes: mi}}}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			other := pod("other", emptyDir("d", "1Mi"))
			h := newHarness(t, Config{}, tt.pod, other)
			h.stats.pods[tt.pod.UID] = tt.use
			h.stats.pods[other.UID] = PodUsage{EmptyDirs: map[string]VolumeUsage{"d": {Bytes: 1024}}}
			got := h.pass(t)
			if tt.want == "" {
				if len(got) != 0 || len(h.killer.evictions) != 0 {
					t.Fatalf("evicted %v, want none", got)
				}
				return
			}
			if len(h.killer.evictions) != 1 || h.killer.evictions[0].pod != tt.pod.Name || h.killer.evictions[0].message != tt.want || h.killer.evictions[0].grace != 0 {
				t.Fatalf("evictions %+v, want %s with %q at once", h.killer.evictions, tt.pod.Name, tt.want)
			}
			if want := tt.pod.Name + " Warning Evicted " + tt.want; len(h.events.pod) != 1 || h.events.pod[0] != want {
				t.Fatalf("events %q, want %q", h.events.pod, want)
			}
			// Not evicted twice while it stops.
			if again := h.pass(t); len(again) != 0 {
				t.Fatalf("evicted again: %v", again)
			}
		})
	}
}

// Under a nodefs hard threshold: DiskPressure, new pods refused with the
// kubelet's reason, reclaim tried first, then one pod per pass in the
// kubelet's order (usage above requests, then priority, then how far
// above), killed at once; the condition is held for the transition
// period after the disk recovers.
func TestNodeFsPressureRanksAndEvicts(t *testing.T) {
	cfg := Config{Thresholds: []Threshold{{Signal: NodeFsAvailable, Value: mustValue(t, NodeFsAvailable, "10%")}}, PressureTransitionPeriod: time.Minute}
	within := pod("within", requests(v1.ResourceEphemeralStorage, "100Mi")) // uses 50Mi of 100Mi requested
	highPrio := pod("high", priority(1000))                                 // uses 30Mi, requests none
	lowBig := pod("low-big")                                                // uses 40Mi, requests none
	lowSmall := pod("low-small")                                            // uses 10Mi, requests none
	h := newHarness(t, cfg, within, highPrio, lowSmall, lowBig)
	set := func(p *v1.Pod, bytes uint64) {
		h.stats.pods[p.UID] = PodUsage{EmptyDirs: map[string]VolumeUsage{"d": {Bytes: bytes}}}
	}
	set(within, 50*mi)
	set(highPrio, 30*mi)
	set(lowBig, 40*mi)
	set(lowSmall, 10*mi)
	h.stats.node[NodeFsAvailable] = Observation{Available: 500 * mi, Capacity: 1000 * mi}
	if c := h.m.Conditions(); c != nil {
		t.Fatalf("conditions %+v before the first pass, want none", c)
	}
	if got := h.pass(t); len(got) != 0 {
		t.Fatalf("evicted %v with the disk half free", got)
	}
	if ok, _, _ := h.m.Admit(pod("new")); !ok {
		t.Fatal("a pod was refused without pressure")
	}
	if c := h.m.Conditions()[1]; c.Type != v1.NodeDiskPressure || !c.Known || c.Under {
		t.Fatalf("DiskPressure %+v, want known and not under", c)
	}

	h.stats.node[NodeFsAvailable] = Observation{Available: 50 * mi, Capacity: 1000 * mi}
	var order []string
	for i := 0; i < 4; i++ {
		h.now = h.now.Add(10 * time.Second)
		order = append(order, h.pass(t)...)
	}
	if want := "low-big,low-small,high,within"; strings.Join(order, ",") != want {
		t.Fatalf("evicted in order %v, want %s", order, want)
	}
	if h.reclaim.calls != 4 {
		t.Fatalf("reclaim tried %d times, want before each of the 4 evictions", h.reclaim.calls)
	}
	first := h.killer.evictions[0]
	if want := "The node was low on resource: ephemeral-storage. Threshold quantity: 10%, available: 50Mi. "; first.message != want {
		t.Fatalf("message %q", first.message)
	}
	if first.grace != 0 {
		t.Fatalf("hard threshold evicted with grace %d", first.grace)
	}
	c := h.m.Conditions()[1]
	if !c.Under || !strings.Contains(c.Message, "nodefs.available available 50Mi is below the threshold 100Mi") {
		t.Fatalf("DiskPressure %+v", c)
	}
	ok, reason, msg := h.m.Admit(pod("new", requests(v1.ResourceMemory, "1Mi")))
	if ok || reason != "Evicted" || msg != "The node had condition: [DiskPressure]. " {
		t.Fatalf("admit under disk pressure: %v %q %q", ok, reason, msg)
	}
	if len(h.events.node) == 0 || h.events.node[0] != "Warning EvictionThresholdMet Attempting to reclaim ephemeral-storage" {
		t.Fatalf("node events %q", h.events.node)
	}

	// Recovered: held for the transition period, then cleared.
	h.stats.node[NodeFsAvailable] = Observation{Available: 500 * mi, Capacity: 1000 * mi}
	h.now = h.now.Add(30 * time.Second)
	h.pass(t)
	if !h.m.Conditions()[1].Under {
		t.Fatal("DiskPressure cleared within the transition period")
	}
	h.now = h.now.Add(time.Minute)
	h.pass(t)
	if h.m.Conditions()[1].Under {
		t.Fatal("DiskPressure held past the transition period")
	}
	if ok, _, _ := h.m.Admit(pod("new")); !ok {
		t.Fatal("refused after the pressure cleared")
	}
}

// Reclaiming dead containers and images that frees enough evicts nobody.
func TestReclaimBeforeEvicting(t *testing.T) {
	cfg := Config{Thresholds: []Threshold{{Signal: ImageFsAvailable, Value: mustValue(t, ImageFsAvailable, "15%")}}}
	p := pod("p")
	h := newHarness(t, cfg, p)
	h.stats.pods[p.UID] = PodUsage{}
	h.stats.node[ImageFsAvailable] = Observation{Available: 10 * mi, Capacity: 100 * mi}
	h.stats.afterReclaim = NodeStats{ImageFsAvailable: {Available: 50 * mi, Capacity: 100 * mi}}
	if got := h.pass(t); len(got) != 0 || h.reclaim.calls != 1 {
		t.Fatalf("evicted %v after reclaiming enough (reclaims %d)", got, h.reclaim.calls)
	}
}

// A soft threshold evicts only once met for its grace period, with the
// pod's grace period capped by MaxPodGracePeriod.
func TestSoftThresholdGracePeriod(t *testing.T) {
	cfg := Config{Thresholds: []Threshold{{Signal: MemoryAvailable, Value: mustValue(t, MemoryAvailable, "200Mi"), GracePeriod: time.Minute}}, MaxPodGracePeriod: 20}
	thirty := int64(30)
	p := pod("p", func(p *v1.Pod) { p.Spec.TerminationGracePeriodSeconds = &thirty })
	h := newHarness(t, cfg, p)
	h.stats.pods[p.UID] = PodUsage{MemoryWorkingSetBytes: 100 * mi}
	h.stats.node[MemoryAvailable] = Observation{Available: 150 * mi, Capacity: 1000 * mi}
	if got := h.pass(t); len(got) != 0 {
		t.Fatalf("evicted %v at once for a soft threshold", got)
	}
	if !h.m.Conditions()[0].Under {
		t.Fatal("MemoryPressure not set while the soft threshold is met")
	}
	h.now = h.now.Add(30 * time.Second)
	if got := h.pass(t); len(got) != 0 {
		t.Fatalf("evicted %v within the grace period", got)
	}
	h.now = h.now.Add(31 * time.Second)
	if got := h.pass(t); len(got) != 1 || h.killer.evictions[0].grace != 20 {
		t.Fatalf("evicted %v %+v, want p with grace 20s", got, h.killer.evictions)
	}
}

// Memory pressure: BestEffort first; BestEffort pods refused, others
// admitted (as the kubelet's admission).
func TestMemoryPressureBestEffortFirst(t *testing.T) {
	cfg := Config{Thresholds: []Threshold{{Signal: MemoryAvailable, Value: mustValue(t, MemoryAvailable, "100Mi")}}}
	guaranteed := pod("guaranteed", requests(v1.ResourceMemory, "300Mi"), limits(v1.ResourceMemory, "300Mi"))
	bestEffort := pod("besteffort")
	h := newHarness(t, cfg, guaranteed, bestEffort)
	h.stats.pods[guaranteed.UID] = PodUsage{MemoryWorkingSetBytes: 250 * mi}
	h.stats.pods[bestEffort.UID] = PodUsage{MemoryWorkingSetBytes: 20 * mi}
	h.stats.node[MemoryAvailable] = Observation{Available: 50 * mi, Capacity: 1000 * mi}
	if got := h.pass(t); len(got) != 1 || got[0] != "besteffort" {
		t.Fatalf("evicted %v, want besteffort", got)
	}
	if h.reclaim.calls != 0 {
		t.Fatal("reclaimed disk for memory pressure")
	}
	if ok, _, msg := h.m.Admit(pod("be")); ok || msg != "The node had condition: [MemoryPressure]. " {
		t.Fatalf("BestEffort admitted under memory pressure (%q)", msg)
	}
	if ok, _, _ := h.m.Admit(pod("b", requests(v1.ResourceMemory, "10Mi"))); !ok {
		t.Fatal("Burstable refused under memory pressure alone")
	}
	tolerant := pod("be", func(p *v1.Pod) {
		p.Spec.Tolerations = []v1.Toleration{{Key: v1.TaintNodeMemoryPressure, Operator: v1.TolerationOpExists, Effect: v1.TaintEffectNoSchedule}}
	})
	if ok, _, _ := h.m.Admit(tolerant); !ok {
		t.Fatal("BestEffort tolerating memory-pressure refused")
	}
}

// PID pressure ranks by priority, then by processes.
func TestPIDPressure(t *testing.T) {
	cfg := Config{Thresholds: []Threshold{{Signal: PIDAvailable, Value: mustValue(t, PIDAvailable, "5%")}}}
	few, many := pod("few"), pod("many")
	h := newHarness(t, cfg, few, many)
	h.stats.pods[few.UID] = PodUsage{Processes: 3}
	h.stats.pods[many.UID] = PodUsage{Processes: 300}
	h.stats.node[PIDAvailable] = Observation{Available: 10, Capacity: 1000}
	if got := h.pass(t); len(got) != 1 || got[0] != "many" {
		t.Fatalf("evicted %v, want many", got)
	}
	if c := h.m.Conditions()[2]; !c.Under || c.Type != v1.NodePIDPressure {
		t.Fatalf("PIDPressure %+v", c)
	}
}

// mqlet's reserve: the state dir's filesystem counts the reserve as used,
// so pods are evicted while mqlet still has room.
func TestReservedStorage(t *testing.T) {
	cfg := Config{Thresholds: []Threshold{{Signal: NodeFsAvailable, Value: mustValue(t, NodeFsAvailable, "100Mi")}}, ReservedStorage: 64 * mi}
	p := pod("p")
	h := newHarness(t, cfg, p)
	h.stats.pods[p.UID] = PodUsage{}
	h.stats.node[NodeFsAvailable] = Observation{Available: 150 * mi, Capacity: 1000 * mi}
	if got := h.pass(t); len(got) != 1 {
		t.Fatalf("evicted %v: 150Mi free less a 64Mi reserve is below 100Mi", got)
	}
}

func TestParseValue(t *testing.T) {
	for in, ok := range map[string]bool{"10%": true, "100Mi": true, "1000": true, "0%": false, "100%": false, "x": false, "-1": false} {
		if _, err := ParseValue(NodeFsAvailable, in); (err == nil) != ok {
			t.Errorf("%q: err %v", in, err)
		}
	}
	if _, err := ParseValue("disk.available", "1Gi"); err == nil || !strings.Contains(err.Error(), "unknown eviction signal") {
		t.Errorf("unknown signal: %v", err)
	}
}

// BenchmarkPass20Pods is one pass over 20 pods under disk pressure: the
// observations, the local storage checks, the ranking and one eviction.
func BenchmarkPass20Pods(b *testing.B) {
	cfg := Config{Thresholds: []Threshold{
		{Signal: MemoryAvailable, Value: mustValue(b, MemoryAvailable, "100Mi")},
		{Signal: NodeFsAvailable, Value: mustValue(b, NodeFsAvailable, "10%")},
		{Signal: PIDAvailable, Value: mustValue(b, PIDAvailable, "5%")},
	}}
	stats := &fakeStats{node: NodeStats{
		MemoryAvailable: {Available: 500 * mi, Capacity: 1000 * mi},
		NodeFsAvailable: {Available: 50 * mi, Capacity: 1000 * mi},
		PIDAvailable:    {Available: 30000, Capacity: 32768},
	}, pods: map[types.UID]PodUsage{}}
	var pods []*v1.Pod
	for i := 0; i < 20; i++ {
		p := pod(fmt.Sprintf("p%02d", i), emptyDir("d", "1Gi"), limits(v1.ResourceEphemeralStorage, "1Gi"), requests(v1.ResourceEphemeralStorage, "1Mi"))
		pods = append(pods, p)
		stats.pods[p.UID] = PodUsage{MemoryWorkingSetBytes: uint64(i) * mi, Processes: 3,
			Containers: map[string]ContainerUsage{"c": {RootfsBytes: uint64(i) * 1024, LogsBytes: 4096}},
			EmptyDirs:  map[string]VolumeUsage{"d": {Bytes: uint64(i) * mi}}}
	}
	m, err := New(cfg, Deps{Stats: stats, ActivePods: func() []*v1.Pod { return pods }, Killer: &fakeKiller{}, Events: &fakeEvents{}}, zerolog.Nop())
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		m.evicted = map[types.UID]bool{}
		if got, err := m.Synchronize(context.Background()); err != nil || len(got) != 1 {
			b.Fatalf("evicted %v, %v", got, err)
		}
	}
}
