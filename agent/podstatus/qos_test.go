package podstatus

import (
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// The QoS class of a pod with pod-level resources comes from them, as the
// kubelet computes it: containers without resources under pod requests
// equal to pod limits are Guaranteed; pod requests below the limits are
// Burstable.
func TestQOSClassFromPodLevelResources(t *testing.T) {
	rs := rsOf(nil)
	list := v1.ResourceList{v1.ResourceCPU: resource.MustParse("500m"), v1.ResourceMemory: resource.MustParse("64Mi")}
	pod := newPod(v1.RestartPolicyAlways, "a", "b")
	pod.Spec.Resources = &v1.ResourceRequirements{Requests: list, Limits: list}
	if s := Build(pod, rs, Hints{}, at(0)); s.QOSClass != v1.PodQOSGuaranteed {
		t.Errorf("pod requests = limits: %q, want Guaranteed", s.QOSClass)
	}
	pod.Spec.Resources = &v1.ResourceRequirements{Requests: v1.ResourceList{v1.ResourceCPU: resource.MustParse("100m")}, Limits: list}
	if s := Build(pod, rs, Hints{}, at(0)); s.QOSClass != v1.PodQOSBurstable {
		t.Errorf("pod requests below limits: %q, want Burstable", s.QOSClass)
	}
}
