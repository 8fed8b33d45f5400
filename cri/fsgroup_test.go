package cri

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
)

func groupOf(t *testing.T, p string) (uint32, uint32) {
	t.Helper()
	var st unix.Stat_t
	must(t, unix.Lstat(p, &st))
	return st.Gid, st.Mode & 0o7777
}

// fsGroup gives an emptyDir (and what is in it) the group, group
// read-write and setgid directories, never through a planted symlink;
// configMap and secret volumes get the group with group read, and an
// unchanged volume is not rewritten for it.
func TestFSGroupVolumes(t *testing.T) {
	requireRoot(t)
	m := testManager(t)
	gid := int64(2000)
	objects := fakeObjects{
		configMaps: map[string]*v1.ConfigMap{"default/cfg": {Data: map[string]string{"k": "v"}}},
		secrets:    map[string]*v1.Secret{"default/sec": {Data: map[string][]byte{"pw": []byte("x")}}},
	}
	pod := volumePod(
		v1.Volume{Name: "scratch", VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}},
		v1.Volume{Name: "cfg", VolumeSource: v1.VolumeSource{ConfigMap: &v1.ConfigMapVolumeSource{LocalObjectReference: v1.LocalObjectReference{Name: "cfg"}}}},
		v1.Volume{Name: "sec", VolumeSource: v1.VolumeSource{Secret: &v1.SecretVolumeSource{SecretName: "sec"}}},
	)
	pod.Spec.SecurityContext = &v1.PodSecurityContext{FSGroup: &gid}
	paths, err := m.prepareVolumes(pod, objects)
	if err != nil {
		t.Fatal(err)
	}
	if g, mode := groupOf(t, paths["scratch"]); g != 2000 || mode != 0o2777 {
		t.Errorf("emptyDir: group %d mode %#o, want 2000 02777", g, mode)
	}
	// What a container left there: a file, a directory, a symlink out.
	outside := filepath.Join(t.TempDir(), "host-file")
	must(t, os.WriteFile(outside, []byte("h"), 0o600))
	must(t, os.Mkdir(filepath.Join(paths["scratch"], "d"), 0o700))
	must(t, os.WriteFile(filepath.Join(paths["scratch"], "d", "f"), []byte("f"), 0o600))
	must(t, os.Symlink(outside, filepath.Join(paths["scratch"], "out")))
	if paths, err = m.prepareVolumes(pod, objects); err != nil { // fsGroupChangePolicy Always: walked again
		t.Fatal(err)
	}
	for p, want := range map[string]uint32{"d": 0o2770, "d/f": 0o660} {
		if g, mode := groupOf(t, filepath.Join(paths["scratch"], p)); g != 2000 || mode != want {
			t.Errorf("%s: group %d mode %#o, want 2000 %#o", p, g, mode, want)
		}
	}
	if g, mode := groupOf(t, outside); g != 0 || mode != 0o600 {
		t.Errorf("the symlink's target changed: group %d mode %#o", g, mode)
	}
	for vol, file := range map[string]string{"cfg": "k", "sec": "pw"} {
		want := map[string]uint32{"cfg": 0o644, "sec": 0o440}[vol]
		if g, mode := groupOf(t, filepath.Join(paths[vol], dataLink+"/"+file)); g != 2000 || mode != want {
			t.Errorf("%s/%s: group %d mode %#o, want 2000 %#o", vol, file, g, mode, want)
		}
		if g, mode := groupOf(t, paths[vol]); g != 2000 || mode&unix.S_ISGID == 0 {
			t.Errorf("%s root: group %d mode %#o", vol, g, mode)
		}
	}
	gen, _ := os.Readlink(filepath.Join(paths["sec"], dataLink))
	if _, err := m.prepareVolumes(pod, objects); err != nil {
		t.Fatal(err)
	}
	if again, _ := os.Readlink(filepath.Join(paths["sec"], dataLink)); again != gen {
		t.Error("an unchanged secret volume was rewritten")
	}

	// OnRootMismatch: a matching root is not walked.
	policy := v1.FSGroupChangeOnRootMismatch
	pod.Spec.SecurityContext.FSGroupChangePolicy = &policy
	must(t, os.Chown(filepath.Join(paths["scratch"], "d", "f"), 0, 0))
	if _, err := m.prepareVolumes(pod, objects); err != nil {
		t.Fatal(err)
	}
	if g, _ := groupOf(t, filepath.Join(paths["scratch"], "d", "f")); g != 0 {
		t.Errorf("OnRootMismatch walked a matching volume (group %d)", g)
	}
	must(t, m.removePodDirs(testUID, "web", "default"))
}
