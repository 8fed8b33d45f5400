package validate

import (
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
)

// The kubelet's AppArmor and SELinux admission, with the host's security
// modules given: what the host cannot enforce is refused naming the
// field, what it can (and Unconfined, always) is accepted.
func TestSecurityModulesByHost(t *testing.T) {
	const annotation = v1.DeprecatedAppArmorBetaContainerAnnotationKeyPrefix + "nginx"
	withAnnotation := func(v string) func(*v1.Pod) {
		return func(p *v1.Pod) { p.Annotations = map[string]string{annotation: v} }
	}
	containerAA := func(t v1.AppArmorProfileType, name string) func(*v1.Pod) {
		return func(p *v1.Pod) {
			sc(p).AppArmorProfile = &v1.AppArmorProfile{Type: t}
			if name != "" {
				sc(p).AppArmorProfile.LocalhostProfile = &name
			}
		}
	}
	none := HostSecurity{}
	both := HostSecurity{AppArmor: true, SELinux: true}
	tests := []struct {
		name    string
		host    HostSecurity
		mutate  func(*v1.Pod)
		field   string // "" : accepted
		message string
	}{
		{"Unconfined without AppArmor", none, containerAA(v1.AppArmorProfileTypeUnconfined, ""), "", ""},
		{"pod Unconfined without AppArmor", none, func(p *v1.Pod) {
			podSC(p).AppArmorProfile = &v1.AppArmorProfile{Type: v1.AppArmorProfileTypeUnconfined}
		}, "", ""},
		{"unconfined annotation without AppArmor", none, withAnnotation("unconfined"), "", ""},
		{"RuntimeDefault without AppArmor", none, containerAA(v1.AppArmorProfileTypeRuntimeDefault, ""),
			"spec.containers[0].securityContext.appArmorProfile.type", noAppArmor},
		{"Localhost without AppArmor", none, containerAA(v1.AppArmorProfileTypeLocalhost, "p"),
			"spec.containers[0].securityContext.appArmorProfile.type", noAppArmor},
		{"runtime/default annotation without AppArmor", none, withAnnotation("runtime/default"),
			"metadata.annotations[" + annotation + "]", noAppArmor},
		{"init container RuntimeDefault without AppArmor", none, func(p *v1.Pod) {
			p.Spec.InitContainers = []v1.Container{{Name: "init", Image: "busybox:1.36",
				SecurityContext: &v1.SecurityContext{AppArmorProfile: &v1.AppArmorProfile{Type: v1.AppArmorProfileTypeRuntimeDefault}}}}
		}, "spec.initContainers[0].securityContext.appArmorProfile.type", noAppArmor},
		{"RuntimeDefault with AppArmor", both, containerAA(v1.AppArmorProfileTypeRuntimeDefault, ""), "", ""},
		{"Localhost with AppArmor", both, containerAA(v1.AppArmorProfileTypeLocalhost, "p"), "", ""},
		{"localhost annotation with AppArmor", both, withAnnotation("localhost/p"), "", ""},
		{"runtime/default annotation with AppArmor", both, withAnnotation("runtime/default"), "", ""},
		{"seLinuxOptions without SELinux", none, func(p *v1.Pod) { sc(p).SELinuxOptions = &v1.SELinuxOptions{Level: "s0:c1,c2"} },
			"spec.containers[0].securityContext.seLinuxOptions", noSELinux},
		{"seLinuxOptions with SELinux", both, func(p *v1.Pod) {
			podSC(p).SELinuxOptions = &v1.SELinuxOptions{Type: "container_t", Level: "s0:c1,c2"}
		}, "", ""},
		{"AppArmor alone does not give SELinux", HostSecurity{AppArmor: true}, func(p *v1.Pod) {
			sc(p).SELinuxOptions = &v1.SELinuxOptions{Level: "s0"}
		}, "spec.containers[0].securityContext.seLinuxOptions", noSELinux},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pod := basePod()
			tt.mutate(pod)
			errs := ValidatePod(pod, node, Policy{Profile: ProfilePrivileged, Host: tt.host})
			if tt.field == "" {
				if len(errs) != 0 {
					t.Fatalf("refused: %s", FormatErrors(errs))
				}
				return
			}
			for _, e := range errs {
				if e.Field == tt.field && strings.Contains(e.Detail, tt.message) {
					return
				}
			}
			t.Errorf("no error on %s saying %q: %s", tt.field, tt.message, FormatErrors(errs))
		})
	}
}

// The host check comes after the Pod Security Standards, not instead:
// baseline still refuses Unconfined, on any host.
func TestSecurityModulesKeepPodSecurity(t *testing.T) {
	pod := basePod()
	sc(pod).AppArmorProfile = &v1.AppArmorProfile{Type: v1.AppArmorProfileTypeUnconfined}
	errs := ValidatePod(pod, node, Policy{Profile: ProfileBaseline, Host: HostSecurity{AppArmor: true}})
	if got := FormatErrors(errs); !strings.Contains(got, "forbidden AppArmor profile") {
		t.Errorf("baseline accepted Unconfined: %q", got)
	}
	// And baseline accepts RuntimeDefault where the host can enforce it.
	pod = basePod()
	sc(pod).AppArmorProfile = &v1.AppArmorProfile{Type: v1.AppArmorProfileTypeRuntimeDefault}
	if errs := ValidatePod(pod, node, Policy{Profile: ProfileBaseline, Host: HostSecurity{AppArmor: true}}); len(errs) != 0 {
		t.Errorf("RuntimeDefault refused on an AppArmor host: %s", FormatErrors(errs))
	}
}
