package intake

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/mqlet/mqlet/agent/store"
	"github.com/mqlet/mqlet/agent/validate"
	apiv1 "github.com/mqlet/mqlet/api/v1"
)

type phases map[string]v1.PodPhase

func (p phases) Get(namespace, name string) (*v1.Pod, bool) {
	ph, ok := p[namespace+"/"+name]
	if !ok {
		return nil, false
	}
	return &v1.Pod{Status: v1.PodStatus{Phase: ph}}, true
}

func (phases) Terminating() []*v1.Pod { return nil }

// newAdmissionRig is a node "n1" labelled site=a, with 2 cpus and 1Gi of
// allocatable memory.
func newAdmissionRig(t *testing.T, status StatusSource) *rig {
	r := newRig(t)
	r.in = New(Options{Topics: apiv1.Scheme{Prefix: "mqlet/v1", Node: "n1"}, MaxPayloadBytes: 1 << 20, Policy: validate.Policy{}, ApplyDeadline: time.Minute,
		NodeLabels:  map[string]string{"site": "a", v1.LabelHostname: "n1", v1.LabelOSStable: "linux"},
		Allocatable: v1.ResourceList{v1.ResourceCPU: resource.MustParse("2"), v1.ResourceMemory: resource.MustParse("1Gi")}},
		r.st, r.sender, r.track, r.sched, r.events, status, zerolog.Nop())
	return r
}

func admitPod(name, extra string) string {
	return `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"` + name + `"},"spec":{` + extra + `"containers":[{"name":"c","image":"busybox:1"}]}}`
}

func podWithRequests(name, cpu, memory string) string {
	return `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"` + name + `"},"spec":{"containers":[{"name":"c","image":"busybox:1",` +
		`"resources":{"requests":{"cpu":"` + cpu + `","memory":"` + memory + `"}}}]}}`
}

func storedPods(t *testing.T, st *store.Store) []string {
	t.Helper()
	pods, err := st.ListPods()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range pods {
		names = append(names, p.Name)
	}
	return names
}

func TestAdmissionNodeAffinity(t *testing.T) {
	r := newAdmissionRig(t, noStatus{})
	tests := []struct {
		name, spec string
		admit      bool
	}{
		{"selector matches", `"nodeSelector":{"site":"a"},`, true},
		{"well-known label matches", `"nodeSelector":{"kubernetes.io/hostname":"n1","kubernetes.io/os":"linux"},`, true},
		{"selector differs", `"nodeSelector":{"site":"b"},`, false},
		{"selector names a missing label", `"nodeSelector":{"gpu":"yes"},`, false},
		{"required affinity matches", `"affinity":{"nodeAffinity":{"requiredDuringSchedulingIgnoredDuringExecution":{"nodeSelectorTerms":[` +
			`{"matchExpressions":[{"key":"site","operator":"In","values":["x","a"]}]}]}}},`, true},
		{"required affinity by node name", `"affinity":{"nodeAffinity":{"requiredDuringSchedulingIgnoredDuringExecution":{"nodeSelectorTerms":[` +
			`{"matchFields":[{"key":"metadata.name","operator":"In","values":["n1"]}]}]}}},`, true},
		{"required affinity does not match", `"affinity":{"nodeAffinity":{"requiredDuringSchedulingIgnoredDuringExecution":{"nodeSelectorTerms":[` +
			`{"matchExpressions":[{"key":"site","operator":"NotIn","values":["a"]}]}]}}},`, false},
		{"preferred affinity is a preference only", `"affinity":{"nodeAffinity":{"preferredDuringSchedulingIgnoredDuringExecution":[` +
			`{"weight":1,"preference":{"matchExpressions":[{"key":"site","operator":"In","values":["b"]}]}}]}},`, true},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id := "aff" + string(rune('a'+i))
			name := "p" + string(rune('a'+i))
			r.in.Handle(cmd("apply", id, admitPod(name, tt.spec)))
			last := r.sender.last(id)
			stored := slices.Contains(storedPods(t, r.st), name)
			if tt.admit {
				if last.Phase == apiv1.Failed || !stored {
					t.Fatalf("refused: %+v", last)
				}
				return
			}
			want := "NodeAffinity: Pod default/" + name + ": Predicate NodeAffinity failed: node(s) didn't match Pod's node affinity/selector"
			if last.Phase != apiv1.Failed || !strings.HasPrefix(last.Message, want) || stored {
				t.Fatalf("reply %q (stored %v), want failed with prefix %q", last.Message, stored, want)
			}
			if r.events.reasons[len(r.events.reasons)-1] != ReasonNodeAffinity {
				t.Fatalf("events %v", r.events.reasons)
			}
		})
	}
}

func TestAdmissionResources(t *testing.T) {
	status := phases{}
	r := newAdmissionRig(t, status)
	apply := func(id, manifest string) apiv1.Reply {
		t.Helper()
		r.in.Handle(cmd("apply", id, manifest))
		return r.sender.last(id)
	}
	if got := apply("a", podWithRequests("a", "1500m", "256Mi")); got.Phase == apiv1.Failed {
		t.Fatalf("first pod: %+v", got)
	}
	got := apply("b", podWithRequests("b", "1", "128Mi"))
	want := "OutOfcpu: Pod default/b: Node didn't have enough resource: cpu, requested: 1000, used: 1500, capacity: 2000"
	if got.Phase != apiv1.Failed || !strings.HasPrefix(got.Message, want) {
		t.Fatalf("cpu: %q, want prefix %q", got.Message, want)
	}
	got = apply("c", podWithRequests("c", "100m", "900Mi"))
	want = "OutOfmemory: Pod default/c: Node didn't have enough resource: memory, requested: 943718400, used: 268435456, capacity: 1073741824"
	if got.Phase != apiv1.Failed || !strings.HasPrefix(got.Message, want) {
		t.Fatalf("memory: %q, want prefix %q", got.Message, want)
	}
	if !slices.Contains(r.events.reasons, ReasonOutOfCPU) || !slices.Contains(r.events.reasons, ReasonOutOfMemory) {
		t.Fatalf("events %v", r.events.reasons)
	}
	// A pod that requests nothing always fits; an update is judged without its old self.
	if got := apply("d", admitPod("d", "")); got.Phase == apiv1.Failed {
		t.Fatalf("no requests: %+v", got)
	}
	if got := apply("a2", podWithRequests("a", "2", "1Gi")); got.Phase == apiv1.Failed {
		t.Fatalf("update to the whole node: %+v", got)
	}
	// Limits only: the requests default to them, as the API server does.
	limitsOnly := `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"e"},"spec":{"containers":[{"name":"c","image":"busybox:1",` +
		`"resources":{"limits":{"cpu":"500m"}}}]}}`
	if got := apply("e", limitsOnly); got.Phase != apiv1.Failed || !strings.HasPrefix(got.Message, "OutOfcpu: Pod default/e") {
		t.Fatalf("limits only: %q", got.Message)
	}
	// A finished pod's requests are free again.
	status["default/a"] = v1.PodSucceeded
	if got := apply("e2", limitsOnly); got.Phase == apiv1.Failed {
		t.Fatalf("after the big pod finished: %+v", got)
	}
	if names := storedPods(t, r.st); !slices.Equal(names, []string{"a", "d", "e"}) {
		t.Fatalf("stored %v", names)
	}
}

// Pods of one command count each other: both are named when neither fits
// after the first, and nothing is applied.
func TestAdmissionWithinOneCommand(t *testing.T) {
	r := newAdmissionRig(t, noStatus{})
	list := `{"apiVersion":"v1","kind":"List","items":[` + podWithRequests("x", "1", "1Mi") + "," + podWithRequests("y", "1500m", "1Mi") + "," +
		admitPod("z", `"nodeSelector":{"site":"b"},`) + `]}`
	r.in.Handle(cmd("apply", "list", list))
	got := r.sender.last("list")
	if got.Phase != apiv1.Failed || !strings.HasPrefix(got.Message, "2 pods not admitted, nothing applied: OutOfcpu: Pod default/y") ||
		!strings.Contains(got.Message, "NodeAffinity: Pod default/z") {
		t.Fatalf("reply %q", got.Message)
	}
	if names := storedPods(t, r.st); len(names) != 0 {
		t.Fatalf("stored %v", names)
	}
	// A sync replaces the stored pods, so theirs do not count.
	r.in.Handle(cmd("apply", "big", podWithRequests("big", "2", "1Mi")))
	r.in.Handle(cmd("sync", "sync", `{"apiVersion":"v1","kind":"List","items":[`+podWithRequests("small", "2", "1Mi")+`]}`))
	if got := r.sender.last("sync"); got.Phase == apiv1.Failed {
		t.Fatalf("sync: %+v", got)
	}
	if names := storedPods(t, r.st); !slices.Equal(names, []string{"small"}) {
		t.Fatalf("stored %v", names)
	}
}

// Pod-level requests are what a pod asks of the node when set, not its
// containers' (the kubelet's PodRequests with pod-level resources); pod
// limits alone default the pod's requests, as the API server does.
func TestAdmissionPodLevelResources(t *testing.T) {
	r := newAdmissionRig(t, noStatus{})
	apply := func(id, manifest string) apiv1.Reply {
		t.Helper()
		r.in.Handle(cmd("apply", id, manifest))
		return r.sender.last(id)
	}
	// Containers ask 100m and 16Mi; the pod asks 1500m and 512Mi.
	podLevel := `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"},"spec":{` +
		`"resources":{"requests":{"cpu":"1500m","memory":"512Mi"},"limits":{"cpu":"2","memory":"1Gi"}},` +
		`"containers":[{"name":"c","image":"busybox:1","resources":{"requests":{"cpu":"100m","memory":"16Mi"}}}]}}`
	if got := apply("p", podLevel); got.Phase == apiv1.Failed {
		t.Fatalf("pod-level pod: %+v", got)
	}
	got := apply("q", podWithRequests("q", "600m", "1Mi"))
	want := "OutOfcpu: Pod default/q: Node didn't have enough resource: cpu, requested: 600, used: 1500, capacity: 2000"
	if got.Phase != apiv1.Failed || !strings.HasPrefix(got.Message, want) {
		t.Fatalf("after a pod-level request: %q, want prefix %q", got.Message, want)
	}
	limitsOnly := `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"l"},"spec":{"resources":{"limits":{"memory":"600Mi"}},` +
		`"containers":[{"name":"c","image":"busybox:1"}]}}`
	got = apply("l", limitsOnly)
	want = "OutOfmemory: Pod default/l: Node didn't have enough resource: memory, requested: 629145600, used: 536870912, capacity: 1073741824"
	if got.Phase != apiv1.Failed || !strings.HasPrefix(got.Message, want) {
		t.Fatalf("pod-level limits only: %q, want prefix %q", got.Message, want)
	}
	if names := storedPods(t, r.st); !slices.Equal(names, []string{"p"}) {
		t.Fatalf("stored %v", names)
	}
}

type fakePressure struct{ under bool }

func (f *fakePressure) Admit(*v1.Pod) (bool, string, string) {
	if f.under {
		return false, "Evicted", "The node had condition: [DiskPressure]. "
	}
	return true, "", ""
}

// Ephemeral-storage requests count against allocatable
// (OutOfephemeral-storage); under pressure a new pod is refused with the
// kubelet's reason and message, while a pod already running may be
// applied again.
func TestAdmissionEphemeralStorageAndPressure(t *testing.T) {
	r := newRig(t)
	pressure := &fakePressure{}
	r.in = New(Options{Topics: apiv1.Scheme{Prefix: "mqlet/v1", Node: "n1"}, MaxPayloadBytes: 1 << 20, Policy: validate.Policy{}, ApplyDeadline: time.Minute,
		Allocatable: v1.ResourceList{v1.ResourceEphemeralStorage: resource.MustParse("100Mi")}, Pressure: pressure},
		r.st, r.sender, r.track, r.sched, r.events, noStatus{}, zerolog.Nop())
	storagePod := func(name, req string) string {
		return `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"` + name + `"},"spec":{"containers":[{"name":"c","image":"busybox:1",` +
			`"resources":{"requests":{"ephemeral-storage":"` + req + `"}}}]}}`
	}
	apply := func(id, manifest string) apiv1.Reply {
		t.Helper()
		r.in.Handle(cmd("apply", id, manifest))
		return r.sender.last(id)
	}
	if got := apply("a", storagePod("a", "60Mi")); got.Phase == apiv1.Failed {
		t.Fatalf("first pod: %+v", got)
	}
	got := apply("b", storagePod("b", "50Mi"))
	want := "OutOfephemeral-storage: Pod default/b: Node didn't have enough resource: ephemeral-storage, requested: 52428800, used: 62914560, capacity: 104857600"
	if got.Phase != apiv1.Failed || !strings.HasPrefix(got.Message, want) {
		t.Fatalf("ephemeral-storage: %q, want prefix %q", got.Message, want)
	}
	pressure.under = true
	got = apply("c", admitPod("c", ""))
	if want := "Evicted: Pod default/c: The node had condition: [DiskPressure]. "; got.Phase != apiv1.Failed || !strings.HasPrefix(got.Message, want) {
		t.Fatalf("under pressure: %q, want prefix %q", got.Message, want)
	}
	if r.events.reasons[len(r.events.reasons)-1] != "Evicted" {
		t.Fatalf("events %v", r.events.reasons)
	}
	if got := apply("a2", storagePod("a", "40Mi")); got.Phase == apiv1.Failed {
		t.Fatalf("a running pod applied again under pressure: %+v", got)
	}
	if names := storedPods(t, r.st); !slices.Equal(names, []string{"a"}) {
		t.Fatalf("stored %v", names)
	}
}
