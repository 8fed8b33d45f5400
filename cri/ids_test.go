package cri

import (
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// newTestUID returns a random UUID (version 4 layout).
func newTestUID() types.UID {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	b[6], b[8] = b[6]&0x0f|0x40, b[8]&0x3f|0x80
	return types.UID(fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16]))
}

func TestIsUIDAcceptsOnlyCanonicalUUIDs(t *testing.T) {
	for uid, want := range map[string]bool{
		testUID:                                  true,
		string(newTestUID()):                     true,
		"":                                       false,
		"../../x":                                false,
		"uid-1":                                  false,
		"{" + testUID + "}":                      false,
		"urn:uuid:" + testUID:                    false,
		testUID + "/..":                          false,
		strings.ReplaceAll(testUID, "-", ""):     false,
		"0b6c1a52-7d1e-4c55-9a3e-2f1d8e4b7a0/":   false,
		"0b6c1a52-7d1e-4c55-9a3e-2f1d8e4b7a01\n": false,
	} {
		if IsUID(uid) != want {
			t.Errorf("IsUID(%q) = %v, want %v", uid, !want, want)
		}
	}
}

// Every path the runtime builds from a pod refuses a hostile uid or name
// before anything touches the disk.
func TestHostilePodIdentityBuildsNoPath(t *testing.T) {
	m := testManager(t)
	base := filepath.Dir(m.cfg.PodDir)
	for _, c := range []struct{ uid, name, ns string }{
		{"../../escaped", "web", "default"},
		{testUID, "../web", "default"},
		{testUID, "web", "de/fault"},
		{testUID, "a_b", "default"},
	} {
		pod := testPod(v1.RestartPolicyAlways, nil, "app")
		pod.UID, pod.Name, pod.Namespace = types.UID(c.uid), c.name, c.ns
		pod.Spec.Volumes = []v1.Volume{{Name: "scratch", VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}}}
		if err := m.createPodDirs(pod); err == nil {
			t.Errorf("%+v: createPodDirs accepted", c)
		}
		if _, err := m.buildSandboxConfig(pod, 0); err == nil {
			t.Errorf("%+v: buildSandboxConfig accepted", c)
		}
		if c.uid != testUID {
			if _, err := m.prepareVolumes(pod, fakeObjects{}); err == nil {
				t.Errorf("%+v: prepareVolumes accepted", c)
			}
			if _, err := m.podCgroupParent(c.uid); err == nil {
				t.Errorf("%+v: podCgroupParent accepted", c)
			}
		}
		if err := m.removePodDirs(c.uid, c.name, c.ns); err != nil {
			t.Errorf("%+v: removePodDirs: %v", c, err)
		}
	}
	// Nothing was made or removed outside the pods and logs directories.
	entries, err := os.ReadDir(base)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if n := e.Name(); n != "pods" && n != "logs" && n != "resolv.conf" {
			t.Errorf("unexpected %s next to the pods directory", n)
		}
	}
	pod := testPod(v1.RestartPolicyAlways, nil, "app")
	pod.Spec.Containers[0].Name = "../x"
	if _, err := m.buildContainerConfig(pod, &pod.Spec.Containers[0], containerParams{}, fakeObjects{}); err == nil {
		t.Error("a container name that is not a DNS label was accepted")
	}
	pod = testPod(v1.RestartPolicyAlways, nil, "app")
	pod.Spec.Volumes = []v1.Volume{{Name: "../../v", VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}}}
	if _, err := m.prepareVolumes(pod, fakeObjects{}); err == nil {
		t.Error("a volume name that is not a DNS label was accepted")
	}
}

func TestChildOfRefusesAnythingButAPlainName(t *testing.T) {
	for _, name := range []string{"", ".", "..", "a/b", "../x"} {
		if _, err := childOf("/base", name); err == nil {
			t.Errorf("childOf(%q) accepted", name)
		}
	}
	if p, err := childOf("/base/", "x"); err != nil || p != "/base/x" {
		t.Fatalf("childOf(x) = %q, %v", p, err)
	}
}
