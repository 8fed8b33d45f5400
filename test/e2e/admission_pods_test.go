package e2e

import (
	"encoding/json"
	apiv1 "github.com/mqlet/mqlet/api/v1"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// admitTestPod is a busybox pod of the env's namespace that sleeps.
func (e *podEnv) admitTestPod(name string) *v1.Pod {
	p := admissionPod(name, e.ns, false)
	p.Spec.TerminationGracePeriodSeconds = ptrTo(int64(1))
	return p
}

// waitWarning waits for a Warning event with reason about pod name.
func (e *podEnv) waitWarning(name, reason string, timeout time.Duration) {
	e.t.Helper()
	e.mq.WaitFor(0, timeout, reason+" event for "+name, func(m Msg) bool {
		var ev v1.Event
		return m.Topic == prefix+"/"+e.node+"/events" && json.Unmarshal(m.Payload, &ev) == nil &&
			ev.Reason == reason && ev.InvolvedObject.Name == name && ev.Type == v1.EventTypeWarning
	})
}

// TestAdmissionNodeAffinity: the node is published with its configured
// labels and the well-known ones; a pod whose nodeSelector does not match
// them is answered failed with the kubelet's reason NodeAffinity (and
// event) and never reaches containerd, one whose required node affinity
// matches runs, one requesting more cpu than the node has is OutOfcpu.
func TestAdmissionNodeAffinity(t *testing.T) {
	e := newPodEnv(t, "nodeLabels: {site: plant-3, example.com/tier: edge}\n")
	e.waitNode(0, 90*time.Second, "with its labels", func(n *v1.Node) bool {
		return n.Labels["site"] == "plant-3" && n.Labels["example.com/tier"] == "edge" &&
			n.Labels[v1.LabelHostname] == e.node && n.Labels[v1.LabelOSStable] == "linux" && n.Labels[v1.LabelArchStable] != ""
	})

	far := e.admitTestPod("far")
	far.Spec.NodeSelector = map[string]string{"site": "plant-9"}
	start := time.Now()
	r := e.apply(podJSON(t, far), apiv1.Failed, 30*time.Second)
	t.Logf("non-matching nodeSelector answered failed in %v", time.Since(start))
	want := "NodeAffinity: Pod " + e.ns + "/far: Predicate NodeAffinity failed: node(s) didn't match Pod's node affinity/selector"
	if !strings.HasPrefix(r.Message, want) {
		t.Errorf("failed reply %q, want prefix %q", r.Message, want)
	}
	e.waitWarning("far", "NodeAffinity", 30*time.Second)

	e.cleanupPods("near")
	near := e.admitTestPod("near")
	near.Spec.NodeSelector = map[string]string{"site": "plant-3"}
	near.Spec.Affinity = &v1.Affinity{NodeAffinity: &v1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &v1.NodeSelector{
		NodeSelectorTerms: []v1.NodeSelectorTerm{{MatchExpressions: []v1.NodeSelectorRequirement{
			{Key: "example.com/tier", Operator: v1.NodeSelectorOpIn, Values: []string{"core", "edge"}},
			{Key: v1.LabelHostname, Operator: v1.NodeSelectorOpIn, Values: []string{e.node}}}}}}}}
	e.apply(podJSON(t, near), apiv1.Succeeded, 120*time.Second)
	e.waitStatus("near", 60*time.Second, "running", func(p *v1.Pod) bool { return p.Status.Phase == v1.PodRunning })
	if got := e.cri.Containers(e.ns, "far"); len(got) != 0 {
		t.Errorf("the refused pod has %d containers in containerd", len(got))
	}

	// Requests beyond the node's allocatable: OutOfcpu, as the kubelet says it.
	huge := e.admitTestPod("huge")
	huge.Spec.Containers[0].Resources.Requests = v1.ResourceList{v1.ResourceCPU: resource.MustParse("1000")}
	r = e.apply(podJSON(t, huge), apiv1.Failed, 30*time.Second)
	if want := "OutOfcpu: Pod " + e.ns + "/huge: Node didn't have enough resource: cpu, requested: 1000000, used: 0, capacity: "; !strings.HasPrefix(r.Message, want) {
		t.Errorf("failed reply %q, want prefix %q", r.Message, want)
	}
	e.waitWarning("huge", "OutOfcpu", 30*time.Second)
}

// TestAdmissionUnsupportedFieldAnsweredAtOnce: a manifest using a field
// mqlet does not honour is answered failed naming the field within seconds
// (not at the apply deadline), and nothing of it reaches containerd.
func TestAdmissionUnsupportedFieldAnsweredAtOnce(t *testing.T) {
	e := newPodEnv(t, "")
	tests := []struct {
		name   string
		mutate func(*v1.Pod)
		want   string
	}{
		{"token", func(p *v1.Pod) {
			p.Spec.Volumes = []v1.Volume{{Name: "token", VolumeSource: v1.VolumeSource{Projected: &v1.ProjectedVolumeSource{
				Sources: []v1.VolumeProjection{{ServiceAccountToken: &v1.ServiceAccountTokenProjection{Path: "token", ExpirationSeconds: ptrTo(int64(3600))}}}}}}}
			p.Spec.Containers[0].VolumeMounts = []v1.VolumeMount{{Name: "token", MountPath: "/var/run/secrets/tokens"}}
		}, "spec.volumes[0].projected.sources[0].serviceAccountToken: Forbidden: mqlet does not support serviceAccountToken projections"},
		{"debug", func(p *v1.Pod) {
			p.Spec.EphemeralContainers = []v1.EphemeralContainer{{EphemeralContainerCommon: v1.EphemeralContainerCommon{
				Name: "debug", Image: "docker.io/mqlet/busybox:test", ImagePullPolicy: v1.PullNever}}}
		}, "spec.ephemeralContainers: Forbidden: mqlet does not support ephemeral containers"},
		{"share", func(p *v1.Pod) {
			p.Spec.Volumes = []v1.Volume{{Name: "share", VolumeSource: v1.VolumeSource{NFS: &v1.NFSVolumeSource{Server: "nas.example", Path: "/export"}}}}
			p.Spec.Containers[0].VolumeMounts = []v1.VolumeMount{{Name: "share", MountPath: "/share"}}
		}, "spec.volumes[0].nfs: Forbidden: mqlet does not support nfs volumes"},
		{"csi", func(p *v1.Pod) {
			p.Spec.Volumes = []v1.Volume{{Name: "csi", VolumeSource: v1.VolumeSource{CSI: &v1.CSIVolumeSource{Driver: "csi.example"}}}}
			p.Spec.Containers[0].VolumeMounts = []v1.VolumeMount{{Name: "csi", MountPath: "/csi"}}
		}, "spec.volumes[0].csi: Forbidden: mqlet does not support csi volumes"},
	}
	for _, tt := range tests {
		p := e.admitTestPod(tt.name)
		tt.mutate(p)
		start := time.Now()
		r := e.apply(podJSON(t, p), apiv1.Failed, 30*time.Second)
		took := time.Since(start)
		t.Logf("%s: answered failed in %v", tt.name, took)
		if !strings.Contains(r.Message, tt.want) {
			t.Errorf("%s: failed reply %q lacks %q", tt.name, r.Message, tt.want)
		}
		// The apply deadline is minutes; validation answers within seconds
		// even on a loaded machine.
		if took > 15*time.Second {
			t.Errorf("%s: answered after %v", tt.name, took)
		}
		if got := e.cri.Containers(e.ns, tt.name); len(got) != 0 {
			t.Errorf("%s: %d containers in containerd", tt.name, len(got))
		}
	}
}
