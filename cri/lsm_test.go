package cri

import (
	"testing"

	v1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func TestAppArmorProfile(t *testing.T) {
	name := "my-profile"
	aa := func(t v1.AppArmorProfileType) *v1.AppArmorProfile { return &v1.AppArmorProfile{Type: t} }
	tests := []struct {
		name       string
		pod        *v1.AppArmorProfile
		container  *v1.AppArmorProfile
		annotation string
		want       *runtimeapi.SecurityProfile
		deprecated string
	}{
		{"none", nil, nil, "", nil, ""},
		{"pod Unconfined", aa(v1.AppArmorProfileTypeUnconfined), nil, "",
			&runtimeapi.SecurityProfile{ProfileType: runtimeapi.SecurityProfile_Unconfined}, "unconfined"},
		{"container over pod", aa(v1.AppArmorProfileTypeUnconfined), aa(v1.AppArmorProfileTypeRuntimeDefault), "",
			&runtimeapi.SecurityProfile{ProfileType: runtimeapi.SecurityProfile_RuntimeDefault}, "runtime/default"},
		{"annotation over pod", aa(v1.AppArmorProfileTypeRuntimeDefault), nil, "unconfined",
			&runtimeapi.SecurityProfile{ProfileType: runtimeapi.SecurityProfile_Unconfined}, "unconfined"},
		{"container over annotation", nil, aa(v1.AppArmorProfileTypeUnconfined), "runtime/default",
			&runtimeapi.SecurityProfile{ProfileType: runtimeapi.SecurityProfile_Unconfined}, "unconfined"},
		{"localhost annotation", nil, nil, "localhost/" + name,
			&runtimeapi.SecurityProfile{ProfileType: runtimeapi.SecurityProfile_Localhost, LocalhostRef: name}, "localhost/" + name},
		{"Localhost field", nil, &v1.AppArmorProfile{Type: v1.AppArmorProfileTypeLocalhost, LocalhostProfile: &name}, "",
			&runtimeapi.SecurityProfile{ProfileType: runtimeapi.SecurityProfile_Localhost, LocalhostRef: name}, "localhost/" + name},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pod := &v1.Pod{Spec: v1.PodSpec{SecurityContext: &v1.PodSecurityContext{AppArmorProfile: tt.pod}}}
			c := &v1.Container{Name: "c"}
			if tt.container != nil {
				c.SecurityContext = &v1.SecurityContext{AppArmorProfile: tt.container}
			}
			if tt.annotation != "" {
				pod.Annotations = map[string]string{v1.DeprecatedAppArmorBetaContainerAnnotationKeyPrefix + "c": tt.annotation}
			}
			got, dep := appArmorProfile(pod, c)
			if (got == nil) != (tt.want == nil) || got != nil && (got.ProfileType != tt.want.ProfileType || got.LocalhostRef != tt.want.LocalhostRef) {
				t.Errorf("profile = %v, want %v", got, tt.want)
			}
			if dep != tt.deprecated {
				t.Errorf("deprecated profile = %q, want %q", dep, tt.deprecated)
			}
		})
	}
}

func TestSELinuxOptions(t *testing.T) {
	pod := &v1.Pod{}
	if got := seLinuxOptions(pod, &v1.Container{}); got != nil {
		t.Fatalf("no options: got %v", got)
	}
	pod.Spec.SecurityContext = &v1.PodSecurityContext{SELinuxOptions: &v1.SELinuxOptions{User: "system_u", Level: "s0:c1"}}
	c := &v1.Container{SecurityContext: &v1.SecurityContext{SELinuxOptions: &v1.SELinuxOptions{Type: "container_t", Level: "s0:c2"}}}
	got := seLinuxOptions(pod, c)
	if got == nil || got.User != "system_u" || got.Type != "container_t" || got.Level != "s0:c2" || got.Role != "" {
		t.Errorf("merged = %v, want user system_u, type container_t, level s0:c2", got)
	}
}
