package cri

import (
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// A change of pod-level resources needs a new sandbox (they are written to
// the pod cgroup before it runs); a pod without them hashes as before.
func TestHashSandboxCoversPodLevelResources(t *testing.T) {
	pod := &v1.Pod{Spec: v1.PodSpec{Containers: []v1.Container{{Name: "c"}}}}
	const withoutResources = "the hash of a pod without pod-level resources"
	plain := HashSandbox(pod)
	if plain != hashJSON(sandboxSpec{}) {
		t.Fatalf("%s changed: %s", withoutResources, plain)
	}
	limited := pod.DeepCopy()
	limited.Spec.Resources = &v1.ResourceRequirements{Limits: v1.ResourceList{v1.ResourceMemory: resource.MustParse("64Mi")}}
	more := limited.DeepCopy()
	more.Spec.Resources.Limits[v1.ResourceMemory] = resource.MustParse("128Mi")
	if a, b := HashSandbox(limited), HashSandbox(more); a == plain || a == b {
		t.Errorf("pod-level resources do not change the sandbox hash: none %s, 64Mi %s, 128Mi %s", plain, a, b)
	}
}
