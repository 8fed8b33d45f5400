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

	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/kubernetes/third_party/forked/golang/expansion"
)

const (
	defaultConfigMapMode = 0o644
	defaultSecretMode    = 0o400
	defaultDownwardMode  = 0o644
	defaultProjectedMode = 0o644
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
			if dir, err = m.podVolumeDir(uid, "kubernetes.io~empty-dir", vol.Name); err == nil {
				err = m.prepareEmptyDir(pod, vol.EmptyDir, dir)
			}
		case vol.HostPath != nil:
			dir, err = m.prepareHostPath(uid, vol.Name, vol.HostPath)
		case vol.ConfigMap != nil:
			if dir, err = m.podVolumeDir(uid, "kubernetes.io~configmap", vol.Name); err == nil {
				var files []volumeFile
				if files, err = configMapFiles(pod, vol.ConfigMap, objects); err == nil {
					err = writeAtomicGroup(dir, files, podFSGroup(pod))
				}
				if err == nil {
					// The kubelet's configMap volume root (the mount is read-only).
					err = unix.Chmod(dir, 0o777|currentSetgid(dir))
				}
			}
		case vol.Secret != nil:
			if dir, err = m.podVolumeDir(uid, "kubernetes.io~secret", vol.Name); err == nil {
				err = writeOnTmpfs(dir, podFSGroup(pod), func() ([]volumeFile, error) { return secretFiles(pod, vol.Secret, objects) })
			}
		case vol.DownwardAPI != nil:
			if dir, err = m.podVolumeDir(uid, "kubernetes.io~downward-api", vol.Name); err == nil {
				d := m.downward(pod, "")
				err = writeOnTmpfs(dir, podFSGroup(pod), func() ([]volumeFile, error) {
					return downwardFiles(pod, vol.DownwardAPI.Items, modeOr(vol.DownwardAPI.DefaultMode, defaultDownwardMode), d)
				})
			}
		case vol.Projected != nil:
			if dir, err = m.podVolumeDir(uid, "kubernetes.io~projected", vol.Name); err == nil {
				d := m.downward(pod, "")
				err = writeOnTmpfs(dir, podFSGroup(pod), func() ([]volumeFile, error) { return projectedFiles(pod, vol.Projected, objects, d) })
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

func projectItems(items []v1.KeyToPath, data map[string][]byte, defaultMode uint32, optional bool, what string) ([]volumeFile, error) {
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
			mode = uint32(*it.Mode)
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

func configMapFiles(pod *v1.Pod, src *v1.ConfigMapVolumeSource, objects ObjectSource) ([]volumeFile, error) {
	return keyedFiles(keyedVolume{
		what: "configmap " + pod.Namespace + "/" + src.Name, items: src.Items,
		mode: modeOr(src.DefaultMode, defaultConfigMapMode), optional: src.Optional != nil && *src.Optional,
		read: func() (map[string][]byte, error) { return configMapData(objects, pod.Namespace, src.Name) },
	})
}

func secretFiles(pod *v1.Pod, src *v1.SecretVolumeSource, objects ObjectSource) ([]volumeFile, error) {
	return keyedFiles(keyedVolume{
		what: "secret " + pod.Namespace + "/" + src.SecretName, items: src.Items,
		mode: modeOr(src.DefaultMode, defaultSecretMode), optional: src.Optional != nil && *src.Optional,
		read: func() (map[string][]byte, error) { return secretData(objects, pod.Namespace, src.SecretName) },
	})
}

func configMapData(objects ObjectSource, namespace, name string) (map[string][]byte, error) {
	cm, err := objects.ConfigMap(namespace, name)
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
}

func secretData(objects ObjectSource, namespace, name string) (map[string][]byte, error) {
	s, err := objects.Secret(namespace, name)
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
}

// modeOr is *mode, or def when unset.
func modeOr(mode *int32, def uint32) uint32 {
	if mode != nil {
		return uint32(*mode)
	}
	return def
}

// keyedVolume is a configMap or secret (volume or projection): keys
// projected into files.
type keyedVolume struct {
	what     string
	items    []v1.KeyToPath
	mode     uint32
	optional bool
	read     func() (map[string][]byte, error)
}

func keyedFiles(v keyedVolume) ([]volumeFile, error) {
	data, err := v.read()
	if err != nil {
		if !v.optional {
			return nil, fmt.Errorf("%s: %w", v.what, err)
		}
		data = map[string][]byte{}
	}
	return projectItems(v.items, data, v.mode, v.optional, v.what)
}

// containerMounts maps the container's volumeMounts onto host paths. A
// subPath (or an expanded subPathExpr) is resolved safely beneath its
// volume and bind-mounted under the pod directory (see subpath.go).
func (m *Manager) containerMounts(pod *v1.Pod, c *v1.Container, paths map[string]string, env []v1.EnvVar) ([]*runtimeapi.Mount, error) {
	readOnlyKind := map[string]bool{}
	for _, vol := range pod.Spec.Volumes {
		readOnlyKind[vol.Name] = vol.ConfigMap != nil || vol.Secret != nil || vol.DownwardAPI != nil || vol.Projected != nil
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
	hosts, err := m.hostsMount(pod, c)
	if err != nil {
		return nil, err
	}
	if hosts != nil {
		mounts = append(mounts, hosts)
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

// refreshVolumes rewrites the configMap, secret, downwardAPI and projected
// volumes of a running pod from the current objects, so its containers
// see a change without a restart (the atomic writer leaves unchanged
// volumes alone). subPath mounts keep what they had, as in the kubelet.
// A failure keeps the old files and is reported as FailedMount: the
// running containers are not touched for it.
func (m *Manager) refreshVolumes(pod *v1.Pod, objects ObjectSource, events EventRecorder) {
	refreshable := *pod
	refreshable.Spec.Volumes = nil
	for _, vol := range pod.Spec.Volumes {
		if vol.ConfigMap != nil || vol.Secret != nil || vol.DownwardAPI != nil || vol.Projected != nil {
			refreshable.Spec.Volumes = append(refreshable.Spec.Volumes, vol)
		}
	}
	if len(refreshable.Spec.Volumes) == 0 {
		return
	}
	if _, err := m.prepareVolumes(&refreshable, objects); err != nil {
		events.Event(pod, v1.EventTypeWarning, "FailedMount", err.Error())
		m.log.Warn().Err(err).Str("pod", pod.Namespace+"/"+pod.Name).Msg("refreshing volumes of a running pod")
	}
}

// currentSetgid is the setgid bit dir has (fsGroup sets it), to keep.
func currentSetgid(dir string) uint32 {
	var st unix.Stat_t
	if unix.Stat(dir, &st) == nil {
		return st.Mode & unix.S_ISGID
	}
	return 0
}
