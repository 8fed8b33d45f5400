package cri

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/rs/zerolog"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

type fakeObjects struct {
	configMaps map[string]*v1.ConfigMap
	secrets    map[string]*v1.Secret
}

func (f fakeObjects) ConfigMap(ns, name string) (*v1.ConfigMap, error) {
	if cm, ok := f.configMaps[ns+"/"+name]; ok {
		return cm, nil
	}
	return nil, fmt.Errorf("configmap %s/%s not found", ns, name)
}

func (f fakeObjects) Secret(ns, name string) (*v1.Secret, error) {
	if s, ok := f.secrets[ns+"/"+name]; ok {
		return s, nil
	}
	return nil, fmt.Errorf("secret %s/%s not found", ns, name)
}

// testUID is a pod uid of the only form the runtime builds paths from.
const testUID = "0b6c1a52-7d1e-4c55-9a3e-2f1d8e4b7a01"

func testManager(t *testing.T) *Manager {
	dir := t.TempDir()
	resolv := filepath.Join(dir, "resolv.conf")
	if err := os.WriteFile(resolv, []byte("# c\nnameserver 10.0.0.53\nsearch lan example\noptions ndots:2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// Secret and downward volumes are tmpfs mounts: gone before the
	// temporary directory is removed.
	t.Cleanup(func() { _ = unmountAll(filepath.Join(dir, "pods")) })
	return newManager(Config{PodLogDir: filepath.Join(dir, "logs"), PodDir: filepath.Join(dir, "pods"), ResolvConf: resolv}, zerolog.Nop(), dialCRI)
}

func TestBuildSandboxConfig(t *testing.T) {
	m := testManager(t)
	tests := []struct {
		name  string
		edit  func(*v1.Pod)
		check func(t *testing.T, c *runtimeapi.PodSandboxConfig)
	}{
		{"pod network", func(*v1.Pod) {}, func(t *testing.T, c *runtimeapi.PodSandboxConfig) {
			if c.Hostname != "web" || c.Linux.SecurityContext.NamespaceOptions.Network != runtimeapi.NamespaceMode_POD {
				t.Errorf("hostname %q network %v", c.Hostname, c.Linux.SecurityContext.NamespaceOptions.Network)
			}
			if c.Linux.CgroupParent != "/mqlet/pod"+testUID || c.LogDirectory != filepath.Join(m.cfg.PodLogDir, "default_web_"+testUID) {
				t.Errorf("cgroup %q logdir %q", c.Linux.CgroupParent, c.LogDirectory)
			}
			if c.Labels[LabelManaged] != "true" || c.Labels[LabelPodUID] != testUID || c.Metadata.Attempt != 2 {
				t.Errorf("labels %v metadata %v", c.Labels, c.Metadata)
			}
			if !slices.Equal(c.DnsConfig.Servers, []string{"10.0.0.53"}) || !slices.Equal(c.DnsConfig.Searches, []string{"lan", "example"}) {
				t.Errorf("dns %v", c.DnsConfig)
			}
		}},
		{"host network has no hostname", func(p *v1.Pod) { p.Spec.HostNetwork = true; p.Spec.HostPID = true }, func(t *testing.T, c *runtimeapi.PodSandboxConfig) {
			ns := c.Linux.SecurityContext.NamespaceOptions
			if c.Hostname != "" || ns.Network != runtimeapi.NamespaceMode_NODE || ns.Pid != runtimeapi.NamespaceMode_NODE {
				t.Errorf("hostname %q ns %v", c.Hostname, ns)
			}
		}},
		{"host ports", func(p *v1.Pod) {
			p.Spec.Containers[0].Ports = []v1.ContainerPort{{ContainerPort: 80, HostPort: 8080, Protocol: v1.ProtocolUDP}, {ContainerPort: 81}}
		}, func(t *testing.T, c *runtimeapi.PodSandboxConfig) {
			if len(c.PortMappings) != 1 || c.PortMappings[0].HostPort != 8080 || c.PortMappings[0].Protocol != runtimeapi.Protocol_UDP {
				t.Errorf("ports %v", c.PortMappings)
			}
		}},
		{"dns policy None", func(p *v1.Pod) {
			p.Spec.DNSPolicy = v1.DNSNone
			p.Spec.DNSConfig = &v1.PodDNSConfig{Nameservers: []string{"1.1.1.1"}}
		}, func(t *testing.T, c *runtimeapi.PodSandboxConfig) {
			if !slices.Equal(c.DnsConfig.Servers, []string{"1.1.1.1"}) || len(c.DnsConfig.Searches) != 0 {
				t.Errorf("dns %v", c.DnsConfig)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pod := testPod(v1.RestartPolicyAlways, nil, "a")
			tt.edit(pod)
			cfg, err := m.buildSandboxConfig(pod, 2)
			if err != nil {
				t.Fatal(err)
			}
			tt.check(t, cfg)
		})
	}
}

func TestBuildContainerConfig(t *testing.T) {
	m := testManager(t)
	objects := fakeObjects{
		configMaps: map[string]*v1.ConfigMap{"default/cfg": {Data: map[string]string{"MODE": "fast", "LEVEL": "3"}}},
		secrets:    map[string]*v1.Secret{"default/sec": {Data: map[string][]byte{"token": []byte("s3cret")}}},
	}
	pod := testPod(v1.RestartPolicyAlways, nil, "app")
	c := &pod.Spec.Containers[0]
	c.Command = []string{"sh", "-c"}
	c.Args = []string{"echo $(GREETING)"}
	c.EnvFrom = []v1.EnvFromSource{{Prefix: "CFG_", ConfigMapRef: &v1.ConfigMapEnvSource{LocalObjectReference: v1.LocalObjectReference{Name: "cfg"}}}}
	c.Env = []v1.EnvVar{
		{Name: "GREETING", Value: "hi-$(CFG_MODE)"},
		{Name: "TOKEN", ValueFrom: &v1.EnvVarSource{SecretKeyRef: &v1.SecretKeySelector{LocalObjectReference: v1.LocalObjectReference{Name: "sec"}, Key: "token"}}},
		{Name: "POD", ValueFrom: &v1.EnvVarSource{FieldRef: &v1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
		{Name: "IP", ValueFrom: &v1.EnvVarSource{FieldRef: &v1.ObjectFieldSelector{FieldPath: "status.podIP"}}},
		{Name: "CFG_LEVEL", Value: "override"},
	}
	c.Resources = v1.ResourceRequirements{
		Requests: v1.ResourceList{v1.ResourceCPU: resource.MustParse("250m")},
		Limits:   v1.ResourceList{v1.ResourceCPU: resource.MustParse("500m"), v1.ResourceMemory: resource.MustParse("64Mi")},
	}
	uid := int64(1000)
	ro := true
	c.SecurityContext = &v1.SecurityContext{RunAsUser: &uid, ReadOnlyRootFilesystem: &ro,
		Capabilities: &v1.Capabilities{Add: []v1.Capability{"NET_ADMIN"}, Drop: []v1.Capability{"ALL"}}}

	cfg, err := m.buildContainerConfig(pod, c, containerParams{restartCount: 3, podIP: "10.1.2.3", imageRef: "sha256:abc"}, objects)
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{}
	for _, kv := range cfg.Envs {
		env[kv.Key] = string(kv.Value)
	}
	want := map[string]string{"CFG_MODE": "fast", "CFG_LEVEL": "override", "GREETING": "hi-fast", "TOKEN": "s3cret", "POD": "web", "IP": "10.1.2.3"}
	for k, v := range want {
		if env[k] != v {
			t.Errorf("env %s = %q, want %q", k, env[k], v)
		}
	}
	if cfg.Args[0] != "echo hi-fast" || cfg.LogPath != "app/3.log" || cfg.Metadata.Attempt != 3 {
		t.Errorf("args %v logpath %q attempt %d", cfg.Args, cfg.LogPath, cfg.Metadata.Attempt)
	}
	if cfg.Annotations[AnnotationContainerHash] != HashContainer(c) || cfg.Annotations[AnnotationRestartCount] != "3" {
		t.Errorf("annotations %v", cfg.Annotations)
	}
	r := cfg.Linux.Resources
	if r.CpuShares != 256 || r.CpuQuota != 50000 || r.CpuPeriod != 100000 || r.MemoryLimitInBytes != 64<<20 {
		t.Errorf("resources %v", r)
	}
	sc := cfg.Linux.SecurityContext
	if sc.RunAsUser.GetValue() != 1000 || !sc.ReadonlyRootfs || !slices.Equal(sc.Capabilities.AddCapabilities, []string{"NET_ADMIN"}) ||
		!slices.Equal(sc.Capabilities.DropCapabilities, []string{"ALL"}) {
		t.Errorf("security %v", sc)
	}

	// A missing, non-optional key is an error that says which.
	c.Env = append(c.Env, v1.EnvVar{Name: "X", ValueFrom: &v1.EnvVarSource{ConfigMapKeyRef: &v1.ConfigMapKeySelector{LocalObjectReference: v1.LocalObjectReference{Name: "cfg"}, Key: "nope"}}})
	if _, err := m.buildContainerConfig(pod, c, containerParams{}, objects); err == nil {
		t.Fatal("missing configmap key accepted")
	}
}

func TestVolumes(t *testing.T) {
	m := testManager(t)
	pod := testPod(v1.RestartPolicyAlways, nil, "app")
	pod.Spec.Volumes = []v1.Volume{
		{Name: "scratch", VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}},
		{Name: "cfg", VolumeSource: v1.VolumeSource{ConfigMap: &v1.ConfigMapVolumeSource{LocalObjectReference: v1.LocalObjectReference{Name: "cfg"}}}},
		{Name: "sec", VolumeSource: v1.VolumeSource{Secret: &v1.SecretVolumeSource{SecretName: "sec"}}},
	}
	pod.Spec.Containers[0].VolumeMounts = []v1.VolumeMount{{Name: "sec", MountPath: "/sec"}, {Name: "scratch", MountPath: "/scratch"}}
	objects := fakeObjects{
		configMaps: map[string]*v1.ConfigMap{"default/cfg": {Data: map[string]string{"a.conf": "one"}}},
		secrets:    map[string]*v1.Secret{"default/sec": {Data: map[string][]byte{"token": []byte("s3cret")}}},
	}
	paths, err := m.prepareVolumes(pod, objects)
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(paths["cfg"], "a.conf"))
	if err != nil || string(data) != "one" {
		t.Fatalf("configmap file %q %v", data, err)
	}
	info, err := os.Stat(filepath.Join(paths["sec"], "token"))
	if err != nil || info.Mode().Perm() != 0o400 {
		t.Fatalf("secret file mode %v %v", info, err)
	}
	// An update replaces the content; a removed key disappears.
	objects.configMaps["default/cfg"] = &v1.ConfigMap{Data: map[string]string{"b.conf": "two"}}
	if _, err := m.prepareVolumes(pod, objects); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(paths["cfg"], "a.conf")); !os.IsNotExist(err) {
		t.Fatalf("removed key still present: %v", err)
	}
	if data, _ := os.ReadFile(filepath.Join(paths["cfg"], "b.conf")); string(data) != "two" {
		t.Fatalf("updated key %q", data)
	}
	mounts, err := m.containerMounts(pod, &pod.Spec.Containers[0], paths, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(mounts) != 2 || !mounts[0].Readonly || mounts[1].Readonly {
		t.Fatalf("mounts %v", mounts)
	}
}

func TestDiffContainers(t *testing.T) {
	old := map[string]plegRecord{"a": {"p1", ContainerRunning}, "b": {"p1", ContainerRunning}, "c": {"p2", ContainerExited}}
	cur := map[string]plegRecord{"a": {"p1", ContainerRunning}, "b": {"p1", ContainerExited}, "d": {"p2", ContainerRunning}}
	got := map[string]PodLifecycleEventType{}
	for _, ev := range diffContainers(old, cur) {
		got[ev.ContainerID+"/"+string(ev.Type)] = ev.Type
	}
	want := []string{"b/ContainerDied", "d/ContainerStarted", "c/ContainerRemoved"}
	if len(got) != len(want) {
		t.Fatalf("events %v, want %v", got, want)
	}
	for _, w := range want {
		if _, ok := got[w]; !ok {
			t.Errorf("missing %s in %v", w, got)
		}
	}
}
