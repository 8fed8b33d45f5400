package cri

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func downwardPod() *v1.Pod {
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "apps", UID: "0d7c3a0e-8d0c-4f0e-9d7e-1b2c3d4e5f60",
			Labels: map[string]string{"app": "web", "tier": "front"}, Annotations: map[string]string{"note": "a \"quoted\"\nline"}},
		Spec: v1.PodSpec{NodeName: "gw-1", ServiceAccountName: "robot", Containers: []v1.Container{{
			Name: "main",
			Resources: v1.ResourceRequirements{
				Limits:   v1.ResourceList{v1.ResourceMemory: resource.MustParse("64Mi")},
				Requests: v1.ResourceList{v1.ResourceCPU: resource.MustParse("250m")},
			},
		}, {Name: "side"}}},
	}
}

func TestPodFieldValue(t *testing.T) {
	pod := downwardPod()
	d := downwardValues{podIPs: []string{"10.0.0.5", "fd00::5"}, hostIPs: []string{"192.168.1.2", "192.168.1.3"}}
	cases := map[string]string{
		"metadata.name":                "web",
		"metadata.namespace":           "apps",
		"metadata.uid":                 string(pod.UID),
		"metadata.labels['tier']":      "front",
		"metadata.labels['missing']":   "",
		"metadata.labels":              "app=\"web\"\ntier=\"front\"",
		"metadata.annotations['note']": "a \"quoted\"\nline",
		"metadata.annotations":         `note="a \"quoted\"\nline"`,
		"spec.nodeName":                "gw-1",
		"spec.serviceAccountName":      "robot",
		"status.hostIP":                "192.168.1.2",
		"status.hostIPs":               "192.168.1.2,192.168.1.3",
		"status.podIP":                 "10.0.0.5",
		"status.podIPs":                "10.0.0.5,fd00::5",
	}
	for path, want := range cases {
		got, err := podFieldValue(pod, &v1.ObjectFieldSelector{FieldPath: path}, d)
		if err != nil || got != want {
			t.Errorf("%s = %q, %v; want %q", path, got, err, want)
		}
	}
	for _, bad := range []string{"spec.containers", "metadata.name['x']", "status.phase", "metadata.labels['bad key!']"} {
		if got, err := podFieldValue(pod, &v1.ObjectFieldSelector{FieldPath: bad}, d); err == nil {
			t.Errorf("%s resolved to %q, want an error", bad, got)
		}
	}
	if _, err := podFieldValue(pod, &v1.ObjectFieldSelector{FieldPath: "status.hostIP"}, downwardValues{}); err == nil {
		t.Error("status.hostIP without node addresses resolved")
	}
}

func TestResourceFieldValue(t *testing.T) {
	pod := downwardPod()
	d := downwardValues{allocatable: v1.ResourceList{
		v1.ResourceCPU: resource.MustParse("2"), v1.ResourceMemory: resource.MustParse("1Gi"),
	}}
	main, side := &pod.Spec.Containers[0], &pod.Spec.Containers[1]
	mi := resource.MustParse("1Mi")
	m1 := resource.MustParse("1m")
	cases := []struct {
		c    *v1.Container
		fs   v1.ResourceFieldSelector
		want string
	}{
		{main, v1.ResourceFieldSelector{Resource: "limits.memory"}, "67108864"},
		{main, v1.ResourceFieldSelector{Resource: "limits.memory", Divisor: mi}, "64"},
		{main, v1.ResourceFieldSelector{Resource: "requests.cpu", Divisor: m1}, "250"},
		{main, v1.ResourceFieldSelector{Resource: "requests.cpu"}, "1"}, // rounded up, as in the kubelet
		// No limit: the node's allocatable.
		{main, v1.ResourceFieldSelector{Resource: "limits.cpu"}, "2"},
		{side, v1.ResourceFieldSelector{Resource: "limits.memory", Divisor: mi}, "1024"},
		// Another container named in the selector.
		{side, v1.ResourceFieldSelector{ContainerName: "main", Resource: "limits.memory", Divisor: mi}, "64"},
	}
	for _, c := range cases {
		got, err := resourceFieldValue(pod, c.c, &c.fs, d)
		if err != nil || got != c.want {
			t.Errorf("%s %+v = %q, %v; want %q", c.c.Name, c.fs, got, err, c.want)
		}
	}
	if _, err := resourceFieldValue(pod, main, &v1.ResourceFieldSelector{ContainerName: "nope", Resource: "limits.cpu"}, d); err == nil {
		t.Error("unknown container resolved")
	}
}

// The env of a container reads fieldRef and resourceFieldRef.
func TestResolveEnvDownward(t *testing.T) {
	pod := downwardPod()
	pod.Spec.Containers[0].Env = []v1.EnvVar{
		{Name: "NODE", ValueFrom: &v1.EnvVarSource{FieldRef: &v1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}},
		{Name: "MEM", ValueFrom: &v1.EnvVarSource{ResourceFieldRef: &v1.ResourceFieldSelector{Resource: "limits.memory", Divisor: resource.MustParse("1Mi")}}},
		{Name: "BOTH", Value: "$(NODE)-$(MEM)"},
	}
	env, err := resolveEnv(pod, &pod.Spec.Containers[0], downwardValues{}, fakeObjects{})
	if err != nil {
		t.Fatal(err)
	}
	got := envMap(env)
	if got["NODE"] != "gw-1" || got["MEM"] != "64" || got["BOTH"] != "gw-1-64" {
		t.Fatalf("env = %v", got)
	}
}

func TestMemTotal(t *testing.T) {
	p := filepath.Join(t.TempDir(), "meminfo")
	if err := os.WriteFile(p, []byte("MemFree: 1 kB\nMemTotal:       2048 kB\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if n, err := memTotal(p); err != nil || n != 2048<<10 {
		t.Fatalf("memTotal = %d, %v", n, err)
	}
	if err := os.WriteFile(p, []byte("MemFree: 1 kB\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := memTotal(p); err == nil || !strings.Contains(err.Error(), "MemTotal") {
		t.Fatalf("memTotal without the line: %v", err)
	}
}

// fileKeyRef reads a key of an env file in a volume, opened beneath it:
// a symlink out, a FIFO or an oversized file is refused.
func TestFileKeyValue(t *testing.T) {
	vol, outside := t.TempDir(), t.TempDir()
	must(t, os.WriteFile(filepath.Join(vol, "app.env"), []byte("# written by init\nTOKEN='abc def'\nEMPTY=''\n"), 0o644))
	must(t, os.WriteFile(filepath.Join(outside, "host.env"), []byte("TOKEN='host'\n"), 0o644))
	must(t, os.Symlink(filepath.Join(outside, "host.env"), filepath.Join(vol, "link.env")))
	must(t, unix.Mkfifo(filepath.Join(vol, "fifo.env"), 0o644))
	must(t, os.WriteFile(filepath.Join(vol, "big.env"), make([]byte, maxEnvFileBytes+1), 0o644))
	d := downwardValues{volumes: map[string]string{"cfg": vol}}
	yes := true
	if v, ok, err := fileKeyValue(&v1.FileKeySelector{VolumeName: "cfg", Path: "app.env", Key: "TOKEN"}, d); err != nil || !ok || v != "abc def" {
		t.Errorf("TOKEN = %q %v %v", v, ok, err)
	}
	if _, ok, err := fileKeyValue(&v1.FileKeySelector{VolumeName: "cfg", Path: "app.env", Key: "NONE", Optional: &yes}, d); err != nil || ok {
		t.Errorf("optional missing key: %v %v", ok, err)
	}
	for _, sel := range []v1.FileKeySelector{
		{VolumeName: "cfg", Path: "app.env", Key: "NONE"},
		{VolumeName: "other", Path: "app.env", Key: "TOKEN"},
		{VolumeName: "cfg", Path: "link.env", Key: "TOKEN"},
		{VolumeName: "cfg", Path: "fifo.env", Key: "TOKEN"},
		{VolumeName: "cfg", Path: "big.env", Key: "TOKEN"},
		{VolumeName: "cfg", Path: "../x", Key: "TOKEN"},
	} {
		if v, _, err := fileKeyValue(&sel, d); err == nil {
			t.Errorf("%+v resolved to %q", sel, v)
		}
	}
}
