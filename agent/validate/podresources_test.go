package validate

import (
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// Pod-level resources are judged as the API server does with
// PodLevelResources on (containers' limits and requests must fit the
// pod's, pod requests ≤ limits, only supported resource names), and only
// cpu and memory are honoured: anything else is refused naming the field.
func TestPodLevelResourcesValidation(t *testing.T) {
	q := resource.MustParse
	tests := []struct {
		name   string
		mutate func(p *v1.Pod)
		want   string // "" accepted
	}{
		{"cpu and memory limits", func(p *v1.Pod) {
			p.Spec.Resources = &v1.ResourceRequirements{Limits: v1.ResourceList{v1.ResourceMemory: q("64Mi"), v1.ResourceCPU: q("500m")}}
		}, ""},
		{"requests and limits with containers inside", func(p *v1.Pod) {
			p.Spec.Resources = &v1.ResourceRequirements{
				Requests: v1.ResourceList{v1.ResourceMemory: q("32Mi"), v1.ResourceCPU: q("250m")},
				Limits:   v1.ResourceList{v1.ResourceMemory: q("64Mi"), v1.ResourceCPU: q("500m")}}
			p.Spec.Containers[0].Resources.Limits = v1.ResourceList{v1.ResourceMemory: q("64Mi")}
			p.Spec.Containers[0].Resources.Requests = v1.ResourceList{v1.ResourceMemory: q("16Mi")}
		}, ""},
		{"container limit above the pod's", func(p *v1.Pod) {
			p.Spec.Resources = &v1.ResourceRequirements{Limits: v1.ResourceList{v1.ResourceMemory: q("64Mi")}}
			p.Spec.Containers[0].Resources.Limits = v1.ResourceList{v1.ResourceMemory: q("128Mi")}
		}, "must be less than or equal to pod limits of 64Mi"},
		{"container requests above the pod's", func(p *v1.Pod) {
			p.Spec.Resources = &v1.ResourceRequirements{Requests: v1.ResourceList{v1.ResourceCPU: q("100m")}}
			p.Spec.Containers[0].Resources.Requests = v1.ResourceList{v1.ResourceCPU: q("200m")}
		}, "spec.resources.requests[cpu]: Invalid value: \"100m\": must be greater than or equal to aggregate container requests of 200m"},
		{"pod requests above its limits", func(p *v1.Pod) {
			p.Spec.Resources = &v1.ResourceRequirements{
				Requests: v1.ResourceList{v1.ResourceCPU: q("2")},
				Limits:   v1.ResourceList{v1.ResourceCPU: q("1")}}
		}, `spec.resources.requests: Invalid value: "2": must be less than or equal to cpu limit of 1`},
		{"hugepages", func(p *v1.Pod) {
			p.Spec.Resources = &v1.ResourceRequirements{Limits: v1.ResourceList{"hugepages-2Mi": q("4Mi"), v1.ResourceMemory: q("64Mi")}}
		}, "spec.resources.limits: Forbidden: mqlet enforces only cpu, memory and ephemeral-storage limits"},
		{"ephemeral-storage request", func(p *v1.Pod) {
			p.Spec.Resources = &v1.ResourceRequirements{Requests: v1.ResourceList{v1.ResourceEphemeralStorage: q("1Gi")}}
		}, "spec.resources.requests"},
		{"claims", func(p *v1.Pod) {
			p.Spec.Resources = &v1.ResourceRequirements{Claims: []v1.ResourceClaim{{Name: "x"}}}
		}, "spec.resources.claims: Forbidden"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pod := basePod()
			tt.mutate(pod)
			got := FormatErrors(ValidatePod(pod, node, Policy{Profile: ProfilePrivileged}))
			switch {
			case tt.want == "" && got != "":
				t.Errorf("refused: %s", got)
			case tt.want != "" && !strings.Contains(got, tt.want):
				t.Errorf("want %q in %q", tt.want, got)
			}
		})
	}
}

// Pod limits alone default the pod's requests, as the API server does on
// create, so admission and the pod cgroup's shares see them.
func TestDefaultPodFillsPodLevelRequests(t *testing.T) {
	pod := basePod()
	pod.Spec.Resources = &v1.ResourceRequirements{Limits: v1.ResourceList{v1.ResourceMemory: resource.MustParse("64Mi"), v1.ResourceCPU: resource.MustParse("500m")}}
	DefaultPod(pod)
	req := pod.Spec.Resources.Requests
	if cpu, mem := req[v1.ResourceCPU], req[v1.ResourceMemory]; cpu.String() != "500m" || mem.String() != "64Mi" {
		t.Fatalf("defaulted requests %v", req)
	}
	plain := basePod()
	DefaultPod(plain)
	if plain.Spec.Resources != nil {
		t.Fatalf("a pod without pod-level resources got %v", plain.Spec.Resources)
	}
}
