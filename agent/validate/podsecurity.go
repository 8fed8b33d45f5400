package validate

import (
	"fmt"
	"slices"
	"strings"
	"sync"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/pod-security-admission/api"
	"k8s.io/pod-security-admission/policy"
)

// pssCheck is one Pod Security Standards check from
// k8s.io/pod-security-admission, held by its ID so that its findings can
// be located field by field. Each has an evaluator of its own, so the
// library picks the check's version for the policy version as it does for
// its own evaluator.
type pssCheck struct {
	id    policy.CheckID
	level api.Level
	eval  policy.Evaluator
}

// pssChecks gives the checks and the baseline checks restricted overrides,
// built at the first pod checked, only read afterwards.
var pssChecks = sync.OnceValues(loadChecks)

func loadChecks() ([]pssCheck, map[policy.CheckID]bool) {
	var checks []pssCheck
	overridden := map[policy.CheckID]bool{}
	for _, c := range policy.DefaultChecks() {
		eval, err := policy.NewEvaluator([]policy.Check{c}, nil)
		if err != nil {
			panic(fmt.Sprintf("pod security check %s: %v", c.ID, err))
		}
		checks = append(checks, pssCheck{id: c.ID, level: c.Level, eval: eval})
		if c.Level == api.LevelRestricted {
			// Overrides of the newest version, which "latest" evaluates.
			for _, o := range c.Versions[len(c.Versions)-1].OverrideCheckIDs {
				overridden[o] = true
			}
		}
	}
	// Baseline first, then restricted, each by ID: the order the library reports in.
	slices.SortStableFunc(checks, func(a, b pssCheck) int {
		if a.level != b.level {
			if a.level == api.LevelBaseline {
				return -1
			}
			return 1
		}
		return strings.Compare(string(a.id), string(b.id))
	})
	return checks, overridden
}

type finding struct {
	id     policy.CheckID
	result policy.CheckResult
}

// evaluatePodSecurity runs the checks of level (baseline or restricted) at
// the latest policy version and returns the failed ones. For restricted,
// baseline checks that a restricted check replaces are skipped, as the
// library's own evaluator does.
func evaluatePodSecurity(level api.Level, meta *metav1.ObjectMeta, spec *v1.PodSpec) []finding {
	lv := api.LevelVersion{Level: level, Version: api.LatestVersion()}
	var out []finding
	checks, overriddenByRestricted := pssChecks()
	for _, c := range checks {
		if level == api.LevelBaseline && c.level != api.LevelBaseline {
			continue
		}
		if level == api.LevelRestricted && c.level == api.LevelBaseline && overriddenByRestricted[c.id] {
			continue
		}
		for _, r := range c.eval.EvaluatePod(lv, meta, spec) {
			if !r.Allowed {
				out = append(out, finding{id: c.id, result: r})
			}
		}
	}
	return out
}

// baselineCapabilities may be added under baseline (the PSS default set).
var baselineCapabilities = []v1.Capability{"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL",
	"MKNOD", "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}

// locate names the fields behind a failed check: the fields the Pod Security
// Standards list for that control, where they hold a forbidden value (or,
// for restricted, lack a required one). The library's verdict decides
// whether the control is violated; this only says where.
func locate(id policy.CheckID, meta *metav1.ObjectMeta, spec *v1.PodSpec) []*field.Path {
	specPath := field.NewPath("spec")
	podSC := specPath.Child("securityContext")
	psc := spec.SecurityContext
	if psc == nil {
		psc = &v1.PodSecurityContext{}
	}
	var paths []*field.Path
	add := func(p *field.Path) { paths = append(paths, p) }
	eachContainer := func(fn func(p *field.Path, c *v1.Container, sc *v1.SecurityContext)) {
		visitContainers(spec, func(p *field.Path, c *v1.Container) {
			sc := c.SecurityContext
			if sc == nil {
				sc = &v1.SecurityContext{}
			}
			fn(p, c, sc)
		})
	}
	userNamespace := spec.HostUsers != nil && !*spec.HostUsers

	switch id {
	case "hostNamespaces":
		if spec.HostNetwork {
			add(specPath.Child("hostNetwork"))
		}
		if spec.HostPID {
			add(specPath.Child("hostPID"))
		}
		if spec.HostIPC {
			add(specPath.Child("hostIPC"))
		}
	case "privileged":
		eachContainer(func(p *field.Path, _ *v1.Container, sc *v1.SecurityContext) {
			if sc.Privileged != nil && *sc.Privileged {
				add(p.Child("securityContext", "privileged"))
			}
		})
	case "capabilities_baseline", "capabilities_restricted":
		restricted := id == "capabilities_restricted"
		eachContainer(func(p *field.Path, _ *v1.Container, sc *v1.SecurityContext) {
			caps := sc.Capabilities
			if caps == nil {
				caps = &v1.Capabilities{}
			}
			capsPath := p.Child("securityContext", "capabilities")
			if restricted && !slices.Contains(caps.Drop, "ALL") {
				add(capsPath.Child("drop"))
			}
			for j, c := range caps.Add {
				if (restricted && c != "NET_BIND_SERVICE") || (!restricted && !slices.Contains(baselineCapabilities, c)) {
					add(capsPath.Child("add").Index(j))
				}
			}
		})
	case "hostPathVolumes":
		for i, vol := range spec.Volumes {
			if vol.HostPath != nil {
				add(specPath.Child("volumes").Index(i).Child("hostPath", "path"))
			}
		}
	case "restrictedVolumes":
		for i, vol := range spec.Volumes {
			name := volumeType(&vol.VolumeSource)
			switch {
			case name == "hostPath":
				add(specPath.Child("volumes").Index(i).Child("hostPath", "path")) // as hostPathVolumes does
			case name != "" && !slices.Contains(restrictedVolumeTypes, name):
				add(specPath.Child("volumes").Index(i).Child(name))
			}
		}
	case "hostPorts":
		eachContainer(func(p *field.Path, c *v1.Container, _ *v1.SecurityContext) {
			for j, port := range c.Ports {
				if port.HostPort != 0 {
					add(p.Child("ports").Index(j).Child("hostPort"))
				}
			}
		})
	case "hostProbesAndHostLifecycle":
		eachContainer(func(p *field.Path, c *v1.Container, _ *v1.SecurityContext) {
			for _, probe := range []struct {
				name  string
				probe *v1.Probe
			}{{"livenessProbe", c.LivenessProbe}, {"readinessProbe", c.ReadinessProbe}, {"startupProbe", c.StartupProbe}} {
				if probe.probe != nil {
					addHandlerHosts(add, p.Child(probe.name), probe.probe.HTTPGet, probe.probe.TCPSocket)
				}
			}
			if c.Lifecycle != nil {
				if h := c.Lifecycle.PostStart; h != nil {
					addHandlerHosts(add, p.Child("lifecycle", "postStart"), h.HTTPGet, h.TCPSocket)
				}
				if h := c.Lifecycle.PreStop; h != nil {
					addHandlerHosts(add, p.Child("lifecycle", "preStop"), h.HTTPGet, h.TCPSocket)
				}
			}
		})
	case "appArmorProfile":
		bad := func(t v1.AppArmorProfileType) bool {
			return t != v1.AppArmorProfileTypeRuntimeDefault && t != v1.AppArmorProfileTypeLocalhost
		}
		if psc.AppArmorProfile != nil && bad(psc.AppArmorProfile.Type) {
			add(podSC.Child("appArmorProfile", "type"))
		}
		eachContainer(func(p *field.Path, _ *v1.Container, sc *v1.SecurityContext) {
			if sc.AppArmorProfile != nil && bad(sc.AppArmorProfile.Type) {
				add(p.Child("securityContext", "appArmorProfile", "type"))
			}
		})
		for _, k := range sortedKeys(meta.Annotations) {
			v := meta.Annotations[k]
			if strings.HasPrefix(k, v1.DeprecatedAppArmorBetaContainerAnnotationKeyPrefix) &&
				v != "" && v != v1.DeprecatedAppArmorBetaProfileRuntimeDefault && !strings.HasPrefix(v, v1.DeprecatedAppArmorBetaProfileNamePrefix) {
				add(field.NewPath("metadata", "annotations").Key(k))
			}
		}
	case "seLinuxOptions":
		bad := func(o *v1.SELinuxOptions) bool {
			return o != nil && (o.User != "" || o.Role != "" ||
				!slices.Contains([]string{"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}, o.Type))
		}
		if bad(psc.SELinuxOptions) {
			add(podSC.Child("seLinuxOptions"))
		}
		eachContainer(func(p *field.Path, _ *v1.Container, sc *v1.SecurityContext) {
			if bad(sc.SELinuxOptions) {
				add(p.Child("securityContext", "seLinuxOptions"))
			}
		})
	case "procMount", "procMount_restricted":
		eachContainer(func(p *field.Path, _ *v1.Container, sc *v1.SecurityContext) {
			if sc.ProcMount != nil && *sc.ProcMount != v1.DefaultProcMount {
				add(p.Child("securityContext", "procMount"))
			}
		})
	case "seccompProfile_baseline", "seccompProfile_restricted":
		restricted := id == "seccompProfile_restricted"
		ok := func(s *v1.SeccompProfile) bool {
			return s.Type == v1.SeccompProfileTypeRuntimeDefault || s.Type == v1.SeccompProfileTypeLocalhost
		}
		podSet := psc.SeccompProfile != nil && ok(psc.SeccompProfile)
		if psc.SeccompProfile != nil && !ok(psc.SeccompProfile) {
			add(podSC.Child("seccompProfile", "type"))
		}
		eachContainer(func(p *field.Path, _ *v1.Container, sc *v1.SecurityContext) {
			switch {
			case sc.SeccompProfile != nil && !ok(sc.SeccompProfile):
				add(p.Child("securityContext", "seccompProfile", "type"))
			case sc.SeccompProfile == nil && restricted && !podSet:
				add(p.Child("securityContext", "seccompProfile"))
			}
		})
	case "sysctls":
		for i, s := range psc.Sysctls {
			if !slices.Contains(safeSysctls, s.Name) {
				add(podSC.Child("sysctls").Index(i).Child("name"))
			}
		}
	case "allowPrivilegeEscalation":
		eachContainer(func(p *field.Path, _ *v1.Container, sc *v1.SecurityContext) {
			if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
				add(p.Child("securityContext", "allowPrivilegeEscalation"))
			}
		})
	case "runAsNonRoot":
		podSet := psc.RunAsNonRoot != nil && *psc.RunAsNonRoot
		if psc.RunAsNonRoot != nil && !*psc.RunAsNonRoot && !userNamespace {
			add(podSC.Child("runAsNonRoot"))
		}
		eachContainer(func(p *field.Path, _ *v1.Container, sc *v1.SecurityContext) {
			if (sc.RunAsNonRoot != nil && !*sc.RunAsNonRoot) || (sc.RunAsNonRoot == nil && !podSet) {
				add(p.Child("securityContext", "runAsNonRoot"))
			}
		})
	case "runAsUser":
		if psc.RunAsUser != nil && *psc.RunAsUser == 0 {
			add(podSC.Child("runAsUser"))
		}
		eachContainer(func(p *field.Path, _ *v1.Container, sc *v1.SecurityContext) {
			if sc.RunAsUser != nil && *sc.RunAsUser == 0 {
				add(p.Child("securityContext", "runAsUser"))
			}
		})
	case "windowsHostProcess":
		if psc.WindowsOptions != nil && psc.WindowsOptions.HostProcess != nil && *psc.WindowsOptions.HostProcess {
			add(podSC.Child("windowsOptions", "hostProcess"))
		}
		eachContainer(func(p *field.Path, _ *v1.Container, sc *v1.SecurityContext) {
			if sc.WindowsOptions != nil && sc.WindowsOptions.HostProcess != nil && *sc.WindowsOptions.HostProcess {
				add(p.Child("securityContext", "windowsOptions", "hostProcess"))
			}
		})
	}
	return paths
}

func addHandlerHosts(add func(*field.Path), p *field.Path, httpGet *v1.HTTPGetAction, tcp *v1.TCPSocketAction) {
	if httpGet != nil && httpGet.Host != "" {
		add(p.Child("httpGet", "host"))
	}
	if tcp != nil && tcp.Host != "" {
		add(p.Child("tcpSocket", "host"))
	}
}

// restrictedVolumeTypes are the volume types PSS restricted allows.
var restrictedVolumeTypes = []string{"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "image",
	"persistentVolumeClaim", "projected", "secret"}

// safeSysctls are the sysctls PSS baseline allows (its latest safe set).
var safeSysctls = []string{"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
	"net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
	"net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
	"net.ipv4.tcp_keepalive_probes", "net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem",
	"net.ipv4.tcp_slow_start_after_idle", "net.ipv4.tcp_notsent_lowat"}

// visitContainers calls fn for every init, regular and ephemeral container
// with its field path.
func visitContainers(spec *v1.PodSpec, fn func(p *field.Path, c *v1.Container)) {
	specPath := field.NewPath("spec")
	for i := range spec.InitContainers {
		fn(specPath.Child("initContainers").Index(i), &spec.InitContainers[i])
	}
	for i := range spec.Containers {
		fn(specPath.Child("containers").Index(i), &spec.Containers[i])
	}
	for i := range spec.EphemeralContainers {
		fn(specPath.Child("ephemeralContainers").Index(i), (*v1.Container)(&spec.EphemeralContainers[i].EphemeralContainerCommon))
	}
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
