package cri

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/mqlet/mqlet/internal/redact"
)

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("bind mounts need root: run the runtime tests as root (as CI does)")
	}
}

// emptyDirPod returns a pod with one emptyDir "data" mounted by "app" with
// subPath sub, and the emptyDir's host directory.
func emptyDirPod(t *testing.T, m *Manager, vm v1.VolumeMount) (*v1.Pod, map[string]string) {
	t.Helper()
	pod := testPod(v1.RestartPolicyAlways, nil, "app")
	pod.Spec.Volumes = []v1.Volume{{Name: "data", VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}}}
	vm.Name, vm.MountPath = "data", "/data"
	pod.Spec.Containers[0].VolumeMounts = []v1.VolumeMount{vm}
	paths, err := m.prepareVolumes(pod, fakeObjects{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := m.removePodDirs(string(pod.UID), pod.Name, pod.Namespace); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	return pod, paths
}

func TestSubPathThroughSymlinkIsRefused(t *testing.T) {
	requireRoot(t)
	for _, opener := range []string{"openat2", "nofollow walk"} {
		t.Run(opener, func(t *testing.T) {
			m := testManager(t)
			for _, sub := range []string{"pivot", "pivot/etc", "inner/up", "abs"} {
				pod, paths := emptyDirPod(t, m, v1.VolumeMount{SubPath: sub})
				vol := paths["data"]
				// What a container of the pod could plant in its emptyDir.
				if err := os.Symlink("/", filepath.Join(vol, "pivot")); err != nil {
					t.Fatal(err)
				}
				if err := os.MkdirAll(filepath.Join(vol, "inner"), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.Symlink("../..", filepath.Join(vol, "inner", "up")); err != nil {
					t.Fatal(err)
				}
				if err := os.Symlink("/etc", filepath.Join(vol, "abs")); err != nil {
					t.Fatal(err)
				}
				var o beneathOpener
				o.noOpenat2 = opener != "openat2"
				_, err := m.mountSubpath(&o, pod, &pod.Spec.Containers[0], 0, "data", vol, sub)
				if err == nil || !errors.Is(err, errEscapes) {
					t.Fatalf("subPath %q through a symlink out of the volume: err %v", sub, err)
				}
				if _, err := m.containerMounts(pod, &pod.Spec.Containers[0], paths, nil); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("subPath %q", sub)) {
					t.Fatalf("containerMounts error %v does not name the subPath", err)
				}
				mounts, err := mountPointsUnder(m.cfg.PodDir)
				if err != nil || len(mounts) != 0 {
					t.Fatalf("mounts left after a refusal: %v %v", mounts, err)
				}
				if err := m.removePodDirs(string(pod.UID), pod.Name, pod.Namespace); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

func TestSubPathIsBindMountedAndCleanedUp(t *testing.T) {
	requireRoot(t)
	m := testManager(t)
	pod, paths := emptyDirPod(t, m, v1.VolumeMount{SubPath: "a/b"})
	vol := paths["data"]
	// A symlink that stays inside the volume is fine (openat2 resolves it beneath).
	if err := os.Symlink("a", filepath.Join(vol, "alias")); err != nil {
		t.Fatal(err)
	}
	mounts, err := m.containerMounts(pod, &pod.Spec.Containers[0], paths, nil)
	if err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(m.cfg.PodDir, string(pod.UID), subpathsDir, "data", "app", "0")
	if len(mounts) != 1 || mounts[0].HostPath != target {
		t.Fatalf("mounts %v, want the bind mount %s", mounts, target)
	}
	if info, err := os.Stat(filepath.Join(vol, "a", "b")); err != nil || !info.IsDir() || info.Mode().Perm() != 0o777 {
		t.Fatalf("created subPath %v %v, want a directory with the volume's mode", info, err)
	}
	if err := os.WriteFile(filepath.Join(target, "through-bind"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(vol, "a", "b", "through-bind")); err != nil {
		t.Fatalf("the bind mount does not show the subPath: %v", err)
	}
	// A second attempt replaces the mount instead of stacking one more.
	if _, err := m.containerMounts(pod, &pod.Spec.Containers[0], paths, nil); err != nil {
		t.Fatal(err)
	}
	if mps, _ := mountPointsUnder(target); len(mps) != 1 {
		t.Fatalf("mounts at %s after a restart: %v", target, mps)
	}
	var o beneathOpener
	if _, err := m.mountSubpath(&o, pod, &pod.Spec.Containers[0], 1, "data", vol, "alias/b"); err != nil {
		t.Fatalf("a symlink inside the volume: %v", err)
	}
	// A container taken out of the spec loses its mounts at the next sync.
	renamed := pod.DeepCopy()
	renamed.Spec.Containers[0].Name = "other"
	if err := m.pruneMounts(renamed); err != nil {
		t.Fatal(err)
	}
	if mps, _ := mountPointsUnder(m.cfg.PodDir); len(mps) != 0 {
		t.Fatalf("mounts of a container no longer in the spec: %v", mps)
	}
	if _, err := os.Stat(filepath.Join(vol, "a", "b", "through-bind")); err != nil {
		t.Fatalf("pruning the mount removed the volume's files: %v", err)
	}
	if _, err := m.containerMounts(pod, &pod.Spec.Containers[0], paths, nil); err != nil {
		t.Fatal(err)
	}
	if err := m.removePodDirs(string(pod.UID), pod.Name, pod.Namespace); err != nil {
		t.Fatal(err)
	}
	if mps, _ := mountPointsUnder(m.cfg.PodDir); len(mps) != 0 {
		t.Fatalf("mounts left after the pod was removed: %v", mps)
	}
}

func TestRemoveAllRefusesWhileAMountRemains(t *testing.T) {
	requireRoot(t)
	dir := t.TempDir()
	outside := t.TempDir()
	if err := os.WriteFile(filepath.Join(outside, "keep"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(dir, "pod", "m")
	if err := os.MkdirAll(target, 0o755); err != nil {
		t.Fatal(err)
	}
	fd, err := (&beneathOpener{}).openSubpath(outside, ".", false)
	if err != nil {
		t.Fatal(err)
	}
	defer closeFd(fd)
	if err := bindFd(fd, target, true); err != nil {
		t.Fatal(err)
	}
	if err := removeAllUnmounted(filepath.Join(dir, "pod")); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(outside, "keep")); err != nil {
		t.Fatalf("removing the pod directory reached through the bind mount: %v", err)
	}
}

func TestSubPathExpr(t *testing.T) {
	requireRoot(t)
	m := testManager(t)
	env := []v1.EnvVar{{Name: "POD", Value: "web-1"}, {Name: "UP", Value: "../.."}, {Name: "ABS", Value: "/etc"}}
	pod, paths := emptyDirPod(t, m, v1.VolumeMount{SubPathExpr: "logs/$(POD)"})
	mounts, err := m.containerMounts(pod, &pod.Spec.Containers[0], paths, env)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(paths["data"], "logs", "web-1")); err != nil || !strings.Contains(mounts[0].HostPath, subpathsDir) {
		t.Fatalf("subPathExpr not expanded and mounted: %v %v", mounts, err)
	}
	for expr, want := range map[string]string{
		"$(UP)/x": "'..'", "$(ABS)": "relative", "x/$(MISSING)/..": "'..'",
	} {
		_, err := mountSubPath(v1.VolumeMount{SubPathExpr: expr}, env)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("subPathExpr %q: err %v, want one about %s", expr, err, want)
		}
	}
	if _, err := mountSubPath(v1.VolumeMount{SubPath: "a", SubPathExpr: "b"}, env); err == nil {
		t.Error("subPath together with subPathExpr accepted")
	}
}

func hostPathPod(path string, t v1.HostPathType) *v1.Pod {
	pod := testPod(v1.RestartPolicyAlways, nil, "app")
	pod.Spec.Volumes = []v1.Volume{{Name: "host", VolumeSource: v1.VolumeSource{HostPath: &v1.HostPathVolumeSource{Path: path, Type: &t}}}}
	return pod
}

func TestHostPathIsResolvedAndRechecked(t *testing.T) {
	requireRoot(t)
	m := testManager(t)
	t.Cleanup(func() {
		if err := m.removePodDirs(testUID, "web", "default"); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	allowed := t.TempDir()
	outside := t.TempDir()
	m.cfg.AllowedHostPaths = []string{allowed}
	if err := os.Symlink("/", filepath.Join(allowed, "pivot")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(allowed, "out")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(allowed, "real"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("real", filepath.Join(allowed, "alias")); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		path string
		typ  v1.HostPathType
		ok   bool
		want string // the path handed to CRI
	}{
		{filepath.Join(allowed, "pivot"), v1.HostPathUnset, false, ""},
		{filepath.Join(allowed, "pivot", "etc"), v1.HostPathDirectory, false, ""},
		{filepath.Join(allowed, "out", "new"), v1.HostPathDirectoryOrCreate, false, ""},
		{filepath.Join(allowed, "out", "new.txt"), v1.HostPathFileOrCreate, false, ""},
		{"/etc", v1.HostPathDirectory, false, ""},
		{filepath.Join(allowed, "alias"), v1.HostPathDirectory, true, filepath.Join(allowed, "real")},
		{filepath.Join(allowed, "made", "deep"), v1.HostPathDirectoryOrCreate, true, filepath.Join(allowed, "made", "deep")},
		{filepath.Join(allowed, "alias", "f.txt"), v1.HostPathFileOrCreate, true, filepath.Join(allowed, "real", "f.txt")},
	}
	for _, c := range cases {
		paths, err := m.prepareVolumes(hostPathPod(c.path, c.typ), fakeObjects{})
		if c.ok != (err == nil) {
			t.Errorf("hostPath %s (%s): err %v, want ok=%v", c.path, c.typ, err, c.ok)
			continue
		}
		if c.ok {
			// The CRI gets a bind mount of the checked file, under the pod.
			got, err1 := os.Stat(paths["host"])
			want, err2 := os.Stat(c.want)
			if err1 != nil || err2 != nil || !os.SameFile(got, want) || !strings.HasPrefix(paths["host"], filepath.Join(m.cfg.PodDir, testUID, hostPathsDir)) {
				t.Errorf("hostPath %s handed to CRI as %s, want a bind mount of %s (%v %v)", c.path, paths["host"], c.want, err1, err2)
			}
		}
		if !c.ok && !strings.Contains(err.Error(), "allowed host paths") {
			t.Errorf("hostPath %s: error %q does not say why", c.path, err)
		}
	}
	if entries, _ := os.ReadDir(outside); len(entries) != 0 {
		t.Fatalf("a hostPath type created %v outside the allowed directory", entries)
	}
	// A missing path of no type is made as a directory, as the runtime
	// would, but only beneath the allowed directory.
	if _, err := m.prepareVolumes(hostPathPod(filepath.Join(allowed, "out", "untyped"), v1.HostPathUnset), fakeObjects{}); err == nil {
		t.Fatal("an untyped missing hostPath through a symlink out was accepted")
	}
	if _, err := os.Stat(filepath.Join(outside, "untyped")); err == nil {
		t.Fatal("an untyped hostPath was created through a symlink out")
	}
	if err := m.removePodDirs(testUID, "web", "default"); err != nil {
		t.Fatal(err)
	}
	if mps, _ := mountPointsUnder(m.cfg.PodDir); len(mps) != 0 {
		t.Fatalf("hostPath mounts left after the pod was removed: %v", mps)
	}
	if _, err := os.Stat(filepath.Join(allowed, "real")); err != nil {
		t.Fatalf("removing the pod removed the host directory behind its hostPath: %v", err)
	}
	m.cfg.AllowedHostPaths = nil
	if _, err := m.prepareVolumes(hostPathPod(filepath.Join(allowed, "real"), v1.HostPathDirectory), fakeObjects{}); err == nil {
		t.Fatal("a hostPath was accepted with no allowed host paths")
	}
}

func TestContainerSecurityDefaults(t *testing.T) {
	m := testManager(t)
	build := func(edit func(*v1.Pod)) (*runtimeapi.LinuxContainerSecurityContext, error) {
		pod := testPod(v1.RestartPolicyAlways, nil, "app")
		edit(pod)
		cfg, err := m.buildContainerConfig(pod, &pod.Spec.Containers[0], containerParams{}, fakeObjects{})
		if err != nil {
			return nil, err
		}
		return cfg.Linux.SecurityContext, nil
	}
	sc, err := build(func(*v1.Pod) {})
	if err != nil {
		t.Fatal(err)
	}
	if sc.Seccomp.GetProfileType() != runtimeapi.SecurityProfile_RuntimeDefault {
		t.Errorf("default seccomp %v, want RuntimeDefault", sc.Seccomp)
	}
	for _, p := range []string{"/proc/kcore", "/proc/keys"} {
		if !contains(sc.MaskedPaths, p) {
			t.Errorf("masked paths %v lack %s", sc.MaskedPaths, p)
		}
	}
	for _, p := range []string{"/proc/sys", "/proc/sysrq-trigger"} {
		if !contains(sc.ReadonlyPaths, p) {
			t.Errorf("read-only paths %v lack %s", sc.ReadonlyPaths, p)
		}
	}
	unmasked := v1.UnmaskedProcMount
	sc, err = build(func(p *v1.Pod) {
		p.Spec.SecurityContext = &v1.PodSecurityContext{SeccompProfile: &v1.SeccompProfile{Type: v1.SeccompProfileTypeUnconfined}}
		p.Spec.Containers[0].SecurityContext = &v1.SecurityContext{ProcMount: &unmasked}
	})
	if err != nil {
		t.Fatal(err)
	}
	if sc.Seccomp.GetProfileType() != runtimeapi.SecurityProfile_Unconfined || len(sc.MaskedPaths) != 0 || len(sc.ReadonlyPaths) != 0 {
		t.Errorf("asked Unconfined and Unmasked, got %v masked %v ro %v", sc.Seccomp, sc.MaskedPaths, sc.ReadonlyPaths)
	}
	// The container's profile wins over the pod's.
	sc, err = build(func(p *v1.Pod) {
		p.Spec.SecurityContext = &v1.PodSecurityContext{SeccompProfile: &v1.SeccompProfile{Type: v1.SeccompProfileTypeUnconfined}}
		p.Spec.Containers[0].SecurityContext = &v1.SecurityContext{SeccompProfile: &v1.SeccompProfile{Type: v1.SeccompProfileTypeRuntimeDefault}}
	})
	if err != nil || sc.Seccomp.GetProfileType() != runtimeapi.SecurityProfile_RuntimeDefault {
		t.Errorf("container RuntimeDefault over pod Unconfined: %v %v", sc, err)
	}
	sbc, err := m.buildSandboxConfig(testPod(v1.RestartPolicyAlways, nil, "app"), 0)
	if err != nil || sbc.Linux.SecurityContext.Seccomp.GetProfileType() != runtimeapi.SecurityProfile_RuntimeDefault {
		t.Errorf("sandbox seccomp %v (%v), want RuntimeDefault", sbc.GetLinux().GetSecurityContext().GetSeccomp(), err)
	}
	profile := "my.json"
	_, err = build(func(p *v1.Pod) {
		p.Spec.Containers[0].SecurityContext = &v1.SecurityContext{SeccompProfile: &v1.SeccompProfile{Type: v1.SeccompProfileTypeLocalhost, LocalhostProfile: &profile}}
	})
	if err == nil || !strings.Contains(err.Error(), "Localhost") {
		t.Errorf("a Localhost profile: err %v, want a refusal naming it", err)
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func TestRunAsNonRoot(t *testing.T) {
	yes, no := true, false
	i := func(v int64) *int64 { return &v }
	cases := []struct {
		name      string
		nonRoot   *bool
		runAsUser *int64
		imageUID  *int64
		imageUser string
		want      string // "" means allowed
	}{
		{"not asked", nil, nil, i(0), "", ""},
		{"asked false", &no, nil, i(0), "", ""},
		{"image root", &yes, nil, i(0), "", "image will run as root"},
		{"image names no user", &yes, nil, nil, "", "image will run as root"},
		{"image non-numeric", &yes, nil, nil, "app", "non-numeric user (app)"},
		{"image uid", &yes, nil, i(1000), "", ""},
		{"runAsUser 0", &yes, i(0), i(1000), "", "runAsUser breaks non-root policy"},
		{"runAsUser wins over image root", &yes, i(1000), i(0), "", ""},
	}
	for _, c := range cases {
		pod := testPod(v1.RestartPolicyAlways, nil, "app")
		pod.Spec.SecurityContext = &v1.PodSecurityContext{RunAsNonRoot: c.nonRoot}
		pod.Spec.Containers[0].SecurityContext = &v1.SecurityContext{RunAsUser: c.runAsUser}
		err := checkRunAsNonRoot(pod, &pod.Spec.Containers[0], c.imageUID, c.imageUser)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: refused: %v", c.name, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s: err %v, want %q", c.name, err, c.want)
		}
	}
}

func TestExpansionIsBounded(t *testing.T) {
	m := testManager(t)
	pod := testPod(v1.RestartPolicyAlways, nil, "app")
	// Each variable doubles the previous one: 2^40 bytes unbounded.
	env := []v1.EnvVar{{Name: "V0", Value: "xxxxxxxx"}}
	for i := 1; i <= 40; i++ {
		env = append(env, v1.EnvVar{Name: fmt.Sprintf("V%d", i), Value: fmt.Sprintf("$(V%d)$(V%d)", i-1, i-1)})
	}
	pod.Spec.Containers[0].Env = env
	_, err := resolveEnv(pod, &pod.Spec.Containers[0], downwardValues{}, fakeObjects{})
	if err == nil || !strings.Contains(err.Error(), "more than") {
		t.Fatalf("doubling env: err %v, want a bound error", err)
	}
	// Many references to one big value in a single arg.
	big := strings.Repeat("y", maxEnvValueBytes)
	pod.Spec.Containers[0].Env = []v1.EnvVar{{Name: "BIG", Value: big}}
	pod.Spec.Containers[0].Args = []string{strings.Repeat("$(BIG)", 1000)}
	if _, err := m.buildContainerConfig(pod, &pod.Spec.Containers[0], containerParams{}, fakeObjects{}); err == nil {
		t.Fatal("an arg expanding to 32 MiB was accepted")
	}
	// Many args each within the value bound but together over the total.
	pod.Spec.Containers[0].Args = make([]string, 40)
	for i := range pod.Spec.Containers[0].Args {
		pod.Spec.Containers[0].Args[i] = "$(BIG)"
	}
	if _, err := m.buildContainerConfig(pod, &pod.Spec.Containers[0], containerParams{}, fakeObjects{}); err == nil || !strings.Contains(err.Error(), "exceed") {
		t.Fatalf("args totalling 1.25 MiB: err %v", err)
	}
	// Within the bounds expansion works as before.
	pod.Spec.Containers[0].Env = []v1.EnvVar{{Name: "A", Value: "a"}, {Name: "B", Value: "$(A)-$(A)-$(MISSING)"}}
	pod.Spec.Containers[0].Args = []string{"$(B)"}
	cfg, err := m.buildContainerConfig(pod, &pod.Spec.Containers[0], containerParams{}, fakeObjects{})
	if err != nil || cfg.Args[0] != "a-a-$(MISSING)" {
		t.Fatalf("expansion within bounds: %v %v", cfg.GetArgs(), err)
	}
}

func TestHostPortHeldByAHostListenerIsRefused(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	port := int32(l.Addr().(*net.TCPAddr).Port)
	pod := testPod(v1.RestartPolicyAlways, nil, "app")
	pod.Spec.Containers[0].Ports = []v1.ContainerPort{{ContainerPort: 80, HostPort: port}}
	err = checkHostPorts(pod, hostProcNet)
	var inUse *HostPortInUseError
	if !errors.As(err, &inUse) || inUse.Port != port || !strings.Contains(err.Error(), fmt.Sprint(port)) {
		t.Fatalf("hostPort %d held by a listener: err %v", port, err)
	}
	var ce *ContainerError
	if !errors.As(hostPortErrors(pod, err), &ce) || ce.Container != "app" {
		t.Fatalf("the refusal is not reported on the container: %v", hostPortErrors(pod, err))
	}
	// UDP on the same number is free.
	pod.Spec.Containers[0].Ports[0].Protocol = v1.ProtocolUDP
	if err := checkHostPorts(pod, hostProcNet); err != nil {
		t.Fatalf("UDP port with only a TCP listener: %v", err)
	}
	l.Close()
	pod.Spec.Containers[0].Ports[0].Protocol = v1.ProtocolTCP
	if err := checkHostPorts(pod, hostProcNet); err != nil {
		t.Fatalf("a closed port still refused: %v", err)
	}
}

func TestScrubErrorKeepsContainerErrors(t *testing.T) {
	s := redact.New("hunter22")
	ce := &ContainerError{Container: "app", Reason: "RunContainerError", Err: fmt.Errorf(`exec: "hunter22": not found: %w`, ErrImagePull)}
	joined := errors.Join(fmt.Errorf("start: %w", ce), &BackoffError{Container: "b"})
	got := scrubError(s, joined)
	if strings.Contains(got.Error(), "hunter22") {
		t.Fatalf("value left in %q", got)
	}
	var gotCE *ContainerError
	if !errors.As(got, &gotCE) || gotCE.Reason != "RunContainerError" || gotCE.Container != "app" || strings.Contains(gotCE.Error(), "hunter22") {
		t.Fatalf("container error lost or leaky: %+v", gotCE)
	}
	if !errors.Is(got, ErrImagePull) || !errors.Is(got, ErrCrashLoopBackOff) {
		t.Fatal("sentinels lost")
	}
	rec := &recorder{}
	scrubbingRecorder{next: rec, s: s}.Event(nil, v1.EventTypeWarning, "Failed", "Error: hunter22")
	if strings.Contains(strings.Join(rec.events, ""), "hunter22") {
		t.Fatalf("event not scrubbed: %v", rec.events)
	}
}

func TestProjectedKeysCannotEscape(t *testing.T) {
	m := testManager(t)
	pod := testPod(v1.RestartPolicyAlways, nil, "app")
	pod.Spec.Volumes = []v1.Volume{{Name: "cfg", VolumeSource: v1.VolumeSource{ConfigMap: &v1.ConfigMapVolumeSource{LocalObjectReference: v1.LocalObjectReference{Name: "cfg"}}}}}
	for _, key := range []string{"../../../escaped", "..data", "a/b"} {
		objects := fakeObjects{configMaps: map[string]*v1.ConfigMap{"default/cfg": {Data: map[string]string{key: "x"}}}}
		if _, err := m.prepareVolumes(pod, objects); err == nil {
			t.Errorf("configmap key %q accepted as a file name", key)
		}
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(m.cfg.PodDir), "escaped")); !os.IsNotExist(err) {
		t.Fatalf("a key wrote outside the volume: %v", err)
	}
}

func TestNoFollowWalkCreatesAndRefusesLikeOpenat2(t *testing.T) {
	root := t.TempDir()
	o := beneathOpener{noOpenat2: true}
	fd, err := o.openSubpath(root, "x/y", true)
	if err != nil {
		t.Fatal(err)
	}
	closeFd(fd)
	if info, err := os.Stat(filepath.Join(root, "x", "y")); err != nil || !info.IsDir() {
		t.Fatalf("walk did not create x/y: %v %v", info, err)
	}
	outside := t.TempDir()
	if err := os.Symlink(outside, filepath.Join(root, "out")); err != nil {
		t.Fatal(err)
	}
	if _, err := o.openSubpath(root, "out/new", true); !errors.Is(err, errEscapes) {
		t.Fatalf("walk through a symlink out: %v", err)
	}
	if entries, _ := os.ReadDir(outside); len(entries) != 0 {
		t.Fatalf("the walk created %v outside", entries)
	}
}

// The runtime makes no user namespace, so a stored pod asking for one
// (admitted by an older mqlet) is refused rather than run with host uids.
func TestHostUsersFalseIsRefused(t *testing.T) {
	pod := testPod(v1.RestartPolicyAlways, nil, "app")
	if err := checkHostUsers(pod); err != nil {
		t.Fatalf("a pod without hostUsers refused: %v", err)
	}
	off := false
	pod.Spec.HostUsers = &off
	err := checkHostUsers(pod)
	if !errors.Is(err, errRefused) || !strings.Contains(err.Error(), "hostUsers: false is not supported") {
		t.Fatalf("hostUsers: false: %v", err)
	}
}

// An item path of "./x" passes Kubernetes validation; taken as written,
// its first component "." made the volume directory itself a visible name:
// it was removed and replaced by a dangling symlink, and the pod never
// started. It is cleaned to x, as the kubelet does.
func TestConfigMapItemPathIsCleaned(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "vol")
	files, err := projectItems([]v1.KeyToPath{{Key: "a", Path: "./x"}, {Key: "b", Path: "sub/./y"}},
		map[string][]byte{"a": []byte("hello"), "b": []byte("world")}, 0o644, false, "configmap test")
	if err != nil {
		t.Fatal(err)
	}
	for range 2 { // a second write of the same files changes nothing
		if err := writeAtomic(dir, files); err != nil {
			t.Fatalf("write: %v", err)
		}
		if info, err := os.Lstat(dir); err != nil || !info.IsDir() {
			t.Fatalf("the volume directory is gone or replaced: %v %v", info, err)
		}
		for p, want := range map[string]string{"x": "hello", "sub/y": "world"} {
			if got, err := os.ReadFile(filepath.Join(dir, p)); err != nil || string(got) != want {
				t.Fatalf("%s: %q, %v", p, got, err)
			}
		}
	}
	for _, bad := range []string{".", "./", "x/..", "./../x", "/abs"} {
		if _, err := projectItems([]v1.KeyToPath{{Key: "a", Path: bad}}, map[string][]byte{"a": nil}, 0o644, false, "configmap test"); err == nil {
			t.Errorf("item path %q accepted", bad)
		}
	}
}

// A pod writing in an allowed directory can swap one of its directories
// for a symlink out between the resolution of a DirectoryOrCreate or
// FileOrCreate hostPath and its creation; the creation walked the resolved
// path again and made the directory or file outside, as root. It is made
// beneath the allowed directory instead.
func TestHostPathCreationRaceStaysBeneath(t *testing.T) {
	requireRoot(t)
	for _, typ := range []v1.HostPathType{v1.HostPathDirectoryOrCreate, v1.HostPathFileOrCreate} {
		m := testManager(t)
		allowed, outside := t.TempDir(), t.TempDir()
		m.cfg.AllowedHostPaths = []string{allowed}
		must(t, os.MkdirAll(filepath.Join(allowed, "a", "b"), 0o755))
		must(t, os.MkdirAll(filepath.Join(outside, "b"), 0o755))
		m.afterResolve = func() { // the pod's move, after the check
			must(t, os.Rename(filepath.Join(allowed, "a"), filepath.Join(allowed, "a-old")))
			must(t, os.Symlink(outside, filepath.Join(allowed, "a")))
		}
		_, err := m.prepareVolumes(hostPathPod(filepath.Join(allowed, "a", "b", "new"), typ), fakeObjects{})
		if entries, _ := os.ReadDir(filepath.Join(outside, "b")); len(entries) != 0 {
			t.Fatalf("%s: the race created %s outside the allowed directory", typ, entries[0].Name())
		}
		if err == nil {
			t.Fatalf("%s: the swapped hostPath was accepted", typ)
		}
		must(t, m.removePodDirs(testUID, "web", "default"))
	}
}
