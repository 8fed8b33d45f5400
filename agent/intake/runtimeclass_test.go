package intake

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/mqlet/mqlet/agent/validate"
	apiv1 "github.com/mqlet/mqlet/api/v1"
	"github.com/mqlet/mqlet/internal/runtimeclass"
)

// A pod's runtimeClassName is admitted as the API server's RuntimeClass
// admission and the kubelet would: an unknown class refused naming it, the
// class's overhead set on the pod and counted with its requests, the
// class's nodeSelector matched against the node's labels.
func TestAdmissionRuntimeClasses(t *testing.T) {
	r := newRig(t)
	classes, err := runtimeclass.New([]runtimeclass.Class{
		{Name: "fast", Handler: "runc-b", Overhead: v1.ResourceList{v1.ResourceCPU: resource.MustParse("500m")}},
		{Name: "gpu", Handler: "runc-b", NodeSelector: map[string]string{"gpu": "yes"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	r.in = New(Options{Topics: apiv1.Scheme{Prefix: "mqlet/v1", Node: "n1"}, MaxPayloadBytes: 1 << 20, Policy: validate.Policy{}, ApplyDeadline: time.Minute,
		NodeLabels: map[string]string{"site": "a"}, RuntimeClasses: classes,
		Allocatable: v1.ResourceList{v1.ResourceCPU: resource.MustParse("2"), v1.ResourceMemory: resource.MustParse("1Gi")}},
		r.st, r.sender, r.track, r.sched, r.events, noStatus{}, zerolog.Nop())
	withClass := func(name, class, cpu string) string {
		return `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"` + name + `"},"spec":{"runtimeClassName":"` + class + `",` +
			`"containers":[{"name":"c","image":"busybox:1","resources":{"requests":{"cpu":"` + cpu + `"}}}]}}`
	}
	tests := []struct {
		name, manifest, want string
	}{
		{"unknown class", withClass("u", "kata", "100m"), `spec.runtimeClassName: Not found: "kata": RuntimeClass "kata" not found (known: fast, gpu)`},
		{"class nodeSelector not matched", withClass("g", "gpu", "100m"),
			`NodeAffinity: Pod default/g: Predicate NodeAffinity failed: node(s) didn't match the scheduling.nodeSelector of RuntimeClass "gpu"`},
		{"fits with its overhead", withClass("a", "fast", "1"), ""},
		{"overhead counted", withClass("b", "fast", "100m"),
			"OutOfcpu: Pod default/b: Node didn't have enough resource: cpu, requested: 600, used: 1500, capacity: 2000"},
		{"overhead other than the class's", `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"o"},"spec":{"runtimeClassName":"fast","overhead":{"cpu":"1m"},` +
			`"containers":[{"name":"c","image":"busybox:1"}]}}`, `spec.overhead: Invalid value`},
		{"overhead without a class", `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"n"},"spec":{"overhead":{"cpu":"1m"},` +
			`"containers":[{"name":"c","image":"busybox:1"}]}}`, `spec.overhead: Forbidden`},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id := "rc" + string(rune('a'+i))
			r.in.Handle(cmd("apply", id, tt.manifest))
			got := r.sender.last(id)
			if tt.want == "" {
				if got.Phase == apiv1.Failed {
					t.Fatalf("refused: %s", got.Message)
				}
				return
			}
			if got.Phase != apiv1.Failed || !strings.Contains(got.Message, tt.want) {
				t.Fatalf("reply %q, want failed with %q", got.Message, tt.want)
			}
		})
	}
	pods, err := r.st.ListPods()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range pods {
		names = append(names, p.Name)
		if p.Name == "a" && p.Spec.Overhead.Cpu().MilliValue() != 500 {
			t.Errorf("stored overhead %v, want the class's 500m", p.Spec.Overhead)
		}
	}
	if !slices.Equal(names, []string{"a"}) {
		t.Fatalf("stored %v", names)
	}
}
