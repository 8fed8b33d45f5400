package cri

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func readVolume(t *testing.T, dir string, want map[string]string) {
	t.Helper()
	for p, content := range want {
		got, err := os.ReadFile(filepath.Join(dir, p))
		if err != nil || string(got) != content {
			t.Fatalf("%s: %q, %v; want %q", p, got, err, content)
		}
	}
}

func modeOf(t *testing.T, p string) uint32 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st.Mode & 0o7777
}

// Modes are set exactly, setgid and sticky bits included, whatever the
// umask.
func TestAtomicWriterModes(t *testing.T) {
	old := unix.Umask(0o077)
	defer unix.Umask(old)
	dir := filepath.Join(t.TempDir(), "vol")
	files := []volumeFile{
		{path: "ro", data: []byte("r"), mode: 0o400},
		{path: "pub", data: []byte("p"), mode: 0o644},
		{path: "sub/sticky", data: []byte("s"), mode: 0o1777},
		{path: "sub/setgid", data: []byte("g"), mode: 0o2755},
	}
	if err := writeAtomic(dir, files); err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if got := modeOf(t, filepath.Join(dir, f.path)); got != f.mode {
			t.Errorf("%s: mode %#o, want %#o", f.path, got, f.mode)
		}
	}
	if got := modeOf(t, filepath.Join(dir, "sub")); got != 0o755 {
		t.Errorf("directory sub: mode %#o, want 0755", got)
	}
	// Only a mode change is a change too.
	gen, _ := os.Readlink(filepath.Join(dir, dataLink))
	files[1].mode = 0o640
	if err := writeAtomic(dir, files); err != nil {
		t.Fatal(err)
	}
	if now, _ := os.Readlink(filepath.Join(dir, dataLink)); now == gen {
		t.Fatal("a changed mode was not written")
	}
	if got := modeOf(t, filepath.Join(dir, "pub")); got != 0o640 {
		t.Errorf("pub after the change: %#o", got)
	}
}

// A new generation replaces the old at one swap of ..data; names no longer
// published go, the old generation goes, and writing the same files again
// changes nothing.
func TestAtomicWriterUpdate(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "vol")
	if err := writeAtomic(dir, []volumeFile{{path: "a", data: []byte("1"), mode: 0o644}, {path: "d/b", data: []byte("2"), mode: 0o644}}); err != nil {
		t.Fatal(err)
	}
	first, err := os.Readlink(filepath.Join(dir, dataLink))
	if err != nil || !strings.HasPrefix(first, "..") {
		t.Fatalf("..data -> %q, %v", first, err)
	}
	if target, _ := os.Readlink(filepath.Join(dir, "d")); target != "..data/d" {
		t.Fatalf("visible d -> %q, want ..data/d", target)
	}
	next := []volumeFile{{path: "a", data: []byte("one"), mode: 0o644}, {path: "c", data: []byte("3"), mode: 0o644}}
	if err := writeAtomic(dir, next); err != nil {
		t.Fatal(err)
	}
	readVolume(t, dir, map[string]string{"a": "one", "c": "3"})
	second, _ := os.Readlink(filepath.Join(dir, dataLink))
	if second == first {
		t.Fatal("..data still points at the first generation")
	}
	if _, err := os.Lstat(filepath.Join(dir, "d")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("d is still published: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(dir, first)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the old generation %s is still there: %v", first, err)
	}
	if err := writeAtomic(dir, next); err != nil {
		t.Fatal(err)
	}
	if third, _ := os.Readlink(filepath.Join(dir, dataLink)); third != second {
		t.Errorf("unchanged files made a new generation %s", third)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 4 { // ..data, the generation, a, c
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Errorf("volume holds %v", names)
	}
}

// Symlinks planted in the volume (at visible names, at ..data, at
// ..data_tmp, at a stale name) are replaced, never written through.
func TestAtomicWriterPlantedSymlinksReplaced(t *testing.T) {
	root := t.TempDir()
	dir, outside := filepath.Join(root, "vol"), filepath.Join(root, "outside")
	must(t, os.MkdirAll(dir, 0o755))
	must(t, os.MkdirAll(filepath.Join(outside, "x"), 0o755))
	must(t, os.WriteFile(filepath.Join(outside, "keep"), []byte("host file"), 0o644))
	must(t, os.Symlink(outside, filepath.Join(dir, "a")))
	must(t, os.Symlink(outside, filepath.Join(dir, dataLink)))
	must(t, os.Symlink(outside, filepath.Join(dir, dataLinkTmp)))
	must(t, os.Symlink(filepath.Join(outside, "keep"), filepath.Join(dir, "stale")))
	must(t, os.Symlink(outside, filepath.Join(dir, "..old_generation")))
	files := []volumeFile{{path: "a/x/y", data: []byte("inside"), mode: 0o644}, {path: "keep", data: []byte("volume"), mode: 0o644}}
	if err := writeAtomic(dir, files); err != nil {
		t.Fatal(err)
	}
	readVolume(t, dir, map[string]string{"a/x/y": "inside", "keep": "volume"})
	readVolume(t, outside, map[string]string{"keep": "host file"})
	if entries, _ := os.ReadDir(filepath.Join(outside, "x")); len(entries) != 0 {
		t.Fatalf("a file was written outside the volume: %s", entries[0].Name())
	}
	for name, want := range map[string]string{"a": "..data/a", "keep": "..data/keep"} {
		if got, _ := os.Readlink(filepath.Join(dir, name)); got != want {
			t.Errorf("%s -> %q, want %q", name, got, want)
		}
	}
	for _, gone := range []string{"stale", dataLinkTmp, "..old_generation"} {
		if _, err := os.Lstat(filepath.Join(dir, gone)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s is still in the volume: %v", gone, err)
		}
	}
	if _, err := os.Stat(outside); err != nil {
		t.Fatalf("the symlinks' target was removed: %v", err)
	}
	// A generation whose files were swapped for symlinks is not taken as
	// unchanged: it is rewritten.
	gen, _ := os.Readlink(filepath.Join(dir, dataLink))
	must(t, os.Remove(filepath.Join(dir, gen, "keep")))
	must(t, os.Symlink(filepath.Join(outside, "keep"), filepath.Join(dir, gen, "keep")))
	if err := writeAtomic(dir, files); err != nil {
		t.Fatal(err)
	}
	readVolume(t, dir, map[string]string{"keep": "volume"})
	readVolume(t, outside, map[string]string{"keep": "host file"})
}

func TestAtomicWriterBounds(t *testing.T) {
	many := make([]volumeFile, maxVolumeFiles+1)
	for i := range many {
		many[i] = volumeFile{path: "f" + strconv.Itoa(i), mode: 0o644}
	}
	big := make([]byte, maxVolumeBytes/2+1)
	cases := map[string][]volumeFile{
		"too many files":     many,
		"too many bytes":     {{path: "a", data: big, mode: 0o644}, {path: "b", data: big, mode: 0o644}},
		"long path":          {{path: strings.Repeat("d/", maxVolumePathBytes/2) + "f", mode: 0o644}},
		"long component":     {{path: strings.Repeat("n", maxVolumeNameBytes+1), mode: 0o644}},
		"absolute":           {{path: "/etc/passwd", mode: 0o644}},
		"dot-dot":            {{path: "a/../../b", mode: 0o644}},
		"hidden name":        {{path: "..data", mode: 0o644}},
		"no name":            {{path: "./", mode: 0o644}},
		"twice":              {{path: "a", mode: 0o644}, {path: "a", mode: 0o600}},
		"file and directory": {{path: "a", mode: 0o644}, {path: "a/b", mode: 0o644}},
		"not a mode":         {{path: "a", mode: 0o10644}},
	}
	for name, files := range cases {
		dir := filepath.Join(t.TempDir(), "vol")
		if err := writeAtomic(dir, files); err == nil {
			t.Errorf("%s: accepted", name)
		}
		if entries, _ := os.ReadDir(dir); len(entries) != 0 {
			t.Errorf("%s: refused but wrote %d entries", name, len(entries))
		}
	}
	// At the bounds exactly: accepted.
	dir := filepath.Join(t.TempDir(), "vol")
	if err := writeAtomic(dir, many[:maxVolumeFiles]); err != nil {
		t.Errorf("%d files refused: %v", maxVolumeFiles, err)
	}
}

func volumePod(vols ...v1.Volume) *v1.Pod {
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default", UID: testUID, Labels: map[string]string{"app": "web"}},
		Spec:       v1.PodSpec{NodeName: "gw-1", Volumes: vols, Containers: []v1.Container{{Name: "main"}}},
	}
}

// downwardAPI and projected volumes hold the right files with the right
// modes; they and secret volumes are tmpfs mounts, a configMap volume is not.
func TestDownwardAndProjectedVolumes(t *testing.T) {
	requireRoot(t)
	m := testManager(t)
	mode := int32(0o600)
	objects := fakeObjects{
		configMaps: map[string]*v1.ConfigMap{"default/cfg": {Data: map[string]string{"k": "cm-value"}}},
		secrets:    map[string]*v1.Secret{"default/sec": {Data: map[string][]byte{"pw": []byte("s3cret")}}},
	}
	pod := volumePod(
		v1.Volume{Name: "down", VolumeSource: v1.VolumeSource{DownwardAPI: &v1.DownwardAPIVolumeSource{Items: []v1.DownwardAPIVolumeFile{
			{Path: "name", FieldRef: &v1.ObjectFieldSelector{FieldPath: "metadata.name"}},
			{Path: "meta/labels", FieldRef: &v1.ObjectFieldSelector{FieldPath: "metadata.labels"}, Mode: &mode},
		}}}},
		v1.Volume{Name: "proj", VolumeSource: v1.VolumeSource{Projected: &v1.ProjectedVolumeSource{Sources: []v1.VolumeProjection{
			{ConfigMap: &v1.ConfigMapProjection{LocalObjectReference: v1.LocalObjectReference{Name: "cfg"}}},
			{Secret: &v1.SecretProjection{LocalObjectReference: v1.LocalObjectReference{Name: "sec"}, Items: []v1.KeyToPath{{Key: "pw", Path: "creds/pw", Mode: &mode}}}},
			{DownwardAPI: &v1.DownwardAPIProjection{Items: []v1.DownwardAPIVolumeFile{{Path: "uid", FieldRef: &v1.ObjectFieldSelector{FieldPath: "metadata.uid"}}}}},
		}}}},
		v1.Volume{Name: "sec", VolumeSource: v1.VolumeSource{Secret: &v1.SecretVolumeSource{SecretName: "sec"}}},
		v1.Volume{Name: "cfg", VolumeSource: v1.VolumeSource{ConfigMap: &v1.ConfigMapVolumeSource{LocalObjectReference: v1.LocalObjectReference{Name: "cfg"}}}},
	)
	for range 2 { // preparing again (a resync) keeps one mount and the files
		paths, err := m.prepareVolumes(pod, objects)
		if err != nil {
			t.Fatal(err)
		}
		readVolume(t, paths["down"], map[string]string{"name": "web", "meta/labels": `app="web"`})
		readVolume(t, paths["proj"], map[string]string{"k": "cm-value", "creds/pw": "s3cret", "uid": testUID})
		readVolume(t, paths["sec"], map[string]string{"pw": "s3cret"})
		for p, want := range map[string]uint32{"down/name": 0o644, "down/meta/labels": 0o600, "proj/k": 0o644, "proj/creds/pw": 0o600, "sec/pw": 0o400} {
			vol, file, _ := strings.Cut(p, "/")
			if got := modeOf(t, filepath.Join(paths[vol], file)); got != want {
				t.Errorf("%s: mode %#o, want %#o", p, got, want)
			}
		}
		for name, tmpfs := range map[string]bool{"down": true, "proj": true, "sec": true, "cfg": false} {
			var st unix.Statfs_t
			must(t, unix.Statfs(paths[name], &st))
			if (st.Type == unix.TMPFS_MAGIC) != tmpfs {
				t.Errorf("volume %s: tmpfs %v, want %v", name, st.Type == unix.TMPFS_MAGIC, tmpfs)
			}
		}
		for _, name := range []string{"down", "proj", "sec"} {
			if mps, _ := mountPointsUnder(paths[name]); len(mps) != 1 {
				t.Errorf("volume %s: %d mounts, want 1", name, len(mps))
			}
		}
	}
	// A changed object reaches the volume on the next prepare.
	objects.secrets["default/sec"] = &v1.Secret{Data: map[string][]byte{"pw": []byte("rotated")}}
	paths, err := m.prepareVolumes(pod, objects)
	if err != nil {
		t.Fatal(err)
	}
	readVolume(t, paths["sec"], map[string]string{"pw": "rotated"})
	readVolume(t, paths["proj"], map[string]string{"creds/pw": "rotated"})
	must(t, m.removePodDirs(testUID, "web", "default"))
}

// Token and trust bundle projections need an API server: refused, for good.
func TestProjectedVolumeRefusesTokens(t *testing.T) {
	requireRoot(t)
	m := testManager(t)
	for name, src := range map[string]v1.VolumeProjection{
		"serviceAccountToken": {ServiceAccountToken: &v1.ServiceAccountTokenProjection{Path: "token"}},
		"clusterTrustBundle":  {ClusterTrustBundle: &v1.ClusterTrustBundleProjection{Path: "ca"}},
	} {
		pod := volumePod(v1.Volume{Name: "proj", VolumeSource: v1.VolumeSource{Projected: &v1.ProjectedVolumeSource{Sources: []v1.VolumeProjection{src}}}})
		_, err := m.prepareVolumes(pod, fakeObjects{})
		if !errors.Is(err, errRefused) || !strings.Contains(err.Error(), name) {
			t.Errorf("%s: %v", name, err)
		}
	}
	must(t, m.removePodDirs(testUID, "web", "default"))
}
