package validate

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/pod-security-admission/api"
	"k8s.io/pod-security-admission/policy"
)

// restrictedPod passes PSS restricted: non-root, seccomp RuntimeDefault,
// no privilege escalation, all capabilities dropped.
func restrictedPod() *v1.Pod {
	p := basePod()
	p.Spec.SecurityContext = &v1.PodSecurityContext{
		RunAsNonRoot:   ptr(true),
		SeccompProfile: &v1.SeccompProfile{Type: v1.SeccompProfileTypeRuntimeDefault},
	}
	p.Spec.Containers[0].SecurityContext = &v1.SecurityContext{
		AllowPrivilegeEscalation: ptr(false),
		Capabilities:             &v1.Capabilities{Drop: []v1.Capability{"ALL"}},
	}
	return p
}

func sc(p *v1.Pod) *v1.SecurityContext {
	if p.Spec.Containers[0].SecurityContext == nil {
		p.Spec.Containers[0].SecurityContext = &v1.SecurityContext{}
	}
	return p.Spec.Containers[0].SecurityContext
}

func podSC(p *v1.Pod) *v1.PodSecurityContext {
	if p.Spec.SecurityContext == nil {
		p.Spec.SecurityContext = &v1.PodSecurityContext{}
	}
	return p.Spec.SecurityContext
}

type control struct {
	name    string
	mutate  func(*v1.Pod)
	field   string // the field path the finding must carry
	control string // the control's name in the message
}

// baselineControls are violations PSS baseline (and so restricted) forbids.
var baselineControls = []control{
	{"hostNetwork", func(p *v1.Pod) { p.Spec.HostNetwork = true }, "spec.hostNetwork", "host namespaces (hostNetwork=true)"},
	{"hostPID", func(p *v1.Pod) { p.Spec.HostPID = true }, "spec.hostPID", "host namespaces (hostPID=true)"},
	{"hostIPC", func(p *v1.Pod) { p.Spec.HostIPC = true }, "spec.hostIPC", "host namespaces (hostIPC=true)"},
	{"privileged", func(p *v1.Pod) { sc(p).Privileged = ptr(true); sc(p).AllowPrivilegeEscalation = nil },
		"spec.containers[0].securityContext.privileged", `privileged (container "nginx" must not set securityContext.privileged=true)`},
	{"capabilities", func(p *v1.Pod) {
		if sc(p).Capabilities == nil {
			sc(p).Capabilities = &v1.Capabilities{}
		}
		sc(p).Capabilities.Add = []v1.Capability{"SYS_ADMIN"}
	}, "spec.containers[0].securityContext.capabilities.add[0]", `"SYS_ADMIN"`},
	{"hostPath", func(p *v1.Pod) { p.Spec.Volumes = []v1.Volume{hostPathVolume("/etc")} },
		"spec.volumes[0].hostPath.path", `volume "host"`}, // restricted words it as a restricted volume type
	{"hostPort", func(p *v1.Pod) { p.Spec.Containers[0].Ports = []v1.ContainerPort{{ContainerPort: 80, HostPort: 8080}} },
		"spec.containers[0].ports[0].hostPort", `hostPort (container "nginx" uses hostPort 8080)`},
	{"appArmor", func(p *v1.Pod) { sc(p).AppArmorProfile = &v1.AppArmorProfile{Type: v1.AppArmorProfileTypeUnconfined} },
		"spec.containers[0].securityContext.appArmorProfile.type", "forbidden AppArmor profile"},
	{"appArmor annotation", func(p *v1.Pod) {
		p.Annotations = map[string]string{v1.DeprecatedAppArmorBetaContainerAnnotationKeyPrefix + "nginx": "unconfined"}
	}, "metadata.annotations[container.apparmor.security.beta.kubernetes.io/nginx]", "forbidden AppArmor profile"},
	{"seLinux", func(p *v1.Pod) { sc(p).SELinuxOptions = &v1.SELinuxOptions{Type: "spc_t"} },
		"spec.containers[0].securityContext.seLinuxOptions", "seLinuxOptions"},
	{"seLinux pod user", func(p *v1.Pod) { podSC(p).SELinuxOptions = &v1.SELinuxOptions{User: "system_u"} },
		"spec.securityContext.seLinuxOptions", "seLinuxOptions"},
	{"seccomp", func(p *v1.Pod) { sc(p).SeccompProfile = &v1.SeccompProfile{Type: v1.SeccompProfileTypeUnconfined} },
		"spec.containers[0].securityContext.seccompProfile.type", "seccompProfile"},
	{"seccomp pod", func(p *v1.Pod) { podSC(p).SeccompProfile = &v1.SeccompProfile{Type: v1.SeccompProfileTypeUnconfined} },
		"spec.securityContext.seccompProfile.type", "seccompProfile"},
	{"sysctl not in the safe set", func(p *v1.Pod) { podSC(p).Sysctls = []v1.Sysctl{{Name: "net.core.somaxconn", Value: "1024"}} },
		"spec.securityContext.sysctls[0].name", "forbidden sysctls (net.core.somaxconn)"},
	{"probe host", func(p *v1.Pod) {
		p.Spec.Containers[0].LivenessProbe = &v1.Probe{ProbeHandler: v1.ProbeHandler{HTTPGet: &v1.HTTPGetAction{Host: "169.254.169.254", Port: intstrPort(80)}}}
	}, "spec.containers[0].livenessProbe.httpGet.host", "probe or lifecycle host"},
	{"init container privileged", func(p *v1.Pod) {
		p.Spec.InitContainers = []v1.Container{{Name: "init", Image: "busybox:1.36", SecurityContext: &v1.SecurityContext{Privileged: ptr(true)}}}
	}, "spec.initContainers[0].securityContext.privileged", `privileged (container "init" must not set securityContext.privileged=true)`},
}

// restrictedControls are violations only PSS restricted forbids; each
// starts from restrictedPod.
var restrictedControls = []control{
	{"allowPrivilegeEscalation unset", func(p *v1.Pod) { sc(p).AllowPrivilegeEscalation = nil },
		"spec.containers[0].securityContext.allowPrivilegeEscalation", "allowPrivilegeEscalation != false"},
	{"runAsNonRoot unset", func(p *v1.Pod) { p.Spec.SecurityContext.RunAsNonRoot = nil },
		"spec.containers[0].securityContext.runAsNonRoot", "runAsNonRoot != true"},
	{"runAsNonRoot false", func(p *v1.Pod) { sc(p).RunAsNonRoot = ptr(false) },
		"spec.containers[0].securityContext.runAsNonRoot", "runAsNonRoot != true"},
	{"runAsUser 0", func(p *v1.Pod) { sc(p).RunAsUser = ptr(int64(0)) },
		"spec.containers[0].securityContext.runAsUser", "runAsUser=0"},
	{"runAsUser 0 pod", func(p *v1.Pod) { p.Spec.SecurityContext.RunAsUser = ptr(int64(0)) },
		"spec.securityContext.runAsUser", "runAsUser=0"},
	{"drop ALL missing", func(p *v1.Pod) { sc(p).Capabilities = nil },
		"spec.containers[0].securityContext.capabilities.drop", `unrestricted capabilities (container "nginx" must set securityContext.capabilities.drop=["ALL"])`},
	{"seccomp unset", func(p *v1.Pod) { p.Spec.SecurityContext.SeccompProfile = nil },
		"spec.containers[0].securityContext.seccompProfile", "seccompProfile"},
	{"procMount", func(p *v1.Pod) {
		p.Spec.HostUsers = ptr(false) // Kubernetes allows Unmasked only in a user namespace
		sc(p).ProcMount = ptr(v1.UnmaskedProcMount)
	}, "spec.containers[0].securityContext.procMount", "procMount"},
	{"volume type", func(p *v1.Pod) {
		p.Spec.Volumes = []v1.Volume{{Name: "nfs", VolumeSource: v1.VolumeSource{NFS: &v1.NFSVolumeSource{Server: "nas", Path: "/x"}}}}
	}, "spec.volumes[0].nfs", `restricted volume types (volume "nfs" uses restricted volume type "nfs")`},
}

func assertFinding(t *testing.T, errs field.ErrorList, path, profile, control string) {
	t.Helper()
	want := `violates PodSecurity "` + profile + `:latest": `
	for _, e := range errs {
		if e.Field == path && e.Type == field.ErrorTypeForbidden && strings.HasPrefix(e.Detail, want) && strings.Contains(e.Detail, control) {
			return
		}
	}
	t.Errorf("no Forbidden %s naming %q under %s in: %s", path, control, profile, FormatErrors(errs))
}

func TestPodSecurityControls(t *testing.T) {
	for _, c := range baselineControls {
		t.Run("baseline/"+c.name, func(t *testing.T) {
			pod := basePod()
			c.mutate(pod)
			assertFinding(t, ValidatePod(pod, node, Policy{Profile: ProfileBaseline}), c.field, "baseline", c.control)
		})
		t.Run("restricted/"+c.name, func(t *testing.T) {
			pod := restrictedPod()
			c.mutate(pod)
			assertFinding(t, ValidatePod(pod, node, Policy{Profile: ProfileRestricted}), c.field, "restricted", c.control)
		})
	}
	for _, c := range restrictedControls {
		t.Run("restricted/"+c.name, func(t *testing.T) {
			pod := restrictedPod()
			c.mutate(pod)
			assertFinding(t, ValidatePod(pod, node, Policy{Profile: ProfileRestricted}), c.field, "restricted", c.control)
		})
	}
	t.Run("compliant pods pass", func(t *testing.T) {
		if errs := ValidatePod(basePod(), node, Policy{}); len(errs) != 0 {
			t.Errorf("baseline: %s", FormatErrors(errs))
		}
		if errs := ValidatePod(restrictedPod(), node, Policy{Profile: ProfileRestricted}); len(errs) != 0 {
			t.Errorf("restricted: %s", FormatErrors(errs))
		}
		if errs := ValidatePod(basePod(), node, Policy{Profile: ProfileRestricted}); len(errs) == 0 {
			t.Error("a plain root pod passed restricted")
		}
	})
}

// TestRestrictedOnlyControlsPassBaseline: restricted's extra controls are
// not baseline's (the volume type is, as mqlet does not mount nfs).
func TestRestrictedOnlyControlsPassBaseline(t *testing.T) {
	for _, c := range restrictedControls {
		if c.name == "volume type" || c.name == "procMount" {
			continue // rejected at baseline too: unsupported volume; procMount needs checking below
		}
		pod := restrictedPod()
		c.mutate(pod)
		if errs := ValidatePod(pod, node, Policy{}); len(errs) != 0 {
			t.Errorf("%s: rejected under baseline: %s", c.name, FormatErrors(errs))
		}
	}
}

// TestLocateMatchesLibrary: for every control, the checks this package
// runs one by one fail exactly as the library's own evaluator does, and
// every failed check is located to at least one field.
func TestLocateMatchesLibrary(t *testing.T) {
	full, err := policy.NewEvaluator(policy.DefaultChecks(), nil)
	if err != nil {
		t.Fatal(err)
	}
	run := func(name string, level api.Level, pod *v1.Pod) {
		DefaultPod(pod)
		lv := api.LevelVersion{Level: level, Version: api.LatestVersion()}
		var want []string
		for _, r := range full.EvaluatePod(lv, &pod.ObjectMeta, &pod.Spec) {
			if !r.Allowed {
				want = append(want, r.ForbiddenReason+": "+r.ForbiddenDetail)
			}
		}
		var got []string
		for _, f := range evaluatePodSecurity(level, &pod.ObjectMeta, &pod.Spec) {
			got = append(got, f.result.ForbiddenReason+": "+f.result.ForbiddenDetail)
			if len(locate(f.id, &pod.ObjectMeta, &pod.Spec)) == 0 {
				t.Errorf("%s: check %s failed but was located nowhere", name, f.id)
			}
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s at %s:\n got %q\nwant %q", name, level, got, want)
		}
	}
	for _, c := range baselineControls {
		pod := basePod()
		c.mutate(pod)
		run(c.name, api.LevelBaseline, pod)
		pod = restrictedPod()
		c.mutate(pod)
		run(c.name, api.LevelRestricted, pod)
	}
	for _, c := range restrictedControls {
		pod := restrictedPod()
		c.mutate(pod)
		run(c.name, api.LevelRestricted, pod)
	}
	run("plain pod", api.LevelRestricted, basePod())
}

func TestPrivilegedProfile(t *testing.T) {
	pod := basePod()
	pod.Spec.HostNetwork, pod.Spec.HostPID, pod.Spec.HostIPC = true, true, true
	pod.Spec.Volumes = []v1.Volume{hostPathVolume("/etc")}
	pod.Spec.Containers[0].SecurityContext = &v1.SecurityContext{Privileged: ptr(true),
		Capabilities: &v1.Capabilities{Add: []v1.Capability{"SYS_ADMIN"}}}
	pod.Spec.Containers[0].Ports = []v1.ContainerPort{{ContainerPort: 80, HostPort: 80}}
	if errs := ValidatePod(pod, node, Policy{Profile: ProfilePrivileged}); len(errs) != 0 {
		t.Fatalf("privileged profile rejected: %s", FormatErrors(errs))
	}
	if errs := ValidatePod(pod, node, Policy{}); len(errs) < 6 {
		t.Fatalf("baseline let through: %s", FormatErrors(errs))
	}
}

func TestNamespaceOverride(t *testing.T) {
	pol := Policy{Profile: ProfileBaseline, Namespaces: map[string]Profile{"kube-system": ProfilePrivileged, "secure": ProfileRestricted}}
	priv := basePod()
	priv.Spec.HostNetwork = true
	if errs := ValidatePod(priv, node, pol); !hasField(errs, "spec.hostNetwork") {
		t.Errorf("default namespace: hostNetwork not rejected: %s", FormatErrors(errs))
	}
	priv.Namespace = "kube-system"
	if errs := ValidatePod(priv, node, pol); len(errs) != 0 {
		t.Errorf("kube-system is privileged, got %s", FormatErrors(errs))
	}
	plain := basePod()
	plain.Namespace = "secure"
	assertFinding(t, ValidatePod(plain, node, pol), "spec.containers[0].securityContext.runAsNonRoot", "restricted", "runAsNonRoot")
	if got := pol.ProfileFor("other"); got != ProfileBaseline {
		t.Errorf("ProfileFor(other) = %s", got)
	}
	if got := (Policy{}).ProfileFor("x"); got != ProfileBaseline {
		t.Errorf("zero policy profile = %s, want baseline", got)
	}
	if got := (Policy{Profile: "lax"}).ProfileFor("x"); got != ProfileRestricted {
		t.Errorf("unknown profile judged as %s, want restricted", got)
	}
}

func TestWithProfile(t *testing.T) {
	pol := Policy{Profile: ProfileRestricted, Namespaces: map[string]Profile{"default": ProfileRestricted}, AllowedHostPaths: []string{"/data"}}
	pod := basePod()
	pod.Spec.HostNetwork = true
	granted := pol.WithProfile(ProfilePrivileged)
	if errs := ValidatePod(pod, node, granted); len(errs) != 0 {
		t.Errorf("granted privileged, got %s", FormatErrors(errs))
	}
	if pol.Namespaces["default"] != ProfileRestricted || pol.Profile != ProfileRestricted {
		t.Error("WithProfile changed the original policy")
	}
	if len(granted.AllowedHostPaths) != 1 {
		t.Error("WithProfile dropped the exceptions")
	}
	if errs := ValidatePod(pod, node, pol); len(errs) == 0 {
		t.Error("original policy let hostNetwork through")
	}
}

func TestParseProfile(t *testing.T) {
	for _, s := range []string{"privileged", "baseline", "restricted"} {
		if p, err := ParseProfile(s); err != nil || string(p) != s {
			t.Errorf("ParseProfile(%q) = %q, %v", s, p, err)
		}
	}
	for _, s := range []string{"", "Baseline", "root"} {
		if _, err := ParseProfile(s); err == nil {
			t.Errorf("ParseProfile(%q) accepted", s)
		}
	}
}

func TestExceptionsWaiveOnlyTheirField(t *testing.T) {
	tests := []struct {
		name     string
		policy   Policy
		mutate   func(*v1.Pod)
		want     []string // fields still reported
		notWant  []string // fields waived
		profiles []Profile
	}{
		{"allowHostNetwork", Policy{AllowHostNetwork: true},
			func(p *v1.Pod) { p.Spec.HostNetwork, p.Spec.HostPID = true, true },
			[]string{"spec.hostPID"}, []string{"spec.hostNetwork"}, nil},
		{"allowHostPID and IPC", Policy{AllowHostPID: true, AllowHostIPC: true},
			func(p *v1.Pod) { p.Spec.HostNetwork, p.Spec.HostPID, p.Spec.HostIPC = true, true, true },
			[]string{"spec.hostNetwork"}, []string{"spec.hostPID", "spec.hostIPC"}, nil},
		{"allowPrivileged", Policy{AllowPrivileged: true},
			func(p *v1.Pod) {
				p.Spec.Containers[0].SecurityContext = &v1.SecurityContext{Privileged: ptr(true),
					Capabilities: &v1.Capabilities{Add: []v1.Capability{"SYS_ADMIN"}}}
			},
			[]string{"spec.containers[0].securityContext.capabilities.add[0]"}, []string{"spec.containers[0].securityContext.privileged"}, nil},
		{"allowedCapabilities", Policy{AllowedCapabilities: []string{"CAP_NET_ADMIN"}},
			func(p *v1.Pod) {
				p.Spec.Containers[0].SecurityContext = &v1.SecurityContext{Capabilities: &v1.Capabilities{Add: []v1.Capability{"NET_ADMIN", "SYS_ADMIN"}}}
			},
			[]string{"spec.containers[0].securityContext.capabilities.add[1]"}, []string{"spec.containers[0].securityContext.capabilities.add[0]"}, nil},
		{"allowedCapabilities under restricted", Policy{Profile: ProfileRestricted, AllowedCapabilities: []string{"NET_ADMIN"}},
			func(p *v1.Pod) {
				*p = *restrictedPod()
				p.Spec.Containers[0].SecurityContext.Capabilities.Add = []v1.Capability{"NET_ADMIN", "NET_RAW"}
			},
			[]string{"spec.containers[0].securityContext.capabilities.add[1]"}, []string{"spec.containers[0].securityContext.capabilities.add[0]"}, nil},
		{"allowedHostPaths", Policy{AllowedHostPaths: []string{"/tmp"}},
			func(p *v1.Pod) {
				p.Spec.Volumes = []v1.Volume{hostPathVolume("/tmp"), {Name: "etc", VolumeSource: v1.VolumeSource{HostPath: &v1.HostPathVolumeSource{Path: "/etc"}}}}
			},
			[]string{"spec.volumes[1].hostPath.path"}, []string{"spec.volumes[0].hostPath.path"}, nil},
		{"allowedHostPaths under restricted waives the volume type too", Policy{Profile: ProfileRestricted, AllowedHostPaths: []string{"/tmp"}},
			func(p *v1.Pod) { *p = *restrictedPod(); p.Spec.Volumes = []v1.Volume{hostPathVolume("/tmp")} },
			nil, []string{"spec.volumes[0].hostPath.path", "spec.volumes[0].hostPath"}, nil},
		{"allowedHostPorts", Policy{AllowedHostPorts: []PortRange{{8080, 8080}, {30000, 32767}}},
			func(p *v1.Pod) {
				p.Spec.Containers[0].Ports = []v1.ContainerPort{{ContainerPort: 1, HostPort: 8080}, {ContainerPort: 2, HostPort: 8081},
					{ContainerPort: 3, HostPort: 30000}, {ContainerPort: 4, HostPort: 32767}, {ContainerPort: 5, HostPort: 32768}, {ContainerPort: 6, HostPort: 29999}}
			},
			[]string{"spec.containers[0].ports[1].hostPort", "spec.containers[0].ports[4].hostPort", "spec.containers[0].ports[5].hostPort"},
			[]string{"spec.containers[0].ports[0].hostPort", "spec.containers[0].ports[2].hostPort", "spec.containers[0].ports[3].hostPort"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pod := basePod()
			tt.mutate(pod)
			errs := ValidatePod(pod, node, tt.policy)
			for _, w := range tt.want {
				if !hasField(errs, w) {
					t.Errorf("%s not reported: %s", w, FormatErrors(errs))
				}
			}
			for _, n := range tt.notWant {
				if hasField(errs, n) {
					t.Errorf("%s reported despite the exception: %s", n, FormatErrors(errs))
				}
			}
			if len(tt.want) == 0 && len(errs) != 0 {
				t.Errorf("want valid, got %s", FormatErrors(errs))
			}
		})
	}
}

func TestPortRange(t *testing.T) {
	for in, want := range map[string]PortRange{"8080": {8080, 8080}, "30000-32767": {30000, 32767}} {
		got, err := ParsePortRange(in)
		if err != nil || got != want || got.String() != in {
			t.Errorf("ParsePortRange(%q) = %v, %v", in, got, err)
		}
	}
	for _, in := range []string{"", "0", "65536", "1-", "9-1", "x", "1-2-3"} {
		if _, err := ParsePortRange(in); err == nil {
			t.Errorf("ParsePortRange(%q) accepted", in)
		}
	}
	var p Policy
	if err := jsonUnmarshal([]byte(`{"profile":"restricted","namespaces":{"a":"privileged"},"allowedHostPorts":["80","9000-9100"]}`), &p); err != nil {
		t.Fatal(err)
	}
	if p.Profile != ProfileRestricted || p.Namespaces["a"] != ProfilePrivileged || len(p.AllowedHostPorts) != 2 || p.AllowedHostPorts[1] != (PortRange{9000, 9100}) {
		t.Fatalf("decoded %+v", p)
	}
}

// TestHostPathSymlinkPivot: a link planted inside an allowed directory
// that points out of it does not make its target allowed.
func TestHostPathSymlinkPivot(t *testing.T) {
	root := t.TempDir()
	allowed := filepath.Join(root, "allowed")
	must(t, os.MkdirAll(filepath.Join(allowed, "real"), 0o755))
	must(t, os.Symlink("/", filepath.Join(allowed, "pivot")))
	must(t, os.Symlink("real", filepath.Join(allowed, "inside")))
	must(t, os.Symlink(filepath.Join(root, "nowhere"), filepath.Join(allowed, "dangling")))
	must(t, os.Symlink(allowed, filepath.Join(root, "alias")))
	pol := Policy{AllowedHostPaths: []string{allowed}}
	cases := map[string]bool{
		allowed:                                     true,
		filepath.Join(allowed, "real"):              true,
		filepath.Join(allowed, "inside"):            true, // a link that stays inside
		filepath.Join(allowed, "new", "dir"):        true, // does not exist yet
		filepath.Join(allowed, "pivot"):             false,
		filepath.Join(allowed, "pivot", "etc"):      false,
		filepath.Join(allowed, "pivot", "nonexist"): false,
		filepath.Join(allowed, "dangling"):          false,
		filepath.Join(allowed, "..", "x"):           false,
		filepath.Join(root, "alias", "real"):        false, // not under the allowed path as written
		allowed + strings.Repeat("/a", 2100):        false, // past PATH_MAX
	}
	for p, want := range cases {
		pod := basePod()
		pod.Spec.Volumes = []v1.Volume{hostPathVolume(p)}
		errs := ValidatePod(pod, node, pol)
		if got := len(errs) == 0; got != want {
			t.Errorf("hostPath %s: allowed=%v, want %v (%s)", p, got, want, FormatErrors(errs))
		}
		if !want && !hasField(errs, "spec.volumes[0].hostPath.path") {
			t.Errorf("hostPath %s: no error on its path: %s", p, FormatErrors(errs))
		}
	}
	pod := basePod()
	pod.Spec.Volumes = []v1.Volume{hostPathVolume(filepath.Join(allowed, "pivot"))}
	if msg := FormatErrors(ValidatePod(pod, node, pol)); !strings.Contains(msg, `resolves to "/"`) {
		t.Errorf("the pivot's message does not say where it leads: %s", msg)
	}
	// An allowed directory that is itself reached through a link.
	alias := Policy{AllowedHostPaths: []string{filepath.Join(root, "alias")}}
	pod.Spec.Volumes = []v1.Volume{hostPathVolume(filepath.Join(root, "alias", "real"))}
	if errs := ValidatePod(pod, node, alias); len(errs) != 0 {
		t.Errorf("path under an aliased allowed dir rejected: %s", FormatErrors(errs))
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestNodeRejectsAtEveryProfile(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*v1.Pod)
		field  string
		detail string
	}{
		{"nfs volume", func(p *v1.Pod) {
			p.Spec.Volumes = []v1.Volume{{Name: "a", VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}},
				{Name: "b", VolumeSource: v1.VolumeSource{ConfigMap: &v1.ConfigMapVolumeSource{LocalObjectReference: v1.LocalObjectReference{Name: "c"}}}},
				{Name: "c", VolumeSource: v1.VolumeSource{NFS: &v1.NFSVolumeSource{Server: "nas", Path: "/x"}}}}
		}, "spec.volumes[2].nfs", "mqlet does not support nfs volumes"},
		{"serviceAccountToken projection", func(p *v1.Pod) {
			p.Spec.Volumes = []v1.Volume{{Name: "d", VolumeSource: v1.VolumeSource{Projected: &v1.ProjectedVolumeSource{Sources: []v1.VolumeProjection{
				{ServiceAccountToken: &v1.ServiceAccountTokenProjection{Path: "token"}}}}}}}
		}, "spec.volumes[0].projected.sources[0].serviceAccountToken", "mqlet does not support serviceAccountToken"},
		{"host sysctl", func(p *v1.Pod) { podSC(p).Sysctls = []v1.Sysctl{{Name: "kernel.panic", Value: "1"}} },
			"spec.securityContext.sysctls[0].name", "would change the host"},
		{"vm sysctl", func(p *v1.Pod) {
			podSC(p).Sysctls = []v1.Sysctl{{Name: "net.ipv4.tcp_syncookies", Value: "1"}, {Name: "vm.overcommit_memory", Value: "1"}}
		}, "spec.securityContext.sysctls[1].name", "is not isolated per pod"},
		{"net sysctl with hostNetwork", func(p *v1.Pod) {
			p.Spec.HostNetwork = true
			podSC(p).Sysctls = []v1.Sysctl{{Name: "net.core.somaxconn", Value: "1024"}}
		}, "spec.securityContext.sysctls[0].name", "host's network namespace"},
		{"seccomp Localhost", func(p *v1.Pod) {
			sc(p).SeccompProfile = &v1.SeccompProfile{Type: v1.SeccompProfileTypeLocalhost, LocalhostProfile: ptr("x.json")}
		}, "spec.containers[0].securityContext.seccompProfile.type", "Localhost seccomp"},
		{"pod seccomp Localhost", func(p *v1.Pod) {
			podSC(p).SeccompProfile = &v1.SeccompProfile{Type: v1.SeccompProfileTypeLocalhost, LocalhostProfile: ptr("x.json")}
		}, "spec.securityContext.seccompProfile.type", "Localhost seccomp"},
		{"appArmor Localhost", func(p *v1.Pod) {
			sc(p).AppArmorProfile = &v1.AppArmorProfile{Type: v1.AppArmorProfileTypeLocalhost, LocalhostProfile: ptr("x")}
		}, "spec.containers[0].securityContext.appArmorProfile.type", noAppArmor},
		{"pod appArmor RuntimeDefault", func(p *v1.Pod) {
			podSC(p).AppArmorProfile = &v1.AppArmorProfile{Type: v1.AppArmorProfileTypeRuntimeDefault}
		}, "spec.securityContext.appArmorProfile.type", noAppArmor},
		{"appArmor localhost annotation", func(p *v1.Pod) {
			p.Annotations = map[string]string{v1.DeprecatedAppArmorBetaContainerAnnotationKeyPrefix + "nginx": "localhost/x"}
		}, "metadata.annotations[container.apparmor.security.beta.kubernetes.io/nginx]", noAppArmor},
		{"seLinux level", func(p *v1.Pod) { podSC(p).SELinuxOptions = &v1.SELinuxOptions{Level: "s0:c1,c2"} },
			"spec.securityContext.seLinuxOptions", noSELinux},
	}
	for _, tt := range tests {
		for _, prof := range []Profile{ProfilePrivileged, ProfileBaseline, ProfileRestricted} {
			t.Run(tt.name+"/"+string(prof), func(t *testing.T) {
				pod := basePod()
				if prof == ProfileRestricted {
					pod = restrictedPod()
				}
				tt.mutate(pod)
				errs := ValidatePod(pod, node, Policy{Profile: prof})
				for _, e := range errs {
					if e.Field == tt.field && strings.Contains(e.Detail, tt.detail) {
						return
					}
				}
				t.Errorf("no error on %s saying %q: %s", tt.field, tt.detail, FormatErrors(errs))
			})
		}
	}
	// Namespaced sysctls are the privileged profile's to allow.
	pod := basePod()
	podSC(pod).Sysctls = []v1.Sysctl{{Name: "net.core.somaxconn", Value: "1024"}, {Name: "kernel.msgmax", Value: "65536"}}
	if errs := ValidatePod(pod, node, Policy{Profile: ProfilePrivileged}); len(errs) != 0 {
		t.Errorf("namespaced sysctls rejected under privileged: %s", FormatErrors(errs))
	}
}

func TestFailedMessageListsEveryControl(t *testing.T) {
	pod := basePod()
	pod.Spec.Containers[0].Name = "c"
	pod.Spec.HostNetwork = true
	pod.Spec.Containers[0].SecurityContext = &v1.SecurityContext{Privileged: ptr(true)}
	errs := ValidatePod(pod, node, Policy{})
	// Each control's text once (issue 22: a refusal printed each four
	// times), each field by the control's reason.
	want := `violates PodSecurity "baseline:latest": host namespaces (hostNetwork=true), privileged (container "c" must not set securityContext.privileged=true); ` +
		`2 errors: spec.hostNetwork: Forbidden: host namespaces; ` +
		`spec.containers[0].securityContext.privileged: Forbidden: privileged`
	if got := FormatErrors(errs); got != want {
		t.Errorf("message\n got %s\nwant %s", got, want)
	}
	// Each error stands alone too, with the profile and its field path.
	if e := errs[0]; e.Type != field.ErrorTypeForbidden || e.Field != "spec.hostNetwork" ||
		e.Detail != `violates PodSecurity "baseline:latest": host namespaces (hostNetwork=true)` {
		t.Errorf("first error %#v", e)
	}
	// A control found at two fields is summed up once.
	pod.Spec.HostNetwork = false
	pod.Spec.InitContainers = []v1.Container{{Name: "i", Image: "busybox", SecurityContext: &v1.SecurityContext{Privileged: ptr(true)}}}
	msg := FormatErrors(ValidatePod(pod, node, Policy{}))
	if !strings.HasPrefix(msg, `violates PodSecurity "baseline:latest": privileged (containers "i", "c" must not set securityContext.privileged=true); 2 errors: spec.initContainers[0]`) {
		t.Errorf("message %s", msg)
	}
}

func TestCheckUsesDefaultedNamespace(t *testing.T) {
	// ValidatePod defaults the namespace before choosing the profile.
	pol := Policy{Namespaces: map[string]Profile{"default": ProfilePrivileged}}
	pod := basePod()
	pod.Spec.HostNetwork = true
	if errs := ValidatePod(pod, node, pol); len(errs) != 0 {
		t.Errorf("pod without namespace not judged as in default: %s", FormatErrors(errs))
	}
	if errs := pol.Check(&metav1.ObjectMeta{Namespace: "other"}, &pod.Spec); !hasField(errs, "spec.hostNetwork") {
		t.Errorf("other namespace not baseline: %s", FormatErrors(errs))
	}
}

func intstrPort(p int) intstr.IntOrString { return intstr.FromInt32(int32(p)) }

func TestLoosenedForOnlyLoosens(t *testing.T) {
	node := Policy{Profile: ProfileBaseline, Namespaces: map[string]Profile{"ops": ProfilePrivileged, "strict": ProfileRestricted}}
	cases := []struct {
		ns      string
		granted Profile
		want    Profile
	}{
		{"default", ProfilePrivileged, ProfilePrivileged},
		{"default", ProfileBaseline, ProfileBaseline},
		{"default", ProfileRestricted, ProfileBaseline}, // a key never tightens
		{"strict", ProfileBaseline, ProfileBaseline},
		{"ops", ProfileRestricted, ProfilePrivileged},
		{"default", Profile("root"), ProfileBaseline}, // unknown grants nothing
	}
	for _, c := range cases {
		if got := node.LoosenedFor(c.ns, c.granted).ProfileFor(c.ns); got != c.want {
			t.Errorf("LoosenedFor(%q, %q) judges at %q, want %q", c.ns, c.granted, got, c.want)
		}
	}
}

// hostUsers: false made the library relax procMount (baseline) and
// runAsNonRoot/runAsUser (restricted), but mqlet's runtime makes no user
// namespace: the pod ran as host root with an Unmasked /proc. It is refused
// at every profile, naming the field.
func TestHostUsersFalseRefusedAtEveryProfile(t *testing.T) {
	for _, profile := range []Profile{ProfileBaseline, ProfileRestricted, ProfilePrivileged} {
		pod := basePod()
		pod.Spec.HostUsers = ptr(false)
		unmasked := v1.UnmaskedProcMount
		pod.Spec.Containers[0].SecurityContext = &v1.SecurityContext{ProcMount: &unmasked}
		errs := ValidatePod(pod, node, Policy{Profile: profile})
		if !strings.Contains(FormatErrors(errs), "spec.hostUsers: Forbidden: mqlet does not run pods in user namespaces") {
			t.Fatalf("%s: hostUsers: false not refused: %s", profile, FormatErrors(errs))
		}
	}
	pod := basePod()
	pod.Spec.HostUsers = ptr(true)
	if errs := ValidatePod(pod, node, Policy{}); len(errs) != 0 {
		t.Fatalf("hostUsers: true refused: %s", FormatErrors(errs))
	}
}

// os.name windows made the library skip restricted's Linux-only controls
// (allowPrivilegeEscalation, drop ALL, seccomp) for a pod mqlet runs on
// Linux; a pod for another OS is refused, as the kubelet does.
func TestWindowsPodRefused(t *testing.T) {
	pod := basePod()
	pod.Spec.SecurityContext = &v1.PodSecurityContext{RunAsNonRoot: ptr(true)}
	pod.Spec.OS = &v1.PodOS{Name: v1.Windows}
	errs := ValidatePod(pod, node, Policy{Profile: ProfileRestricted})
	if !strings.Contains(FormatErrors(errs), "spec.os.name: Forbidden: this node runs linux pods only") {
		t.Fatalf("a Windows pod passed restricted: %s", FormatErrors(errs))
	}
	pod.Spec.OS = &v1.PodOS{Name: v1.Linux}
	if msg := FormatErrors(ValidatePod(pod, node, Policy{Profile: ProfileRestricted})); !strings.Contains(msg, "allowPrivilegeEscalation") {
		t.Fatalf("the same pod for Linux must fail restricted's controls: %s", msg)
	}
}

// recursiveReadOnly: Enabled cannot be honoured (the runtime makes only
// the mount itself read-only): refused rather than ignored.
func TestRecursiveReadOnlyEnabledRefused(t *testing.T) {
	pod := basePod()
	pod.Spec.Volumes = []v1.Volume{{Name: "d", VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}}}
	for mode, refused := range map[v1.RecursiveReadOnlyMode]bool{v1.RecursiveReadOnlyEnabled: true, v1.RecursiveReadOnlyIfPossible: false, v1.RecursiveReadOnlyDisabled: false} {
		pod.Spec.Containers[0].VolumeMounts = []v1.VolumeMount{{Name: "d", MountPath: "/d", ReadOnly: true, RecursiveReadOnly: &mode}}
		msg := FormatErrors(ValidatePod(pod, node, Policy{Profile: ProfilePrivileged}))
		if got := strings.Contains(msg, "spec.containers[0].volumeMounts[0].recursiveReadOnly: Forbidden"); got != refused {
			t.Errorf("%s: refused=%v: %s", mode, got, msg)
		}
	}
}

// A huge pages medium was accepted and ignored: refused, naming the
// field. Medium Memory, with or without a sizeLimit, is a sized tmpfs; a
// sizeLimit on disk is enforced by eviction (agent/eviction).
func TestEmptyDirMediumRefusedSizeLimitTaken(t *testing.T) {
	limit := resource.MustParse("1Mi")
	for field, ed := range map[string]*v1.EmptyDirVolumeSource{
		"spec.volumes[0].emptyDir.medium: Forbidden": {Medium: v1.StorageMediumHugePages},
	} {
		pod := basePod()
		pod.Spec.Volumes = []v1.Volume{{Name: "d", VolumeSource: v1.VolumeSource{EmptyDir: ed}}}
		if msg := FormatErrors(ValidatePod(pod, node, Policy{Profile: ProfilePrivileged})); !strings.Contains(msg, field) {
			t.Errorf("want %s: %s", field, msg)
		}
	}
	for _, ed := range []*v1.EmptyDirVolumeSource{{}, {SizeLimit: &limit}, {Medium: v1.StorageMediumMemory}, {Medium: v1.StorageMediumMemory, SizeLimit: &limit}} {
		pod := basePod()
		pod.Spec.Volumes = []v1.Volume{{Name: "d", VolumeSource: v1.VolumeSource{EmptyDir: ed}}}
		if errs := ValidatePod(pod, node, Policy{}); len(errs) != 0 {
			t.Fatalf("emptyDir %+v refused: %s", ed, FormatErrors(errs))
		}
	}
}
