package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	apiv1 "github.com/mqlet/mqlet/api/v1"
	"github.com/mqlet/mqlet/internal/testutil/mosquitto"
)

func admissionPod(name, namespace string, restricted bool) *v1.Pod {
	p := &v1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: v1.PodSpec{Containers: []v1.Container{{Name: "c", Image: "docker.io/mqlet/busybox:test",
			ImagePullPolicy: v1.PullNever, Command: []string{"sleep", "3600"}}}},
	}
	if restricted {
		p.Spec.SecurityContext = &v1.PodSecurityContext{RunAsNonRoot: ptrTo(true),
			SeccompProfile: &v1.SeccompProfile{Type: v1.SeccompProfileTypeRuntimeDefault}}
		p.Spec.Containers[0].SecurityContext = &v1.SecurityContext{AllowPrivilegeEscalation: ptrTo(false),
			Capabilities: &v1.Capabilities{Drop: []v1.Capability{"ALL"}}}
	}
	return p
}

func ptrTo[T any](v T) *T { return &v }

func csc(p *v1.Pod) *v1.SecurityContext {
	if p.Spec.Containers[0].SecurityContext == nil {
		p.Spec.Containers[0].SecurityContext = &v1.SecurityContext{}
	}
	return p.Spec.Containers[0].SecurityContext
}

func podJSON(t *testing.T, p *v1.Pod) []byte {
	t.Helper()
	b, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

type admissionCase struct {
	name    string
	mutate  func(*v1.Pod)
	field   string // field path the failed reply must name
	control string // the PSS control as kubectl would print it
}

var baselineAdmissionCases = []admissionCase{
	{"hostnetwork", func(p *v1.Pod) { p.Spec.HostNetwork = true }, "spec.hostNetwork", "host namespaces (hostNetwork=true)"},
	{"hostpid", func(p *v1.Pod) { p.Spec.HostPID = true }, "spec.hostPID", "host namespaces (hostPID=true)"},
	{"hostipc", func(p *v1.Pod) { p.Spec.HostIPC = true }, "spec.hostIPC", "host namespaces (hostIPC=true)"},
	{"privileged", func(p *v1.Pod) { csc(p).Privileged = ptrTo(true); csc(p).AllowPrivilegeEscalation = nil },
		"spec.containers[0].securityContext.privileged", `privileged (container "c" must not set securityContext.privileged=true)`},
	{"capabilities", func(p *v1.Pod) {
		if csc(p).Capabilities == nil {
			csc(p).Capabilities = &v1.Capabilities{}
		}
		csc(p).Capabilities.Add = []v1.Capability{"SYS_ADMIN"}
	}, "spec.containers[0].securityContext.capabilities.add[0]", `capabilities (container "c" must not include "SYS_ADMIN" in securityContext.capabilities.add`},
	{"hostpath", func(p *v1.Pod) {
		p.Spec.Volumes = []v1.Volume{{Name: "etc", VolumeSource: v1.VolumeSource{HostPath: &v1.HostPathVolumeSource{Path: "/etc"}}}}
	}, "spec.volumes[0].hostPath.path", `volume "etc"`},
	{"hostport", func(p *v1.Pod) { p.Spec.Containers[0].Ports = []v1.ContainerPort{{ContainerPort: 80, HostPort: 8080}} },
		"spec.containers[0].ports[0].hostPort", `hostPort (container "c" uses hostPort 8080)`},
	{"apparmor", func(p *v1.Pod) { csc(p).AppArmorProfile = &v1.AppArmorProfile{Type: v1.AppArmorProfileTypeUnconfined} },
		"spec.containers[0].securityContext.appArmorProfile.type", `forbidden AppArmor profile (container "c" must not set AppArmor profile type to "Unconfined")`},
	{"selinux", func(p *v1.Pod) { csc(p).SELinuxOptions = &v1.SELinuxOptions{Type: "spc_t"} },
		"spec.containers[0].securityContext.seLinuxOptions", `seLinuxOptions (container "c" set forbidden securityContext.seLinuxOptions: type "spc_t")`},
	{"seccomp", func(p *v1.Pod) { csc(p).SeccompProfile = &v1.SeccompProfile{Type: v1.SeccompProfileTypeUnconfined} },
		"spec.containers[0].securityContext.seccompProfile.type", `seccompProfile (container "c" must not set securityContext.seccompProfile.type to "Unconfined")`},
	{"sysctl", func(p *v1.Pod) {
		if p.Spec.SecurityContext == nil {
			p.Spec.SecurityContext = &v1.PodSecurityContext{}
		}
		p.Spec.SecurityContext.Sysctls = []v1.Sysctl{{Name: "net.core.somaxconn", Value: "1024"}}
	}, "spec.securityContext.sysctls[0].name", "forbidden sysctls (net.core.somaxconn)"},
	{"probehost", func(p *v1.Pod) {
		p.Spec.Containers[0].LivenessProbe = &v1.Probe{ProbeHandler: v1.ProbeHandler{TCPSocket: &v1.TCPSocketAction{Host: "10.0.0.1", Port: intstr.FromInt32(22)}}}
	}, "spec.containers[0].livenessProbe.tcpSocket.host", "probe or lifecycle host"},
}

var restrictedAdmissionCases = []admissionCase{
	{"escalation", func(p *v1.Pod) { csc(p).AllowPrivilegeEscalation = nil },
		"spec.containers[0].securityContext.allowPrivilegeEscalation", `allowPrivilegeEscalation != false (container "c" must set securityContext.allowPrivilegeEscalation=false)`},
	{"nonroot", func(p *v1.Pod) { p.Spec.SecurityContext.RunAsNonRoot = nil },
		"spec.containers[0].securityContext.runAsNonRoot", `runAsNonRoot != true (pod or container "c" must set securityContext.runAsNonRoot=true)`},
	{"runasuser0", func(p *v1.Pod) { csc(p).RunAsUser = ptrTo(int64(0)) },
		"spec.containers[0].securityContext.runAsUser", `runAsUser=0 (container "c" must not set runAsUser=0)`},
	{"dropall", func(p *v1.Pod) { csc(p).Capabilities = nil },
		"spec.containers[0].securityContext.capabilities.drop", `unrestricted capabilities (container "c" must set securityContext.capabilities.drop=["ALL"])`},
	{"seccompunset", func(p *v1.Pod) { p.Spec.SecurityContext.SeccompProfile = nil },
		"spec.containers[0].securityContext.seccompProfile", `seccompProfile (pod or container "c" must set securityContext.seccompProfile.type to "RuntimeDefault" or "Localhost")`},
	{"procmount", func(p *v1.Pod) { p.Spec.HostUsers = ptrTo(false); csc(p).ProcMount = ptrTo(v1.UnmaskedProcMount) },
		"spec.containers[0].securityContext.procMount", `procMount (container "c" must not set securityContext.procMount to "Unmasked")`},
	{"volumetype", func(p *v1.Pod) {
		p.Spec.Volumes = []v1.Volume{{Name: "share", VolumeSource: v1.VolumeSource{NFS: &v1.NFSVolumeSource{Server: "nas", Path: "/x"}}}}
	}, "spec.volumes[0].nfs", `restricted volume types (volume "share" uses restricted volume type "nfs")`},
}

// checkRejected waits for the failed reply to id and checks that its
// message names the control under profile with its field path, and that
// the reply's errors list carries it.
func checkRejected(t *testing.T, op *Client, node, id, profile string, c admissionCase) {
	t.Helper()
	r := op.WaitReply(node, id, apiv1.Failed, 20*time.Second)
	if !strings.Contains(r.Message, fmt.Sprintf(`violates PodSecurity "%s:latest": `, profile)) {
		t.Errorf("%s (%s): failed reply %q does not say which profile it violates", c.name, profile, r.Message)
	}
	// The control's text is said in the summary; each field is named with
	// the control's reason.
	carries := func(msg string) bool {
		return strings.Contains(msg, c.field+": Forbidden: ") && strings.Contains(msg, c.control)
	}
	if !carries(r.Message) {
		t.Errorf("%s (%s): failed reply %q does not name %s with %q", c.name, profile, r.Message, c.field, c.control)
	}
	found := false
	for _, e := range r.Errors {
		found = found || carries(e)
	}
	if !found {
		t.Errorf("%s (%s): errors %q do not carry %s", c.name, profile, r.Errors, c.field)
	}
}

// TestAdmissionRejectsEachControl: under the default baseline profile
// and a restricted namespace, every Pod Security Standards control is
// refused with the control and its field path in the failed reply. No pod
// reaches the runtime, so no containerd is needed.
func TestAdmissionRejectsEachControl(t *testing.T) {
	b := mosquitto.Start(t)
	const node = "gw-pss"
	op := Connect(t, b.URL())
	op.Subscribe(prefix + "/" + node + "/#")
	a := StartAgent(t, AgentOpts{Node: node, Broker: b.URL(), Config: "admission:\n  namespaces: {strict: restricted}\n"})
	op.WaitState(0, node, "online", 10*time.Second)

	type sent struct {
		id, profile string
		c           admissionCase
	}
	var all []sent
	send := func(c admissionCase, ns, profile string) {
		p := admissionPod("p-"+c.name, ns, profile == "restricted")
		c.mutate(p)
		id := profile + "-" + c.name
		op.Command(node, "apply", id, podJSON(t, p))
		all = append(all, sent{id, profile, c})
	}
	for _, c := range baselineAdmissionCases {
		send(c, "default", "baseline")
		send(c, "strict", "restricted")
	}
	for _, c := range restrictedAdmissionCases {
		send(c, "strict", "restricted")
	}
	for _, s := range all {
		checkRejected(t, op, node, s.id, s.profile, s.c)
	}

	// Two violations at once: both listed, as kubectl lists PSA warnings.
	p := admissionPod("two", "default", false)
	p.Spec.HostNetwork = true
	csc(p).Privileged = ptrTo(true)
	op.Command(node, "apply", "two", podJSON(t, p))
	r := op.WaitReply(node, "two", apiv1.Failed, 20*time.Second)
	want := `Pod default/two: violates PodSecurity "baseline:latest": host namespaces (hostNetwork=true), privileged (container "c" must not set securityContext.privileged=true); ` +
		`2 errors: spec.hostNetwork: Forbidden: host namespaces; ` +
		`spec.containers[0].securityContext.privileged: Forbidden: privileged`
	if !strings.Contains(r.Message, want) {
		t.Errorf("message\n%s\nlacks\n%s", r.Message, want)
	}

	// Refused at every profile: a sysctl that would change the host, a
	// volume type mqlet cannot mount, a Localhost seccomp profile.
	p = admissionPod("node-level", "default", false)
	p.Spec.SecurityContext = &v1.PodSecurityContext{Sysctls: []v1.Sysctl{{Name: "kernel.panic", Value: "1"}}}
	p.Spec.Volumes = []v1.Volume{{Name: "e", VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}},
		{Name: "share", VolumeSource: v1.VolumeSource{NFS: &v1.NFSVolumeSource{Server: "nas", Path: "/x"}}}}
	csc(p).SeccompProfile = &v1.SeccompProfile{Type: v1.SeccompProfileTypeLocalhost, LocalhostProfile: ptrTo("p.json")}
	op.Command(node, "apply", "node-level", podJSON(t, p))
	r = op.WaitReply(node, "node-level", apiv1.Failed, 20*time.Second)
	for _, want := range []string{`spec.securityContext.sysctls[0].name: Forbidden: sysctl "kernel.panic" is not isolated per pod`,
		"spec.volumes[1].nfs: Forbidden: mqlet does not support nfs volumes",
		"spec.containers[0].securityContext.seccompProfile.type: Forbidden: mqlet does not support Localhost seccomp profiles"} {
		if !strings.Contains(r.Message, want) {
			t.Errorf("message %q lacks %q", r.Message, want)
		}
	}
	if !a.Running() {
		t.Fatal("mqlet stopped")
	}
}

// TestAdmissionPrivilegedNamespaceAndNodeProfile: a namespace set to
// privileged takes what baseline refuses, yet not a host sysctl; a node-wide
// restricted profile refuses a plain root pod.
func TestAdmissionPrivilegedNamespaceAndNodeProfile(t *testing.T) {
	b := mosquitto.Start(t)
	const node = "gw-pss-ns"
	op := Connect(t, b.URL())
	op.Subscribe(prefix + "/" + node + "/#")
	StartAgent(t, AgentOpts{Node: node, Broker: b.URL(),
		Config: "admission:\n  profile: restricted\n  namespaces: {kube-system: privileged}\n  allowedHostPorts: [\"8080\", \"30000-32767\"]\n"})
	op.WaitState(0, node, "online", 10*time.Second)

	p := admissionPod("infra", "kube-system", false)
	p.Spec.HostNetwork = true
	csc(p).Privileged = ptrTo(true)
	op.Command(node, "apply", "infra", podJSON(t, p))
	op.WaitReply(node, "infra", apiv1.Accepted, 20*time.Second)

	p = admissionPod("infra-sysctl", "kube-system", false)
	p.Spec.SecurityContext = &v1.PodSecurityContext{Sysctls: []v1.Sysctl{{Name: "vm.swappiness", Value: "1"}}}
	op.Command(node, "apply", "infra-sysctl", podJSON(t, p))
	if r := op.WaitReply(node, "infra-sysctl", apiv1.Failed, 20*time.Second); !strings.Contains(r.Message, "spec.securityContext.sysctls[0].name") {
		t.Errorf("host sysctl in a privileged namespace: %q", r.Message)
	}

	op.Command(node, "apply", "plain", podJSON(t, admissionPod("plain", "default", false)))
	checkRejected(t, op, node, "plain", "restricted", restrictedAdmissionCases[1])

	// allowedHostPorts waives hostPort for the listed ports only.
	p = admissionPod("ports", "default", true)
	p.Spec.Containers[0].Ports = []v1.ContainerPort{{ContainerPort: 80, HostPort: 8080}, {ContainerPort: 81, HostPort: 31000}}
	op.Command(node, "apply", "ports-ok", podJSON(t, p))
	op.WaitReply(node, "ports-ok", apiv1.Accepted, 20*time.Second)
	p.Spec.Containers[0].Ports = append(p.Spec.Containers[0].Ports, v1.ContainerPort{ContainerPort: 82, HostPort: 8081})
	op.Command(node, "apply", "ports-bad", podJSON(t, p))
	r := op.WaitReply(node, "ports-bad", apiv1.Failed, 20*time.Second)
	if !strings.Contains(r.Message, "spec.containers[0].ports[2].hostPort") || strings.Contains(r.Message, "ports[0]") || strings.Contains(r.Message, "ports[1]") {
		t.Errorf("hostPort 8081 refused alone? %q", r.Message)
	}
}

// TestAdmissionEnvDoublingAnsweredFast: an env whose values double through
// $(VAR) references 40 times (a terabyte once expanded) is answered failed
// without being expanded, and mqlet keeps serving.
func TestAdmissionEnvDoublingAnsweredFast(t *testing.T) {
	b := mosquitto.Start(t)
	const node = "gw-pss-env"
	op := Connect(t, b.URL())
	op.Subscribe(prefix + "/" + node + "/#")
	a := StartAgent(t, AgentOpts{Node: node, Broker: b.URL()})
	op.WaitState(0, node, "online", 10*time.Second)

	p := admissionPod("bomb", "default", false)
	env := []v1.EnvVar{{Name: "V0", Value: "xx"}}
	for i := 1; i <= 40; i++ {
		env = append(env, v1.EnvVar{Name: fmt.Sprintf("V%d", i), Value: fmt.Sprintf("$(V%d)$(V%d)", i-1, i-1)})
	}
	p.Spec.Containers[0].Env = env
	p.Spec.Containers[0].Args = []string{"$(V40)"}
	start := time.Now()
	op.Command(node, "apply", "bomb", podJSON(t, p))
	r := op.WaitReply(node, "bomb", apiv1.Failed, 20*time.Second)
	t.Logf("doubling env answered failed in %v", time.Since(start))
	// "xx" doubled 14 times is 32 KiB, the bound; the 15th doubling is over it.
	if !strings.Contains(r.Message, "spec.containers[0].env[15].value: Forbidden: expands to more than 32768 bytes") {
		t.Errorf("failed reply %q does not name env[15].value and the bound", r.Message)
	}
	op.Command(node, "get", "after", []byte(`{}`))
	op.WaitReply(node, "after", apiv1.Succeeded, 20*time.Second)
	if !a.Running() {
		t.Fatal("mqlet stopped")
	}
	hwm := procStatusKB(t, a.pid(), "VmHWM")
	t.Logf("mqlet VmHWM after refusing the doubling env: %d kB", hwm)
	if hwm > 100<<10 {
		t.Fatalf("mqlet peak RSS %d kB, want under 100 MB", hwm)
	}
}

func TestAdmissionBadProfileExits2(t *testing.T) {
	a := StartAgent(t, AgentOpts{Node: "gw-pss-cfg", Config: "admission:\n  profile: lax\n"})
	if code := a.ExitCode(10 * time.Second); code != 2 {
		t.Fatalf("exit code %d, want 2", code)
	}
	if !strings.Contains(a.Logs(), "admission.profile") {
		t.Fatalf("message does not name admission.profile:\n%s", a.Logs())
	}
}

// TestAdmissionSymlinkPivotRefused: a pod allowed a hostPath plants a
// link "<allowed>/pivot -> /"; a second pod asking for "<allowed>/pivot"
// (or beneath it) is refused, naming where the link leads.
func TestAdmissionSymlinkPivotRefused(t *testing.T) {
	allowed := filepath.Join(t.TempDir(), "allowed")
	if err := os.MkdirAll(allowed, 0o755); err != nil {
		t.Fatal(err)
	}
	e := newPodEnv(t, fmt.Sprintf("admission:\n  allowedHostPaths: [%q]\n", allowed))

	planter := admissionPod("planter", e.ns, false)
	planter.Spec.TerminationGracePeriodSeconds = ptrTo(int64(2))
	planter.Spec.Volumes = []v1.Volume{{Name: "host", VolumeSource: v1.VolumeSource{HostPath: &v1.HostPathVolumeSource{Path: allowed}}}}
	planter.Spec.Containers[0].VolumeMounts = []v1.VolumeMount{{Name: "host", MountPath: "/host"}}
	planter.Spec.Containers[0].Command = []string{"sh", "-c", "ln -s / /host/pivot && sleep 3600"}
	e.cleanupPods("planter")
	e.apply(podJSON(t, planter), apiv1.Succeeded, podReadyTimeout)
	pivot := filepath.Join(allowed, "pivot")
	Eventually(t, 30*time.Second, "the planted link", func() bool {
		target, err := os.Readlink(pivot)
		return err == nil && target == "/"
	})

	for i, path := range []string{pivot, filepath.Join(pivot, "etc"), filepath.Join(pivot, "root", "new")} {
		p := admissionPod(fmt.Sprintf("pivot%d", i), e.ns, false)
		p.Spec.Volumes = []v1.Volume{{Name: "host", VolumeSource: v1.VolumeSource{HostPath: &v1.HostPathVolumeSource{Path: path}}}}
		p.Spec.Containers[0].VolumeMounts = []v1.VolumeMount{{Name: "host", MountPath: "/host"}}
		r := e.apply(podJSON(t, p), apiv1.Failed, 20*time.Second)
		if !strings.Contains(r.Message, "spec.volumes[0].hostPath.path: Forbidden") || !strings.Contains(r.Message, "resolves to") {
			t.Errorf("hostPath %s: failed reply %q does not name the path and where it leads", path, r.Message)
		}
		if len(e.cri.Sandboxes(e.ns, p.Name)) != 0 {
			t.Errorf("refused pod %s has a sandbox", p.Name)
		}
	}
}
