package validate

import (
	"fmt"
	"reflect"
	"strings"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/component-helpers/node/util/sysctl"
)

// checkNode rejects, at every profile including privileged, the values of
// honoured fields that this node would not honour or that would change the
// host rather than the pod (fields never honoured are the support table's:
// see CheckSupport): pods for another OS, user
// namespaces (hostUsers: false), sysctls that are not namespaced
// (or whose namespace the pod shares with the host), and Localhost seccomp
// profiles (mqlet installs none).
func checkNode(meta *metav1.ObjectMeta, spec *v1.PodSpec, host HostSecurity) field.ErrorList {
	errs := checkSecurityModules(meta, spec, host)
	specPath := field.NewPath("spec")
	// A Windows pod would run here as a Linux one, and the Pod Security
	// Standards skip the Linux-only restricted controls for it
	// (allowPrivilegeEscalation, capabilities drop ALL, seccomp): the
	// kubelet refuses a pod for another OS (PodOSNotSupported), so does mqlet.
	if spec.OS != nil && spec.OS.Name != v1.Linux {
		errs = append(errs, field.Forbidden(specPath.Child("os", "name"),
			fmt.Sprintf("this node runs %s pods only (PodOSNotSupported)", v1.Linux)))
	}
	// The runtime makes no user namespace (containerd 1.6's CRI has none),
	// so hostUsers: false would run the pod with the host's uids while the
	// Pod Security Standards relax runAsNonRoot, runAsUser and procMount
	// for it: an Unmasked /proc as real root, a writable core_pattern.
	if spec.HostUsers != nil && !*spec.HostUsers {
		errs = append(errs, field.Forbidden(specPath.Child("hostUsers"),
			"mqlet does not run pods in user namespaces; hostUsers: false would not be honoured"))
	}
	podSC := specPath.Child("securityContext")
	if sc := spec.SecurityContext; sc != nil {
		for i, s := range sc.Sysctls {
			if why := hostSysctl(s.Name, spec); why != "" {
				errs = append(errs, field.Forbidden(podSC.Child("sysctls").Index(i).Child("name"), why))
			}
		}
		errs = append(errs, localhostProfiles(podSC, sc.SeccompProfile)...)
	}
	visitContainers(spec, func(p *field.Path, c *v1.Container) {
		if sc := c.SecurityContext; sc != nil {
			errs = append(errs, localhostProfiles(p.Child("securityContext"), sc.SeccompProfile)...)
		}
		// The runtime (containerd 1.6, runc 1.1) makes only the mount
		// itself read-only: what is mounted below it would stay writable
		// while the pod asked for it all read-only.
		for i, vm := range c.VolumeMounts {
			if vm.RecursiveReadOnly != nil && *vm.RecursiveReadOnly == v1.RecursiveReadOnlyEnabled {
				errs = append(errs, field.Forbidden(p.Child("volumeMounts").Index(i).Child("recursiveReadOnly"),
					"mqlet's runtime cannot make a mount recursively read-only; use IfPossible or Disabled"))
			}
		}
	})
	for _, k := range sortedKeys(meta.Annotations) {
		v := meta.Annotations[k]
		profileAnnotation := k == v1.SeccompPodAnnotationKey || strings.HasPrefix(k, v1.SeccompContainerAnnotationKeyPrefix)
		if profileAnnotation && strings.HasPrefix(v, "localhost/") {
			errs = append(errs, field.Forbidden(field.NewPath("metadata", "annotations").Key(k), "mqlet does not support localhost profiles"))
		}
	}
	return errs
}

// localhostProfiles refuses a Localhost seccomp profile (AppArmor profiles
// are checkSecurityModules').
func localhostProfiles(scPath *field.Path, seccomp *v1.SeccompProfile) field.ErrorList {
	var errs field.ErrorList
	if seccomp != nil && seccomp.Type == v1.SeccompProfileTypeLocalhost {
		errs = append(errs, field.Forbidden(scPath.Child("seccompProfile", "type"), "mqlet does not support Localhost seccomp profiles"))
	}
	return errs
}

// hostSysctl says why setting the sysctl would change the host (the kubelet
// would otherwise fail the pod's sandbox on every retry), or "" if it stays
// inside the pod: only network, IPC and UTS sysctls are per pod, and only
// while the pod has its own namespace of that kind.
func hostSysctl(name string, spec *v1.PodSpec) string {
	ns, _, _ := sysctl.GetNamespace(name)
	switch {
	case ns == sysctl.NetNamespace && spec.HostNetwork:
		return fmt.Sprintf("sysctl %q would change the host: the pod uses the host's network namespace", name)
	case ns == sysctl.UTSNamespace && spec.HostNetwork:
		return fmt.Sprintf("sysctl %q would change the host: the pod uses the host's UTS namespace", name)
	case ns == sysctl.IPCNamespace && spec.HostIPC:
		return fmt.Sprintf("sysctl %q would change the host: the pod uses the host's IPC namespace", name)
	case ns == sysctl.NetNamespace, ns == sysctl.UTSNamespace, ns == sysctl.IPCNamespace:
		return ""
	}
	return fmt.Sprintf("sysctl %q is not isolated per pod: setting it would change the host", name)
}

// volumeType is the JSON name of the source a volume sets ("emptyDir",
// "nfs", ...), or "" if it sets none.
func volumeType(vs *v1.VolumeSource) string {
	rv := reflect.ValueOf(vs).Elem()
	for i := 0; i < rv.NumField(); i++ {
		if f := rv.Field(i); f.Kind() == reflect.Pointer && !f.IsNil() {
			name, _, _ := strings.Cut(rv.Type().Field(i).Tag.Get("json"), ",")
			return name
		}
	}
	return ""
}
