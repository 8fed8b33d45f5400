package validate

import (
	"strings"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// HostSecurity is which Linux security modules the node enforces.
type HostSecurity struct {
	AppArmor bool // AppArmor is enabled in the kernel
	SELinux  bool // SELinux is enabled (enforcing or permissive)
}

// The kubelet's words for a pod that needs AppArmor on a host without it.
const noAppArmor = "Cannot enforce AppArmor: AppArmor is not enabled on the host"

const noSELinux = "Cannot apply SELinux options: SELinux is not enabled on the host"

// checkSecurityModules refuses, as the kubelet does at admission, a pod
// asking for an AppArmor profile other than Unconfined (by field or by the
// legacy container annotation) when the host has no AppArmor, and, since
// no label would apply, seLinuxOptions when the host has no SELinux. What
// a pod may ask for at all (Unconfined is not baseline) is the Pod
// Security Standards' part.
func checkSecurityModules(meta *metav1.ObjectMeta, spec *v1.PodSpec, host HostSecurity) field.ErrorList {
	var errs field.ErrorList
	podSC := field.NewPath("spec", "securityContext")
	needsAppArmor := func(p *v1.AppArmorProfile) bool {
		return p != nil && p.Type != v1.AppArmorProfileTypeUnconfined
	}
	if sc := spec.SecurityContext; sc != nil {
		if !host.AppArmor && needsAppArmor(sc.AppArmorProfile) {
			errs = append(errs, field.Forbidden(podSC.Child("appArmorProfile", "type"), noAppArmor))
		}
		if !host.SELinux && sc.SELinuxOptions != nil {
			errs = append(errs, field.Forbidden(podSC.Child("seLinuxOptions"), noSELinux))
		}
	}
	names := map[string]bool{}
	visitContainers(spec, func(p *field.Path, c *v1.Container) {
		names[c.Name] = true
		sc := c.SecurityContext
		if sc == nil {
			return
		}
		if !host.AppArmor && needsAppArmor(sc.AppArmorProfile) {
			errs = append(errs, field.Forbidden(p.Child("securityContext", "appArmorProfile", "type"), noAppArmor))
		}
		if !host.SELinux && sc.SELinuxOptions != nil {
			errs = append(errs, field.Forbidden(p.Child("securityContext", "seLinuxOptions"), noSELinux))
		}
	})
	annotations := field.NewPath("metadata", "annotations")
	for _, k := range sortedKeys(meta.Annotations) {
		container, ok := strings.CutPrefix(k, v1.DeprecatedAppArmorBetaContainerAnnotationKeyPrefix)
		if !ok {
			continue
		}
		v := meta.Annotations[k]
		switch {
		case !names[container]:
			errs = append(errs, field.Invalid(annotations.Key(k), container, "the pod has no container of that name"))
		case v == v1.DeprecatedAppArmorBetaProfileNameUnconfined:
		case v != v1.DeprecatedAppArmorBetaProfileRuntimeDefault && !strings.HasPrefix(v, v1.DeprecatedAppArmorBetaProfileNamePrefix):
			errs = append(errs, field.Invalid(annotations.Key(k), v, "not an AppArmor profile (runtime/default, localhost/<name> or unconfined)"))
		case v == v1.DeprecatedAppArmorBetaProfileNamePrefix:
			errs = append(errs, field.Invalid(annotations.Key(k), v, "a localhost profile needs a name"))
		case !host.AppArmor:
			errs = append(errs, field.Forbidden(annotations.Key(k), noAppArmor))
		}
	}
	return errs
}
