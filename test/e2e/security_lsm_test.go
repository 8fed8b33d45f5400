package e2e

import (
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	apiv1 "github.com/mqlet/mqlet/api/v1"
	"github.com/mqlet/mqlet/internal/lsm"
)

// TestAppArmorKubeletWay: as the kubelet does, an Unconfined AppArmor
// profile (field or legacy annotation) runs on any host, and a profile the
// host cannot enforce is refused at once naming the field with the
// kubelet's reason; seLinuxOptions likewise without SELinux. Where the
// host has AppArmor (not these machines), RuntimeDefault runs instead.
func TestAppArmorKubeletWay(t *testing.T) {
	host := lsm.Host{Sysfs: "/sys"}
	e := newPodEnv(t, "admission:\n  profile: privileged\n")
	e.cleanupPods("aa-unconfined", "aa-annotation")

	p := admissionPod("aa-unconfined", e.ns, false)
	csc(p).AppArmorProfile = &v1.AppArmorProfile{Type: v1.AppArmorProfileTypeUnconfined}
	e.apply(podJSON(t, p), apiv1.Succeeded, podReadyTimeout)
	e.waitStatus("aa-unconfined", podReadyTimeout, "running", func(p *v1.Pod) bool {
		cs, ok := containerStatus(p, "c", false)
		return ok && cs.State.Running != nil
	})

	p = admissionPod("aa-annotation", e.ns, false)
	p.Annotations = map[string]string{v1.DeprecatedAppArmorBetaContainerAnnotationKeyPrefix + "c": "unconfined"}
	e.apply(podJSON(t, p), apiv1.Succeeded, podReadyTimeout)

	refused := func(name string, mutate func(*v1.Pod), field, reason string) {
		t.Helper()
		p := admissionPod(name, e.ns, false)
		mutate(p)
		id := e.nextID("apply")
		begin := time.Now()
		e.mq.Command(e.node, "apply", id, podJSON(t, p))
		r := e.waitFinalAny(id, 20*time.Second)
		if r.Phase != apiv1.Failed || !strings.Contains(r.Message, field+": Forbidden: "+reason) {
			t.Errorf("%s: reply %s %q, want failed naming %s with %q", name, r.Phase, r.Message, field, reason)
		}
		if d := time.Since(begin); d > 10*time.Second {
			t.Errorf("%s: refused after %v, want at once", name, d)
		}
		if n := len(e.cri.Sandboxes(e.ns, name)); n != 0 {
			t.Errorf("%s: %d sandboxes in the runtime for a refused pod", name, n)
		}
	}
	const noAppArmor = "Cannot enforce AppArmor: AppArmor is not enabled on the host"
	if !host.AppArmorEnabled() {
		refused("aa-default", func(p *v1.Pod) {
			csc(p).AppArmorProfile = &v1.AppArmorProfile{Type: v1.AppArmorProfileTypeRuntimeDefault}
		}, "spec.containers[0].securityContext.appArmorProfile.type", noAppArmor)
		refused("aa-pod-localhost", func(p *v1.Pod) {
			p.Spec.SecurityContext = &v1.PodSecurityContext{AppArmorProfile: &v1.AppArmorProfile{
				Type: v1.AppArmorProfileTypeLocalhost, LocalhostProfile: ptrTo("my-profile")}}
		}, "spec.securityContext.appArmorProfile.type", noAppArmor)
		refused("aa-annotation-default", func(p *v1.Pod) {
			p.Annotations = map[string]string{v1.DeprecatedAppArmorBetaContainerAnnotationKeyPrefix + "c": "runtime/default"}
		}, "metadata.annotations[container.apparmor.security.beta.kubernetes.io/c]", noAppArmor)
	} else {
		e.cleanupPods("aa-default")
		p = admissionPod("aa-default", e.ns, false)
		csc(p).AppArmorProfile = &v1.AppArmorProfile{Type: v1.AppArmorProfileTypeRuntimeDefault}
		e.apply(podJSON(t, p), apiv1.Succeeded, podReadyTimeout)
	}
	if !host.SELinuxEnabled() {
		refused("se-level", func(p *v1.Pod) { csc(p).SELinuxOptions = &v1.SELinuxOptions{Level: "s0:c1,c2"} },
			"spec.containers[0].securityContext.seLinuxOptions", "Cannot apply SELinux options: SELinux is not enabled on the host")
	}
}
