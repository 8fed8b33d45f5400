package validate

import (
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

const node = "gw-1"

func basePod() *v1.Pod {
	return &v1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec:       v1.PodSpec{Containers: []v1.Container{{Name: "nginx", Image: "nginx:1.27"}}},
	}
}

func hostPathVolume(p string) v1.Volume {
	return v1.Volume{Name: "host", VolumeSource: v1.VolumeSource{HostPath: &v1.HostPathVolumeSource{Path: p}}}
}

func ptr[T any](v T) *T { return &v }

func TestValidatePod(t *testing.T) {
	dataPolicy := Policy{AllowedHostPaths: []string{"/data/x", "/data"}}
	tests := []struct {
		name   string
		mutate func(*v1.Pod)
		policy Policy
		want   []string // field paths that must be reported; none means valid
	}{
		{"valid pod", func(*v1.Pod) {}, Policy{}, nil},
		{"uppercase name", func(p *v1.Pod) { p.Name = "Web" }, Policy{}, []string{"metadata.name"}},
		{"missing image", func(p *v1.Pod) { p.Spec.Containers[0].Image = "" }, Policy{}, []string{"spec.containers[0].image"}},
		{"no containers", func(p *v1.Pod) { p.Spec.Containers = nil }, Policy{}, []string{"spec.containers"}},
		{"privileged denied", func(p *v1.Pod) {
			p.Spec.Containers[0].SecurityContext = &v1.SecurityContext{Privileged: ptr(true)}
		}, Policy{}, []string{"spec.containers[0].securityContext.privileged"}},
		{"privileged allowed", func(p *v1.Pod) {
			p.Spec.Containers[0].SecurityContext = &v1.SecurityContext{Privileged: ptr(true)}
		}, Policy{AllowPrivileged: true}, nil},
		{"privileged init container", func(p *v1.Pod) {
			p.Spec.InitContainers = []v1.Container{{Name: "init", Image: "busybox:1.36",
				SecurityContext: &v1.SecurityContext{Privileged: ptr(true)}}}
		}, Policy{}, []string{"spec.initContainers[0].securityContext.privileged"}},
		{"privileged ephemeral container", func(p *v1.Pod) {
			p.Spec.EphemeralContainers = []v1.EphemeralContainer{{EphemeralContainerCommon: v1.EphemeralContainerCommon{
				Name: "debug", Image: "busybox:1.36", SecurityContext: &v1.SecurityContext{Privileged: ptr(true)}}}}
		}, Policy{}, []string{"spec.ephemeralContainers[0].securityContext.privileged", "spec.ephemeralContainers"}},
		{"hostPath /etc denied", func(p *v1.Pod) { p.Spec.Volumes = []v1.Volume{hostPathVolume("/etc")} },
			dataPolicy, []string{"spec.volumes[0].hostPath.path"}},
		{"hostPath under allowed", func(p *v1.Pod) { p.Spec.Volumes = []v1.Volume{hostPathVolume("/data/x/logs")} },
			Policy{AllowedHostPaths: []string{"/data/x"}}, nil},
		{"hostPath equal to allowed with trailing slash", func(p *v1.Pod) { p.Spec.Volumes = []v1.Volume{hostPathVolume("/data/x/")} },
			Policy{AllowedHostPaths: []string{"/data/x"}}, nil},
		{"hostPath sibling prefix trick", func(p *v1.Pod) { p.Spec.Volumes = []v1.Volume{hostPathVolume("/data/xy")} },
			Policy{AllowedHostPaths: []string{"/data/x"}}, []string{"spec.volumes[0].hostPath.path"}},
		{"hostPath /database vs /data", func(p *v1.Pod) { p.Spec.Volumes = []v1.Volume{hostPathVolume("/database")} },
			Policy{AllowedHostPaths: []string{"/data"}}, []string{"spec.volumes[0].hostPath.path"}},
		{"hostPath dot-dot escape", func(p *v1.Pod) { p.Spec.Volumes = []v1.Volume{hostPathVolume("/data/../etc")} },
			dataPolicy, []string{"spec.volumes[0].hostPath.path"}},
		{"hostPath with no policy", func(p *v1.Pod) { p.Spec.Volumes = []v1.Volume{hostPathVolume("/data/x")} },
			Policy{}, []string{"spec.volumes[0].hostPath.path"}},
		{"hostNetwork denied", func(p *v1.Pod) { p.Spec.HostNetwork = true }, Policy{}, []string{"spec.hostNetwork"}},
		{"hostNetwork allowed", func(p *v1.Pod) { p.Spec.HostNetwork = true }, Policy{AllowHostNetwork: true}, nil},
		{"hostPID and hostIPC denied", func(p *v1.Pod) { p.Spec.HostPID = true; p.Spec.HostIPC = true },
			Policy{AllowHostNetwork: true}, []string{"spec.hostPID", "spec.hostIPC"}},
		{"capability not listed", func(p *v1.Pod) {
			p.Spec.Containers[0].SecurityContext = &v1.SecurityContext{Capabilities: &v1.Capabilities{Add: []v1.Capability{"NET_BIND_SERVICE", "SYS_ADMIN"}}}
		}, Policy{AllowedCapabilities: []string{"CAP_NET_BIND_SERVICE"}}, []string{"spec.containers[0].securityContext.capabilities.add[1]"}},
		{"capability ALL not implied", func(p *v1.Pod) {
			p.Spec.Containers[0].SecurityContext = &v1.SecurityContext{Capabilities: &v1.Capabilities{Add: []v1.Capability{"ALL"}}}
		}, Policy{AllowedCapabilities: []string{"NET_ADMIN", "SYS_ADMIN"}}, []string{"spec.containers[0].securityContext.capabilities.add[0]"}},
		{"capabilities listed", func(p *v1.Pod) {
			p.Spec.Containers[0].SecurityContext = &v1.SecurityContext{Capabilities: &v1.Capabilities{Add: []v1.Capability{"NET_ADMIN"}, Drop: []v1.Capability{"ALL"}}}
		}, Policy{AllowedCapabilities: []string{"net_admin"}}, nil},
		{"wrong node", func(p *v1.Pod) { p.Spec.NodeName = "gw-2" }, Policy{}, []string{"spec.nodeName"}},
		{"own node", func(p *v1.Pod) { p.Spec.NodeName = node }, Policy{}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pod := basePod()
			tt.mutate(pod)
			errs := ValidatePod(pod, node, tt.policy)
			if len(tt.want) == 0 {
				if len(errs) != 0 {
					t.Fatalf("want valid, got %s", FormatErrors(errs))
				}
				return
			}
			if len(errs) == 0 {
				t.Fatalf("want errors on %v, got none", tt.want)
			}
			for _, w := range tt.want {
				if !hasField(errs, w) {
					t.Errorf("no error on %s in %s", w, FormatErrors(errs))
				}
			}
			for _, e := range errs {
				if e.Field == "" {
					t.Errorf("error without field path: %v", e)
				}
			}
		})
	}
}

func hasField(errs field.ErrorList, path string) bool {
	for _, e := range errs {
		if e.Field == path {
			return true
		}
	}
	return false
}

func TestValidatePodDoesNotMutate(t *testing.T) {
	pod := basePod()
	if errs := ValidatePod(pod, node, Policy{}); len(errs) != 0 {
		t.Fatal(FormatErrors(errs))
	}
	if pod.Namespace != "" || pod.Spec.RestartPolicy != "" {
		t.Fatalf("ValidatePod changed its argument: %+v", pod)
	}
}

func TestDefaultPod(t *testing.T) {
	pod := basePod()
	pod.Spec.InitContainers = []v1.Container{{Name: "init", Image: "busybox"}}
	DefaultPod(pod)
	c := pod.Spec.Containers[0]
	checks := []struct {
		what      string
		got, want any
	}{
		{"namespace", pod.Namespace, "default"},
		{"restartPolicy", pod.Spec.RestartPolicy, v1.RestartPolicyAlways},
		{"dnsPolicy", pod.Spec.DNSPolicy, v1.DNSClusterFirst},
		{"terminationGracePeriodSeconds", *pod.Spec.TerminationGracePeriodSeconds, int64(30)},
		{"imagePullPolicy tagged", c.ImagePullPolicy, v1.PullIfNotPresent},
		{"imagePullPolicy untagged", pod.Spec.InitContainers[0].ImagePullPolicy, v1.PullAlways},
		{"terminationMessagePath", c.TerminationMessagePath, "/dev/termination-log"},
		{"terminationMessagePolicy", c.TerminationMessagePolicy, v1.TerminationMessageReadFile},
	}
	for _, ch := range checks {
		if ch.got != ch.want {
			t.Errorf("%s = %v, want %v", ch.what, ch.got, ch.want)
		}
	}
	if errs := ValidatePod(pod, node, Policy{}); len(errs) != 0 {
		t.Fatalf("defaulted pod invalid: %s", FormatErrors(errs))
	}
}

func TestValidateConfigMapAndSecret(t *testing.T) {
	good := &v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "cfg"}, Data: map[string]string{"app.conf": "x"}}
	if errs := ValidateConfigMap(good); len(errs) != 0 {
		t.Fatalf("valid config map rejected: %s", FormatErrors(errs))
	}
	bad := &v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "Cfg"}, Data: map[string]string{"bad key!": "x"}}
	errs := ValidateConfigMap(bad)
	if !hasField(errs, "metadata.name") || !hasField(errs, "data[bad key!]") {
		t.Fatalf("want errors on metadata.name and data key, got %s", FormatErrors(errs))
	}

	secret := &v1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "s"}, StringData: map[string]string{"password": "hunter2"}}
	if errs := ValidateSecret(secret); len(errs) != 0 {
		t.Fatalf("valid secret rejected: %s", FormatErrors(errs))
	}
	badSecret := &v1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "s"}, Type: v1.SecretTypeTLS,
		Data: map[string][]byte{"tls.crt": []byte("hunter2")}}
	errs = ValidateSecret(badSecret)
	if !hasField(errs, "data[tls.key]") {
		t.Fatalf("want an error on the missing tls.key, got %s", FormatErrors(errs))
	}
	if strings.Contains(FormatErrors(errs), "hunter2") {
		t.Fatalf("secret value leaked into %q", FormatErrors(errs))
	}
}

func TestFormatErrors(t *testing.T) {
	pod := basePod()
	pod.Name = "Web"
	pod.Spec.Containers[0].Image = ""
	pod.Spec.HostNetwork = true
	errs := ValidatePod(pod, node, Policy{})
	msg := FormatErrors(errs)
	for _, want := range []string{"metadata.name", "spec.containers[0].image", "spec.hostNetwork", "errors:"} {
		if !strings.Contains(msg, want) {
			t.Errorf("%q lacks %q", msg, want)
		}
	}
	if FormatErrors(nil) != "" {
		t.Errorf("FormatErrors(nil) = %q", FormatErrors(nil))
	}
	one := FormatErrors(field.ErrorList{field.Required(field.NewPath("spec", "x"), "")})
	if !strings.HasPrefix(one, "1 error: spec.x: Required value") {
		t.Errorf("single error rendered as %q", one)
	}
}

func TestRedactSecret(t *testing.T) {
	s := &v1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "s", Annotations: map[string]string{v1.LastAppliedConfigAnnotation: `{"stringData":{"b":"topsecret"}}`, "keep": "me"}},
		Data:       map[string][]byte{"a": []byte("hunter2")},
		StringData: map[string]string{"b": "topsecret"},
	}
	r := RedactSecret(s)
	if string(r.Data["a"]) != "<redacted: 7 bytes>" || string(r.Data["b"]) != "<redacted: 9 bytes>" || r.StringData != nil {
		t.Fatalf("not redacted: %+v", r)
	}
	if _, ok := r.Annotations[v1.LastAppliedConfigAnnotation]; ok || r.Annotations["keep"] != "me" {
		t.Fatalf("annotations wrong: %v", r.Annotations)
	}
	if string(s.Data["a"]) != "hunter2" || s.StringData["b"] != "topsecret" || s.Annotations[v1.LastAppliedConfigAnnotation] == "" {
		t.Fatal("RedactSecret changed the original")
	}
	if RedactSecret(nil) != nil {
		t.Fatal("RedactSecret(nil) != nil")
	}
}

func TestPolicyJSONTags(t *testing.T) {
	var p Policy
	if err := jsonUnmarshal([]byte(`{"allowPrivileged":true,"allowedHostPaths":["/data"],"allowedCapabilities":["NET_ADMIN"],"allowHostNetwork":true}`), &p); err != nil {
		t.Fatal(err)
	}
	if !p.AllowPrivileged || !p.AllowHostNetwork || p.AllowHostPID || len(p.AllowedHostPaths) != 1 || p.AllowedCapabilities[0] != "NET_ADMIN" {
		t.Fatalf("policy decoded wrongly: %+v", p)
	}
}
