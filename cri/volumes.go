package cri

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/kubernetes/third_party/forked/golang/expansion"
)

const (
	defaultConfigMapMode = 0o644
	defaultSecretMode    = 0o400
	dataLink             = "..data"
)

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// podVolumeDir is where a pod's volume of the given plugin kind lives.
func (m *Manager) podVolumeDir(uid, kind, name string) (string, error) {
	dir, err := m.podDir(uid)
	if err != nil {
		return "", err
	}
	if err := checkLabelName("volume", name); err != nil {
		return "", err
	}
	return filepath.Join(dir, "volumes", kind, name), nil
}

// prepareVolumes creates or refreshes every volume of pod on the node and
// returns the host path of each, by volume name.
func (m *Manager) prepareVolumes(pod *v1.Pod, objects ObjectSource) (map[string]string, error) {
	uid := string(pod.UID)
	paths := map[string]string{}
	for _, vol := range pod.Spec.Volumes {
		var (
			dir string
			err error
		)
		switch {
		case vol.EmptyDir != nil:
			if dir, err = m.podVolumeDir(uid, "kubernetes.io~empty-dir", vol.Name); err != nil {
				break
			}
			if err = os.MkdirAll(dir, 0o755); err == nil {
				err = os.Chmod(dir, 0o777) // any container user may write, as in the kubelet
			}
		case vol.HostPath != nil:
			dir, err = m.prepareHostPath(uid, vol.Name, vol.HostPath)
		case vol.ConfigMap != nil:
			if dir, err = m.podVolumeDir(uid, "kubernetes.io~configmap", vol.Name); err == nil {
				err = m.writeConfigMapVolume(pod, vol.ConfigMap, dir, objects)
			}
		case vol.Secret != nil:
			if dir, err = m.podVolumeDir(uid, "kubernetes.io~secret", vol.Name); err == nil {
				err = m.writeSecretVolume(pod, vol.Secret, dir, objects)
			}
		default:
			err = fmt.Errorf("volume type is not supported")
		}
		if err != nil {
			return nil, fmt.Errorf("prepare volume %q: %w", vol.Name, err)
		}
		paths[vol.Name] = dir
	}
	return paths, nil
}

type volumeFile struct {
	path string
	data []byte
	mode os.FileMode
}

func projectItems(items []v1.KeyToPath, data map[string][]byte, defaultMode os.FileMode, optional bool, what string) ([]volumeFile, error) {
	var files []volumeFile
	if len(items) == 0 {
		for _, k := range sortedKeys(data) {
			// Keys become file names: a stored object is as hostile as the
			// command that sent it.
			if errs := validation.IsConfigMapKey(k); len(errs) > 0 || strings.HasPrefix(k, "..") {
				return nil, fmt.Errorf("%s key %q is not a valid file name", what, k)
			}
			files = append(files, volumeFile{path: k, data: data[k], mode: defaultMode})
		}
		return files, nil
	}
	for _, it := range items {
		d, ok := data[it.Key]
		if !ok {
			if optional {
				continue
			}
			return nil, fmt.Errorf("%s has no key %q", what, it.Key)
		}
		mode := defaultMode
		if it.Mode != nil {
			mode = os.FileMode(*it.Mode)
		}
		// Cleaned, as the kubelet does: "./x" is x. Taken as written, its
		// first component "." made the volume directory itself the
		// "visible name" to replace with a symlink (the volume was removed
		// and the pod never started).
		p := filepath.Clean(it.Path)
		if checkRelative(it.Path) != nil || p == "." || strings.HasPrefix(p, "..") {
			return nil, fmt.Errorf("%s item path %q escapes the volume", what, it.Path)
		}
		files = append(files, volumeFile{path: p, data: d, mode: mode})
	}
	return files, nil
}

func (m *Manager) writeConfigMapVolume(pod *v1.Pod, src *v1.ConfigMapVolumeSource, dir string, objects ObjectSource) error {
	return writeKeyedVolume(keyedVolume{
		what: "configmap " + pod.Namespace + "/" + src.Name, items: src.Items, defaultMode: src.DefaultMode,
		fallbackMode: defaultConfigMapMode, optional: src.Optional != nil && *src.Optional,
		read: func() (map[string][]byte, error) {
			cm, err := objects.ConfigMap(pod.Namespace, src.Name)
			if err != nil || cm == nil {
				return nil, errOrMissing(err)
			}
			data := make(map[string][]byte, len(cm.Data)+len(cm.BinaryData))
			for k, v := range cm.Data {
				data[k] = []byte(v)
			}
			for k, v := range cm.BinaryData {
				data[k] = v
			}
			return data, nil
		},
	}, dir)
}

func (m *Manager) writeSecretVolume(pod *v1.Pod, src *v1.SecretVolumeSource, dir string, objects ObjectSource) error {
	return writeKeyedVolume(keyedVolume{
		what: "secret " + pod.Namespace + "/" + src.SecretName, items: src.Items, defaultMode: src.DefaultMode,
		fallbackMode: defaultSecretMode, optional: src.Optional != nil && *src.Optional,
		read: func() (map[string][]byte, error) {
			s, err := objects.Secret(pod.Namespace, src.SecretName)
			if err != nil || s == nil {
				return nil, errOrMissing(err)
			}
			data := make(map[string][]byte, len(s.StringData)+len(s.Data))
			for k, v := range s.StringData {
				data[k] = []byte(v)
			}
			for k, v := range s.Data {
				data[k] = v
			}
			return data, nil
		},
	}, dir)
}

// keyedVolume is a configMap or secret volume: keys projected into files.
type keyedVolume struct {
	what         string
	items        []v1.KeyToPath
	defaultMode  *int32
	fallbackMode int
	optional     bool
	read         func() (map[string][]byte, error)
}

func writeKeyedVolume(v keyedVolume, dir string) error {
	data, err := v.read()
	if err != nil {
		if !v.optional {
			return fmt.Errorf("%s: %w", v.what, err)
		}
		data = map[string][]byte{}
	}
	mode := os.FileMode(v.fallbackMode)
	if v.defaultMode != nil {
		mode = os.FileMode(*v.defaultMode)
	}
	files, err := projectItems(v.items, data, mode, v.optional, v.what)
	if err != nil {
		return err
	}
	return writeAtomic(dir, files)
}

// writeAtomic publishes files under dir the way the kubelet does, so running
// containers see a consistent update: the files go into a fresh hidden
// directory, the ..data symlink is swapped to it, and each visible name is a
// symlink through ..data.
func writeAtomic(dir string, files []volumeFile) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if same, err := unchanged(dir, files); err == nil && same {
		return nil
	}
	gen := "..gen_" + time.Now().UTC().Format("2006_01_02_15_04_05.000000000")
	genDir := filepath.Join(dir, gen)
	if err := os.Mkdir(genDir, 0o755); err != nil {
		return err
	}
	for _, f := range files {
		p := filepath.Join(genDir, f.path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(p, f.data, f.mode); err != nil {
			return err
		}
		if err := os.Chmod(p, f.mode); err != nil { // WriteFile's mode is filtered by umask
			return err
		}
	}
	tmpLink := filepath.Join(dir, "..data_tmp")
	_ = os.Remove(tmpLink)
	if err := os.Symlink(gen, tmpLink); err != nil {
		return err
	}
	old, _ := os.Readlink(filepath.Join(dir, dataLink))
	if err := os.Rename(tmpLink, filepath.Join(dir, dataLink)); err != nil {
		return err
	}
	wanted := map[string]bool{}
	for _, f := range files {
		top := strings.SplitN(f.path, "/", 2)[0]
		wanted[top] = true
		link, err := childOf(dir, top)
		if err != nil {
			return err
		}
		if target, err := os.Readlink(link); err == nil && target == filepath.Join(dataLink, top) {
			continue
		}
		_ = os.RemoveAll(link)
		if err := os.Symlink(filepath.Join(dataLink, top), link); err != nil {
			return err
		}
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, "..") || wanted[name] {
			continue
		}
		_ = os.RemoveAll(filepath.Join(dir, name))
	}
	if old != "" && old != gen {
		_ = os.RemoveAll(filepath.Join(dir, old))
	}
	return nil
}

// unchanged reports whether dir already publishes exactly files.
func unchanged(dir string, files []volumeFile) (bool, error) {
	current := filepath.Join(dir, dataLink)
	count := 0
	err := filepath.WalkDir(current+"/", func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			count++
		}
		return nil
	})
	if err != nil || count != len(files) {
		return false, err
	}
	for _, f := range files {
		p := filepath.Join(current, f.path)
		info, err := os.Stat(p)
		if err != nil || info.Mode().Perm() != f.mode.Perm() {
			return false, err
		}
		data, err := os.ReadFile(p)
		if err != nil || string(data) != string(f.data) {
			return false, err
		}
	}
	return true, nil
}

// containerMounts maps the container's volumeMounts onto host paths. A
// subPath (or an expanded subPathExpr) is resolved safely beneath its
// volume and bind-mounted under the pod directory (see subpath.go).
func (m *Manager) containerMounts(pod *v1.Pod, c *v1.Container, paths map[string]string, env []v1.EnvVar) ([]*runtimeapi.Mount, error) {
	readOnlyKind := map[string]bool{}
	for _, vol := range pod.Spec.Volumes {
		readOnlyKind[vol.Name] = vol.ConfigMap != nil || vol.Secret != nil
	}
	var (
		mounts []*runtimeapi.Mount
		opener beneathOpener
	)
	for i, vm := range c.VolumeMounts {
		host, ok := paths[vm.Name]
		if !ok {
			return nil, fmt.Errorf("container %s mounts unknown volume %q", c.Name, vm.Name)
		}
		sub, err := mountSubPath(vm, env)
		if err != nil {
			return nil, fmt.Errorf("container %s, volumeMount %q: %w", c.Name, vm.Name, err)
		}
		if sub != "" {
			host, err = m.mountSubpath(&opener, pod, c, i, vm.Name, host, sub)
			if err != nil {
				return nil, fmt.Errorf("container %s, volumeMount %q: subPath %q: %w", c.Name, vm.Name, sub, err)
			}
		}
		mounts = append(mounts, &runtimeapi.Mount{
			ContainerPath: vm.MountPath,
			HostPath:      host,
			Readonly:      vm.ReadOnly || readOnlyKind[vm.Name],
			Propagation:   runtimeapi.MountPropagation_PROPAGATION_PRIVATE,
		})
	}
	slices.SortStableFunc(mounts, func(a, b *runtimeapi.Mount) int {
		return cmp.Compare(strings.Count(a.ContainerPath, "/"), strings.Count(b.ContainerPath, "/"))
	})
	return mounts, nil
}

// mountSubPath is the volumeMount's subPath, or its subPathExpr expanded
// from the container's environment the kubelet way (only $(VAR) of env
// variables; the result must stay a relative path without '..').
func mountSubPath(vm v1.VolumeMount, env []v1.EnvVar) (string, error) {
	switch {
	case vm.SubPath != "" && vm.SubPathExpr != "":
		return "", fmt.Errorf("subPath and subPathExpr are mutually exclusive")
	case vm.SubPath != "":
		if err := checkRelative(vm.SubPath); err != nil {
			return "", fmt.Errorf("subPath %w", err)
		}
		return vm.SubPath, nil
	case vm.SubPathExpr != "":
		b := newBoundedMapping(envMap(env), maxEnvValueBytes)
		sub := expansion.Expand(vm.SubPathExpr, b.mapping)
		if b.over || len(sub) > maxEnvValueBytes {
			return "", fmt.Errorf("subPathExpr %q expands beyond %d bytes", vm.SubPathExpr, maxEnvValueBytes)
		}
		if err := checkRelative(sub); err != nil {
			return "", fmt.Errorf("subPathExpr %q expands to %w", vm.SubPathExpr, err)
		}
		return sub, nil
	}
	return "", nil
}

// mountSubpath opens sub beneath the volume at host (creating missing
// directories) and bind-mounts it onto
// <podDir>/volume-subpaths/<volume>/<container>/<index>, which it returns.
func (m *Manager) mountSubpath(opener *beneathOpener, pod *v1.Pod, c *v1.Container, index int, volume, host, sub string) (string, error) {
	podDir, err := m.podDir(string(pod.UID))
	if err != nil {
		return "", err
	}
	if err := checkLabelName("volume", volume); err != nil {
		return "", err
	}
	if err := checkLabelName("container", c.Name); err != nil {
		return "", err
	}
	fd, err := opener.openSubpath(host, sub, true)
	if err != nil {
		return "", err
	}
	defer unix.Close(fd)
	target := filepath.Join(podDir, subpathsDir, volume, c.Name, strconv.Itoa(index))
	if err := bindFd(fd, target, false); err != nil {
		return "", err
	}
	return target, nil
}

// subpathsDir holds the pod's subpath bind mounts, as in the kubelet;
// hostPathsDir its hostPath bind mounts.
const (
	subpathsDir  = "volume-subpaths"
	hostPathsDir = "volume-hostpaths"
)

// pruneMounts unmounts and removes the pod's subpath and hostPath bind
// mounts that its spec no longer uses (a container or volume taken out of
// it). Containers hold their own copies of these mounts, so a container
// still running from an older spec keeps its files.
func (m *Manager) pruneMounts(pod *v1.Pod) error {
	podDir, err := m.podDir(string(pod.UID))
	if err != nil {
		return err
	}
	hostPaths, volumes, containers := map[string]bool{}, map[string]bool{}, map[string]bool{}
	for _, v := range pod.Spec.Volumes {
		volumes[v.Name] = true
		hostPaths[v.Name] = v.HostPath != nil
	}
	for _, list := range [][]v1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for _, c := range list {
			containers[c.Name] = true
		}
	}
	var errs []error
	prune := func(dir string, keep func(name string) bool) {
		entries, err := os.ReadDir(dir)
		if err != nil {
			return // none made yet
		}
		for _, e := range entries {
			if !keep(e.Name()) {
				errs = append(errs, removeAllUnmounted(filepath.Join(dir, e.Name())))
			}
		}
	}
	prune(filepath.Join(podDir, hostPathsDir), func(n string) bool { return hostPaths[n] })
	prune(filepath.Join(podDir, subpathsDir), func(n string) bool { return volumes[n] })
	for v := range volumes {
		prune(filepath.Join(podDir, subpathsDir, v), func(n string) bool { return containers[n] })
	}
	return errors.Join(errs...)
}
