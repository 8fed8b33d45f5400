package cri

import (
	"strings"

	v1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// appArmorProfile is the container's AppArmor profile as the kubelet
// finds it: its securityContext's, else its legacy annotation's, else the
// pod's; nil (the runtime's default) when none is asked. The deprecated
// string form is returned beside it, as the kubelet sends both. Admission
// refused any profile but Unconfined on a host without AppArmor.
func appArmorProfile(pod *v1.Pod, c *v1.Container) (*runtimeapi.SecurityProfile, string) {
	var p *v1.AppArmorProfile
	if c.SecurityContext != nil && c.SecurityContext.AppArmorProfile != nil {
		p = c.SecurityContext.AppArmorProfile
	} else if v, ok := pod.Annotations[v1.DeprecatedAppArmorBetaContainerAnnotationKeyPrefix+c.Name]; ok {
		switch {
		case v == v1.DeprecatedAppArmorBetaProfileRuntimeDefault:
			p = &v1.AppArmorProfile{Type: v1.AppArmorProfileTypeRuntimeDefault}
		case v == v1.DeprecatedAppArmorBetaProfileNameUnconfined:
			p = &v1.AppArmorProfile{Type: v1.AppArmorProfileTypeUnconfined}
		case strings.HasPrefix(v, v1.DeprecatedAppArmorBetaProfileNamePrefix):
			name := strings.TrimPrefix(v, v1.DeprecatedAppArmorBetaProfileNamePrefix)
			p = &v1.AppArmorProfile{Type: v1.AppArmorProfileTypeLocalhost, LocalhostProfile: &name}
		}
	} else if pod.Spec.SecurityContext != nil {
		p = pod.Spec.SecurityContext.AppArmorProfile
	}
	if p == nil {
		return nil, ""
	}
	switch p.Type {
	case v1.AppArmorProfileTypeRuntimeDefault:
		return &runtimeapi.SecurityProfile{ProfileType: runtimeapi.SecurityProfile_RuntimeDefault}, v1.DeprecatedAppArmorBetaProfileRuntimeDefault
	case v1.AppArmorProfileTypeUnconfined:
		return &runtimeapi.SecurityProfile{ProfileType: runtimeapi.SecurityProfile_Unconfined}, v1.DeprecatedAppArmorBetaProfileNameUnconfined
	case v1.AppArmorProfileTypeLocalhost:
		name := ""
		if p.LocalhostProfile != nil {
			name = *p.LocalhostProfile
		}
		return &runtimeapi.SecurityProfile{ProfileType: runtimeapi.SecurityProfile_Localhost, LocalhostRef: name},
			v1.DeprecatedAppArmorBetaProfileNamePrefix + name
	}
	return nil, ""
}

// seLinuxOptions is the container's SELinux label, field by field over the
// pod's (the kubelet's merge); nil when neither sets one. Admission refused
// options on a host without SELinux.
func seLinuxOptions(pod *v1.Pod, c *v1.Container) *runtimeapi.SELinuxOption {
	var out runtimeapi.SELinuxOption
	set := false
	for _, o := range []*v1.SELinuxOptions{podSELinux(pod), containerSELinux(c)} {
		if o == nil {
			continue
		}
		set = true
		if o.User != "" {
			out.User = o.User
		}
		if o.Role != "" {
			out.Role = o.Role
		}
		if o.Type != "" {
			out.Type = o.Type
		}
		if o.Level != "" {
			out.Level = o.Level
		}
	}
	if !set {
		return nil
	}
	return &out
}

func podSELinux(pod *v1.Pod) *v1.SELinuxOptions {
	if pod.Spec.SecurityContext == nil {
		return nil
	}
	return pod.Spec.SecurityContext.SELinuxOptions
}

func containerSELinux(c *v1.Container) *v1.SELinuxOptions {
	if c.SecurityContext == nil {
		return nil
	}
	return c.SecurityContext.SELinuxOptions
}
