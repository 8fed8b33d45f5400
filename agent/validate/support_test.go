package validate

import (
	"flag"
	"fmt"
	"maps"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

var updateDoc = flag.Bool("update", false, "rewrite docs/pod-fields.md from the support table")

// supportType is a core/v1 struct type the support table must cover, with
// the field paths (in JSON form, [*] for any element) where pods use it.
type supportType struct {
	t     reflect.Type
	paths []string
}

// supportTypes walks v1.PodSpec the way CheckSupport does with rules: into
// the type of every honoured field (and inlined structs), not below rejected
// or ignored ones; with all, into every field. Types come in the order they
// are first met.
func supportTypes(rules supportRules, all bool) []*supportType {
	var order []*supportType
	byType := map[reflect.Type]*supportType{}
	var visit func(t reflect.Type, path string)
	visit = func(t reflect.Type, path string) {
		for {
			switch t.Kind() {
			case reflect.Pointer:
				t = t.Elem()
				continue
			case reflect.Slice, reflect.Map:
				t, path = t.Elem(), path+"[*]"
				continue
			}
			break
		}
		if t.Kind() != reflect.Struct || t.PkgPath() != corePkg {
			return
		}
		st, seen := byType[t]
		if !seen {
			st = &supportType{t: t}
			byType[t] = st
			order = append(order, st)
		}
		if slices.Contains(st.paths, path) || (all && seen) {
			return
		}
		st.paths = append(st.paths, path)
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			if f.Anonymous {
				visit(f.Type, path)
				continue
			}
			if r, ok := rules[t.Name()+"."+jsonName(f)]; all || (ok && r.support == Honoured) {
				visit(f.Type, path+"."+jsonName(f))
			}
		}
	}
	visit(reflect.TypeOf(v1.PodSpec{}), "spec")
	return order
}

// missingRows are the fields CheckSupport reaches with rules that have no row.
func missingRows(rules supportRules) []string {
	var missing []string
	for _, st := range supportTypes(rules, false) {
		for i := 0; i < st.t.NumField(); i++ {
			f := st.t.Field(i)
			if f.Anonymous || !f.IsExported() {
				continue
			}
			if key := st.t.Name() + "." + jsonName(f); rules[key].support == "" {
				missing = append(missing, key+" (at "+strings.Join(st.paths, ", ")+")")
			}
		}
	}
	return missing
}

// A field of v1.PodSpec, or of any type below an honoured field, without a
// row would be refused at run time as unknown: a Kubernetes upgrade that adds
// a field must decide here what mqlet does with it.
func TestSupportTableCovers(t *testing.T) {
	for _, m := range missingRows(supportTable) {
		t.Errorf("support table has no row for %s: say whether mqlet honours, rejects or ignores it", m)
	}
	exists := map[string]bool{}
	for _, st := range supportTypes(supportTable, true) {
		for i := 0; i < st.t.NumField(); i++ {
			exists[st.t.Name()+"."+jsonName(st.t.Field(i))] = true
		}
	}
	for key, r := range supportTable {
		if !exists[key] {
			t.Errorf("support table row %s names no field of v1.PodSpec or of a type below it", key)
		}
		if r.why == "" && r.support != Honoured {
			t.Errorf("support table row %s is %s without saying why", key, r.support)
		}
		if r.support == Rejected && !strings.HasPrefix(r.why, "mqlet ") {
			t.Errorf("support table row %s: a rejection says what mqlet does not do, got %q", key, r.why)
		}
		if (r.allowed == nil && r.allowedAt == nil) != (r.unless == "") {
			t.Errorf("support table row %s: an exception needs both its test and its description", key)
		}
	}
}

// Honouring probes, hooks, downward API, projected volumes and hostAliases
// is one row each: the rows below them are written, and what must stay
// refused (token and trust bundle projections) stays refused.
func TestSupportFlipsAreOneRow(t *testing.T) {
	flipped := maps.Clone(supportTable)
	for _, key := range []string{"Container.livenessProbe", "Container.readinessProbe", "Container.startupProbe", "Container.lifecycle",
		"VolumeSource.downwardAPI", "VolumeSource.projected", "EnvVarSource.resourceFieldRef", "PodSpec.hostAliases"} {
		flipped[key] = honoured("")
	}
	if m := missingRows(flipped); len(m) > 0 {
		t.Errorf("flipped rows need more rows: %v", m)
	}
	pod := basePod()
	pod.Spec.Volumes = []v1.Volume{{Name: "t", VolumeSource: v1.VolumeSource{Projected: &v1.ProjectedVolumeSource{Sources: []v1.VolumeProjection{
		{ConfigMap: &v1.ConfigMapProjection{LocalObjectReference: v1.LocalObjectReference{Name: "cm"}}},
		{ServiceAccountToken: &v1.ServiceAccountTokenProjection{Path: "token"}},
		{ClusterTrustBundle: &v1.ClusterTrustBundleProjection{Path: "ca"}}}}}}}
	pod.Spec.Containers[0].LivenessProbe = &v1.Probe{ProbeHandler: v1.ProbeHandler{Exec: &v1.ExecAction{Command: []string{"true"}}}, PeriodSeconds: 10}
	var got []string
	for _, e := range flipped.check(pod) {
		got = append(got, e.Error())
	}
	want := []string{
		"spec.volumes[0].projected.sources[1].serviceAccountToken: Forbidden: mqlet does not support serviceAccountToken projections (mqlet has no API server to issue tokens)",
		"spec.volumes[0].projected.sources[2].clusterTrustBundle: Forbidden: mqlet does not support clusterTrustBundle projections (mqlet has no API server to hold ClusterTrustBundles)",
	}
	if !slices.Equal(got, want) {
		t.Errorf("with projected volumes honoured:\n got %q\nwant %q", got, want)
	}
}

// Fields the issue names as not honoured today must each be refused.
func TestCheckSupportRejects(t *testing.T) {
	always := v1.ContainerRestartPolicyAlways
	tests := []struct {
		name   string
		mutate func(*v1.Pod)
		want   string // field: detail fragment
	}{
		{"nfs volume", func(p *v1.Pod) {
			p.Spec.Volumes = []v1.Volume{{Name: "n", VolumeSource: v1.VolumeSource{NFS: &v1.NFSVolumeSource{Server: "nas", Path: "/x"}}}}
		}, "spec.volumes[0].nfs: Forbidden: mqlet does not support nfs volumes"},
		{"csi volume", func(p *v1.Pod) {
			p.Spec.Volumes = []v1.Volume{{Name: "c", VolumeSource: v1.VolumeSource{CSI: &v1.CSIVolumeSource{Driver: "x"}}}}
		}, "spec.volumes[0].csi: Forbidden: mqlet does not support csi volumes"},
		{"pvc volume", func(p *v1.Pod) {
			p.Spec.Volumes = []v1.Volume{{Name: "c", VolumeSource: v1.VolumeSource{PersistentVolumeClaim: &v1.PersistentVolumeClaimVolumeSource{ClaimName: "x"}}}}
		}, "spec.volumes[0].persistentVolumeClaim: Forbidden"},
		{"projected serviceAccountToken", func(p *v1.Pod) {
			p.Spec.Volumes = []v1.Volume{{Name: "t", VolumeSource: v1.VolumeSource{Projected: &v1.ProjectedVolumeSource{
				Sources: []v1.VolumeProjection{{ServiceAccountToken: &v1.ServiceAccountTokenProjection{Path: "token"}}}}}}}
		}, "spec.volumes[0].projected.sources[0].serviceAccountToken: Forbidden: mqlet does not support serviceAccountToken projections"},
		{"ephemeral containers", func(p *v1.Pod) {
			p.Spec.EphemeralContainers = []v1.EphemeralContainer{{EphemeralContainerCommon: v1.EphemeralContainerCommon{Name: "d", Image: "busybox"}}}
		}, "spec.ephemeralContainers: Forbidden: mqlet does not support ephemeral containers"},
		{"stopSignal", func(p *v1.Pod) {
			sig := v1.SIGUSR1
			p.Spec.OS = &v1.PodOS{Name: v1.Linux}
			p.Spec.Containers[0].Lifecycle = &v1.Lifecycle{StopSignal: &sig}
		}, "spec.containers[0].lifecycle.stopSignal: Forbidden: mqlet does not support stopSignal"},
		{"restartPolicy of an app container", func(p *v1.Pod) {
			p.Spec.Containers[0].RestartPolicy = &always
		}, "spec.containers[0].restartPolicy: Forbidden"},
		{"init container restartPolicy other than Always", func(p *v1.Pod) {
			never := v1.ContainerRestartPolicyNever
			p.Spec.InitContainers = []v1.Container{{Name: "side", Image: "busybox", RestartPolicy: &never}}
		}, `spec.initContainers[0].restartPolicy: Forbidden: mqlet supports a container's restartPolicy only as Always on an init container (a sidecar), not restart rules: "Never"`},
		{"readinessGates", func(p *v1.Pod) { p.Spec.ReadinessGates = []v1.PodReadinessGate{{ConditionType: "x"}} }, "spec.readinessGates: Forbidden"},
		{"schedulingGates", func(p *v1.Pod) { p.Spec.SchedulingGates = []v1.PodSchedulingGate{{Name: "x"}} }, "spec.schedulingGates: Forbidden"},
		{"resourceClaims", func(p *v1.Pod) { p.Spec.ResourceClaims = []v1.PodResourceClaim{{Name: "x"}} }, "spec.resourceClaims: Forbidden"},
		{"hugepages limit", func(p *v1.Pod) {
			p.Spec.Containers[0].Resources.Limits = v1.ResourceList{"hugepages-2Mi": resource.MustParse("2Mi"), v1.ResourceMemory: resource.MustParse("64Mi")}
		}, "spec.containers[0].resources.limits: Forbidden: mqlet enforces only cpu, memory and ephemeral-storage limits"},
		{"bidirectional propagation", func(p *v1.Pod) {
			prop := v1.MountPropagationBidirectional
			p.Spec.Volumes = []v1.Volume{{Name: "e", VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}}}
			p.Spec.Containers[0].VolumeMounts = []v1.VolumeMount{{Name: "e", MountPath: "/e", MountPropagation: &prop}}
		}, "spec.containers[0].volumeMounts[0].mountPropagation: Forbidden"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pod := basePod()
			tt.mutate(pod)
			DefaultPod(pod)
			got := FormatErrors(CheckSupport(pod))
			if !strings.Contains(got, tt.want) {
				t.Errorf("CheckSupport: want %q in %q", tt.want, got)
			}
			// And through the whole validation, as an apply is judged.
			pod = basePod()
			tt.mutate(pod)
			if got := FormatErrors(ValidatePod(pod, node, Policy{Profile: ProfilePrivileged})); !strings.Contains(got, tt.want) {
				t.Errorf("ValidatePod: want %q in %q", tt.want, got)
			}
		})
	}
}

// Every rejected field of one pod is named at once, not the first only.
func TestCheckSupportReportsAll(t *testing.T) {
	pod := basePod()
	pod.Spec.SchedulingGates = []v1.PodSchedulingGate{{Name: "x"}}
	pod.Spec.ReadinessGates = []v1.PodReadinessGate{{ConditionType: "x"}}
	pod.Spec.Containers = append(pod.Spec.Containers, v1.Container{Name: "b", Image: "busybox",
		ReadinessProbe: &v1.Probe{ProbeHandler: v1.ProbeHandler{Exec: &v1.ExecAction{Command: []string{"true"}}}},
		Lifecycle:      &v1.Lifecycle{PostStart: &v1.LifecycleHandler{Exec: &v1.ExecAction{Command: []string{"true"}}}},
		VolumeDevices:  []v1.VolumeDevice{{Name: "d", DevicePath: "/dev/d"}}})
	DefaultPod(pod)
	var got []string
	for _, e := range CheckSupport(pod) {
		got = append(got, e.Field)
	}
	want := []string{"spec.containers[1].volumeDevices", "spec.readinessGates", "spec.schedulingGates"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("CheckSupport fields = %v, want %v", got, want)
	}
}

// What a kubelet runs and mqlet honours passes, defaults included.
func TestCheckSupportAccepts(t *testing.T) {
	pod := basePod()
	c := &pod.Spec.Containers[0]
	c.Env = []v1.EnvVar{
		{Name: "A", Value: "x"},
		{Name: "NAME", ValueFrom: &v1.EnvVarSource{FieldRef: &v1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
		{Name: "APP", ValueFrom: &v1.EnvVarSource{FieldRef: &v1.ObjectFieldSelector{FieldPath: "metadata.labels['app']"}}},
		{Name: "IP", ValueFrom: &v1.EnvVarSource{FieldRef: &v1.ObjectFieldSelector{FieldPath: "status.podIP"}}},
		{Name: "K", ValueFrom: &v1.EnvVarSource{ConfigMapKeyRef: &v1.ConfigMapKeySelector{LocalObjectReference: v1.LocalObjectReference{Name: "cm"}, Key: "k"}}},
	}
	c.Resources = v1.ResourceRequirements{Limits: v1.ResourceList{v1.ResourceCPU: resource.MustParse("500m"), v1.ResourceMemory: resource.MustParse("64Mi")}}
	none := v1.MountPropagationNone
	c.VolumeMounts = []v1.VolumeMount{{Name: "cfg", MountPath: "/cfg", ReadOnly: true, MountPropagation: &none}, {Name: "scratch", MountPath: "/s", SubPath: "x"}}
	c.SecurityContext = &v1.SecurityContext{RunAsUser: ptr(int64(1000)), RunAsNonRoot: ptr(true), ReadOnlyRootFilesystem: ptr(true),
		AllowPrivilegeEscalation: ptr(false), Capabilities: &v1.Capabilities{Drop: []v1.Capability{"ALL"}},
		SeccompProfile: &v1.SeccompProfile{Type: v1.SeccompProfileTypeRuntimeDefault}}
	pod.Spec.Volumes = []v1.Volume{
		{Name: "cfg", VolumeSource: v1.VolumeSource{ConfigMap: &v1.ConfigMapVolumeSource{LocalObjectReference: v1.LocalObjectReference{Name: "cm"},
			Items: []v1.KeyToPath{{Key: "k", Path: "k.conf", Mode: ptr(int32(0o600))}}}}},
		{Name: "scratch", VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}},
	}
	pod.Spec.NodeSelector = map[string]string{"zone": "a"}
	pod.Spec.Affinity = &v1.Affinity{
		NodeAffinity: &v1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &v1.NodeSelector{NodeSelectorTerms: []v1.NodeSelectorTerm{
			{MatchExpressions: []v1.NodeSelectorRequirement{{Key: "zone", Operator: v1.NodeSelectorOpIn, Values: []string{"a"}}}}}}},
		PodAntiAffinity: &v1.PodAntiAffinity{RequiredDuringSchedulingIgnoredDuringExecution: []v1.PodAffinityTerm{{TopologyKey: "kubernetes.io/hostname"}}},
	}
	pod.Spec.Tolerations = []v1.Toleration{{Key: "k", Operator: v1.TolerationOpExists}}
	pod.Spec.PriorityClassName = "high"
	always := v1.ContainerRestartPolicyAlways
	pod.Spec.InitContainers = []v1.Container{{Name: "init", Image: "busybox", Command: []string{"true"}},
		{Name: "sidecar", Image: "busybox", RestartPolicy: &always,
			StartupProbe: &v1.Probe{ProbeHandler: v1.ProbeHandler{Exec: &v1.ExecAction{Command: []string{"true"}}}}}}
	c.Ports = []v1.ContainerPort{{Name: "web", ContainerPort: 8080}}
	grace, h2 := int64(3), v1.HTTPProtocolHTTP2
	c.LivenessProbe = &v1.Probe{ProbeHandler: v1.ProbeHandler{HTTPGet: &v1.HTTPGetAction{Path: "/healthz", Port: intstr.FromString("web"),
		Scheme: v1.URISchemeHTTP, Protocol: &h2, HTTPHeaders: []v1.HTTPHeader{{Name: "X", Value: "y"}}}},
		InitialDelaySeconds: 5, PeriodSeconds: 2, TimeoutSeconds: 1, FailureThreshold: 3, TerminationGracePeriodSeconds: &grace}
	c.ReadinessProbe = &v1.Probe{ProbeHandler: v1.ProbeHandler{TCPSocket: &v1.TCPSocketAction{Port: intstr.FromInt32(8080)}}, SuccessThreshold: 2}
	tlsMode := v1.GRPCProbeModeTLS
	c.StartupProbe = &v1.Probe{ProbeHandler: v1.ProbeHandler{GRPC: &v1.GRPCAction{Port: 9000, Service: ptr("db"), Mode: &tlsMode}}}
	c.Lifecycle = &v1.Lifecycle{PostStart: &v1.LifecycleHandler{HTTPGet: &v1.HTTPGetAction{Path: "/up", Port: intstr.FromString("web")}},
		PreStop: &v1.LifecycleHandler{Sleep: &v1.SleepAction{Seconds: 1}}}
	pod.Spec.Containers = append(pod.Spec.Containers, v1.Container{Name: "exec", Image: "busybox",
		LivenessProbe: &v1.Probe{ProbeHandler: v1.ProbeHandler{Exec: &v1.ExecAction{Command: []string{"cat", "/tmp/ok"}}}}})
	DefaultPod(pod)
	if errs := CheckSupport(pod); len(errs) > 0 {
		t.Errorf("CheckSupport refused an honoured pod: %s", FormatErrors(errs))
	}
}

// A field the table has no row for (as after a Kubernetes upgrade) is
// refused, not ignored.
func TestCheckSupportUnknownField(t *testing.T) {
	var errs field.ErrorList
	type PodSpec struct { // stands in for a v1.PodSpec with a new field
		NewThing string `json:"newThing"`
	}
	supportTable.walkFields(field.NewPath("spec"), reflect.ValueOf(PodSpec{NewThing: "x"}), &errs)
	if len(errs) != 1 || errs[0].Field != "spec.newThing" {
		t.Fatalf("unknown field: got %v, want one error on spec.newThing", errs)
	}
}

const podFieldsDoc = "../../docs/pod-fields.md"

// docs/pod-fields.md is the support table; `go generate ./agent/validate`
// rewrites it.
func TestPodFieldsDoc(t *testing.T) {
	want := podFieldsMarkdown()
	if *updateDoc {
		if err := os.WriteFile(podFieldsDoc, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(podFieldsDoc)
	if err != nil {
		t.Fatalf("reading %s: %v (run go generate ./agent/validate)", podFieldsDoc, err)
	}
	if string(got) != want {
		t.Errorf("%s is not the support table: run go generate ./agent/validate", podFieldsDoc)
	}
}

func podFieldsMarkdown() string {
	var b strings.Builder
	counts := map[Support]int{}
	types := supportTypes(supportTable, false)
	fields := 0
	for _, st := range types {
		for i := 0; i < st.t.NumField(); i++ {
			if f := st.t.Field(i); !f.Anonymous && f.IsExported() {
				counts[supportTable[st.t.Name()+"."+jsonName(f)].support]++
				fields++
			}
		}
	}
	fmt.Fprintf(&b, "# Pod fields: what mqlet does with each\n\n")
	fmt.Fprintf(&b, "<!-- Generated from agent/validate/support.go by `go generate ./agent/validate`; do not edit. -->\n\n")
	fmt.Fprintf(&b, "Every field of a pod's spec, and of every type below a field mqlet honours, is one of:\n\n")
	fmt.Fprintf(&b, "- **honoured**: mqlet does what a kubelet does with it (notes say where it differs or what admission decides);\n")
	fmt.Fprintf(&b, "- **rejected**: a pod setting it (to a value other than the ones named) is refused at validation with\n")
	fmt.Fprintf(&b, "  the field's path and the reason, e.g. `spec.volumes[0].nfs: Forbidden: mqlet does not support nfs volumes`;\n")
	fmt.Fprintf(&b, "- **ignored**: accepted and not acted on, because a kubelet on a single node ignores it too (why is given).\n\n")
	fmt.Fprintf(&b, "Below a rejected or ignored field nothing is listed: it is refused or skipped whole. A field this\n")
	fmt.Fprintf(&b, "table does not know (a newer Kubernetes) is refused; a unit test fails until it has a row.\n\n")
	fmt.Fprintf(&b, "%d fields: %d honoured, %d rejected, %d ignored.\n", fields, counts[Honoured], counts[Rejected], counts[Ignored])
	for _, st := range types {
		fmt.Fprintf(&b, "\n## %s\n\n", st.t.Name())
		paths := make([]string, len(st.paths))
		for i, p := range st.paths {
			paths[i] = "`" + p + "`"
		}
		fmt.Fprintf(&b, "At %s.\n\n", strings.Join(paths, ", "))
		fmt.Fprintf(&b, "| Field | mqlet | Why / note |\n|---|---|---|\n")
		for i := 0; i < st.t.NumField(); i++ {
			f := st.t.Field(i)
			if f.Anonymous || !f.IsExported() {
				continue
			}
			name := jsonName(f)
			r := supportTable[st.t.Name()+"."+name]
			verdict := string(r.support)
			if r.unless != "" {
				verdict += " unless " + r.unless
			}
			fmt.Fprintf(&b, "| `%s` | %s | %s |\n", name, strings.ReplaceAll(verdict, "|", "\\|"), strings.ReplaceAll(r.why, "|", "\\|"))
		}
	}
	return b.String()
}

// Fields the runtime now honours (downward API, /etc/hosts, volumes,
// fsGroup, ephemeral storage) pass the table.
func TestCheckSupportAcceptsHonouredDownwardAndVolumeFields(t *testing.T) {
	seven := int64(7)
	tests := map[string]func(*v1.Pod){
		"downwardAPI volume": func(p *v1.Pod) {
			p.Spec.Volumes = []v1.Volume{{Name: "d", VolumeSource: v1.VolumeSource{DownwardAPI: &v1.DownwardAPIVolumeSource{}}}}
		},
		"fieldRef spec.nodeName": func(p *v1.Pod) {
			p.Spec.Containers[0].Env = []v1.EnvVar{{Name: "N", ValueFrom: &v1.EnvVarSource{FieldRef: &v1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}}}
		},
		"fieldRef status.hostIP": func(p *v1.Pod) {
			p.Spec.Containers[0].Env = []v1.EnvVar{{Name: "N", ValueFrom: &v1.EnvVarSource{FieldRef: &v1.ObjectFieldSelector{FieldPath: "status.hostIP"}}}}
		},
		"resourceFieldRef": func(p *v1.Pod) {
			p.Spec.Containers[0].Env = []v1.EnvVar{{Name: "N", ValueFrom: &v1.EnvVarSource{ResourceFieldRef: &v1.ResourceFieldSelector{Resource: "limits.cpu"}}}}
		},
		"fsGroup":     func(p *v1.Pod) { p.Spec.SecurityContext = &v1.PodSecurityContext{FSGroup: &seven} },
		"hostAliases": func(p *v1.Pod) { p.Spec.HostAliases = []v1.HostAlias{{IP: "10.0.0.1", Hostnames: []string{"a"}}} },
		"emptyDir on disk with a size (evicted past it)": func(p *v1.Pod) {
			size := resource.MustParse("16Mi")
			p.Spec.Volumes = []v1.Volume{{Name: "e", VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{SizeLimit: &size}}}}
		},
		"ephemeral-storage requests and limits": func(p *v1.Pod) {
			p.Spec.Containers[0].Resources = v1.ResourceRequirements{
				Requests: v1.ResourceList{v1.ResourceEphemeralStorage: resource.MustParse("1Mi")},
				Limits:   v1.ResourceList{v1.ResourceEphemeralStorage: resource.MustParse("2Mi")}}
		},
		"emptyDir Memory with a size": func(p *v1.Pod) {
			size := resource.MustParse("16Mi")
			p.Spec.Volumes = []v1.Volume{{Name: "m", VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{Medium: v1.StorageMediumMemory, SizeLimit: &size}}}}
		},
	}
	for name, mutate := range tests {
		t.Run(name, func(t *testing.T) {
			pod := basePod()
			mutate(pod)
			if errs := ValidatePod(pod, node, Policy{Profile: ProfilePrivileged}); len(errs) > 0 {
				t.Errorf("refused: %s", FormatErrors(errs))
			}
		})
	}
}
