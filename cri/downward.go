package cri

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	resourcehelper "k8s.io/kubernetes/pkg/api/v1/resource"
	podshelper "k8s.io/kubernetes/pkg/apis/core/pods"
	"k8s.io/kubernetes/pkg/fieldpath"
	envutil "k8s.io/kubernetes/pkg/kubelet/util/env"
)

// downwardValues is what fieldRef and resourceFieldRef read beyond the pod
// itself: its addresses, the node's, and the node's allocatable resources
// (the limit of a container that sets none, as in the kubelet).
type downwardValues struct {
	podIPs      []string
	hostIPs     []string
	allocatable v1.ResourceList
	// volumes are the pod's volumes on the node by name, for fileKeyRef
	// (nil: fileKeyRef cannot resolve).
	volumes map[string]string
}

// downward is the downward API context of pod, whose sandbox has podIP
// ("" when it has none yet). A hostNetwork pod's IPs are the node's.
func (m *Manager) downward(pod *v1.Pod, podIP string) downwardValues {
	d := downwardValues{hostIPs: m.cfg.HostIPs, allocatable: m.allocatable()}
	switch {
	case podIP != "":
		d.podIPs = []string{podIP}
	case pod.Spec.HostNetwork:
		d.podIPs = m.cfg.HostIPs
	}
	return d
}

// allocatable is the configured allocatable resources, else the machine's
// CPUs and memory.
func (m *Manager) allocatable() v1.ResourceList {
	if m.cfg.Allocatable != nil {
		return m.cfg.Allocatable
	}
	out := v1.ResourceList{v1.ResourceCPU: *resource.NewQuantity(int64(goruntime.NumCPU()), resource.DecimalSI)}
	if mem, err := memTotal("/proc/meminfo"); err == nil {
		out[v1.ResourceMemory] = *resource.NewQuantity(mem, resource.BinarySI)
	}
	return out
}

// memTotal reads MemTotal (bytes) from a meminfo file.
func memTotal(path string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "MemTotal:")
		if !ok {
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("parse MemTotal in %s: %w", path, err)
		}
		return kb << 10, nil
	}
	return 0, fmt.Errorf("no MemTotal in %s", path)
}

// podFieldValue resolves a fieldRef the kubelet's way (same paths, same
// formatting of labels and annotations).
func podFieldValue(pod *v1.Pod, fs *v1.ObjectFieldSelector, d downwardValues) (string, error) {
	version := fs.APIVersion
	if version == "" {
		version = "v1"
	}
	path, _, err := podshelper.ConvertDownwardAPIFieldLabel(version, fs.FieldPath, "")
	if err != nil {
		return "", err
	}
	switch path {
	case "spec.nodeName":
		return pod.Spec.NodeName, nil
	case "spec.serviceAccountName":
		return pod.Spec.ServiceAccountName, nil
	case "status.hostIP":
		if len(d.hostIPs) == 0 {
			return "", fmt.Errorf("status.hostIP: the node has no address")
		}
		return d.hostIPs[0], nil
	case "status.hostIPs":
		if len(d.hostIPs) == 0 {
			return "", fmt.Errorf("status.hostIPs: the node has no address")
		}
		return strings.Join(d.hostIPs, ","), nil
	case "status.podIP":
		if len(d.podIPs) == 0 {
			return "", nil
		}
		return d.podIPs[0], nil
	case "status.podIPs":
		return strings.Join(d.podIPs, ","), nil
	case "spec.restartPolicy", "spec.schedulerName", "status.phase":
		// Not allowed by validation in env or volumes; refused rather than
		// answered with a guess.
		return "", fmt.Errorf("fieldRef %q is not supported", fs.FieldPath)
	}
	return fieldpath.ExtractFieldPathAsString(pod, path)
}

// resourceFieldValue resolves a resourceFieldRef of container c (the
// container named in the selector, when it names one). A container with
// no limit reads the pod's limit, else the node's allocatable, as in the
// kubelet.
func resourceFieldValue(pod *v1.Pod, c *v1.Container, fs *v1.ResourceFieldSelector, d downwardValues) (string, error) {
	name := fs.ContainerName
	if name == "" {
		if c == nil {
			return "", fmt.Errorf("resourceFieldRef %q names no container", fs.Resource)
		}
		name = c.Name
	}
	alloc := d.allocatable.DeepCopy()
	if alloc == nil {
		alloc = v1.ResourceList{}
	}
	for _, r := range []v1.ResourceName{v1.ResourceCPU, v1.ResourceMemory, v1.ResourceEphemeralStorage} {
		if pod.Spec.Resources == nil {
			break
		}
		if q, ok := pod.Spec.Resources.Limits[r]; ok && !q.IsZero() {
			alloc[r] = q.DeepCopy()
		}
	}
	v, err := resourcehelper.ExtractResourceValueByContainerNameAndNodeAllocatable(fs, pod, name, alloc)
	if err != nil {
		return "", fmt.Errorf("resourceFieldRef %q of container %q: %w", fs.Resource, name, err)
	}
	return v, nil
}

// downwardFiles are the files of a downwardAPI volume or projection:
// fieldRef and resourceFieldRef values, as the kubelet writes them.
func downwardFiles(pod *v1.Pod, items []v1.DownwardAPIVolumeFile, defaultMode uint32, d downwardValues) ([]volumeFile, error) {
	files := make([]volumeFile, 0, len(items))
	for _, it := range items {
		var (
			v   string
			err error
		)
		switch {
		case it.FieldRef != nil:
			v, err = podFieldValue(pod, it.FieldRef, d)
		case it.ResourceFieldRef != nil:
			v, err = resourceFieldValue(pod, nil, it.ResourceFieldRef, d)
		default:
			err = fmt.Errorf("names neither fieldRef nor resourceFieldRef")
		}
		if err != nil {
			return nil, fmt.Errorf("downwardAPI item %q: %w", it.Path, err)
		}
		p := filepath.Clean(it.Path)
		if checkRelative(it.Path) != nil || p == "." || strings.HasPrefix(p, "..") {
			return nil, fmt.Errorf("downwardAPI item path %q escapes the volume", it.Path)
		}
		files = append(files, volumeFile{path: p, data: []byte(v), mode: modeOr(it.Mode, defaultMode)})
	}
	return files, nil
}

// projectedFiles are the files of a projected volume: its configMap,
// secret and downwardAPI sources together. Token and trust bundle sources
// need an API server this node does not have, and are refused.
func projectedFiles(pod *v1.Pod, src *v1.ProjectedVolumeSource, objects ObjectSource, d downwardValues) ([]volumeFile, error) {
	mode := modeOr(src.DefaultMode, defaultProjectedMode)
	var files []volumeFile
	for i, s := range src.Sources {
		var (
			part []volumeFile
			err  error
		)
		switch {
		case s.ConfigMap != nil:
			part, err = keyedFiles(keyedVolume{
				what: "configmap " + pod.Namespace + "/" + s.ConfigMap.Name, items: s.ConfigMap.Items,
				mode: mode, optional: s.ConfigMap.Optional != nil && *s.ConfigMap.Optional,
				read: func() (map[string][]byte, error) { return configMapData(objects, pod.Namespace, s.ConfigMap.Name) },
			})
		case s.Secret != nil:
			part, err = keyedFiles(keyedVolume{
				what: "secret " + pod.Namespace + "/" + s.Secret.Name, items: s.Secret.Items,
				mode: mode, optional: s.Secret.Optional != nil && *s.Secret.Optional,
				read: func() (map[string][]byte, error) { return secretData(objects, pod.Namespace, s.Secret.Name) },
			})
		case s.DownwardAPI != nil:
			part, err = downwardFiles(pod, s.DownwardAPI.Items, mode, d)
		case s.ServiceAccountToken != nil:
			err = fmt.Errorf("serviceAccountToken projection is not supported: this node has no API server to issue tokens: %w", errRefused)
		case s.ClusterTrustBundle != nil:
			err = fmt.Errorf("clusterTrustBundle projection is not supported: this node has no API server: %w", errRefused)
		default:
			err = fmt.Errorf("projection source of an unsupported kind: %w", errRefused)
		}
		if err != nil {
			return nil, fmt.Errorf("projected source %d: %w", i, err)
		}
		files = append(files, part...)
	}
	return files, nil
}

// maxEnvFileBytes bounds an env file read for fileKeyRef: a container
// writes it, so it is as hostile as the pod.
const maxEnvFileBytes = 1 << 20

// fileKeyValue resolves a fileKeyRef as the kubelet does: the key of an
// env file in one of the pod's (emptyDir) volumes, written by an init
// container. The file is opened beneath the volume (no symlink leads out
// of it), must be a regular file within the bound, and is parsed with the
// kubelet's own parser. ok is false for a missing optional key.
func fileKeyValue(ref *v1.FileKeySelector, d downwardValues) (string, bool, error) {
	root, found := d.volumes[ref.VolumeName]
	if !found {
		return "", false, fmt.Errorf("cannot find the volume %q referenced by fileKeyRef", ref.VolumeName)
	}
	var opener beneathOpener
	fd, err := opener.openSubpath(root, ref.Path, false)
	if err != nil {
		return "", false, fmt.Errorf("fileKeyRef %s in volume %s: %w", ref.Path, ref.VolumeName, err)
	}
	defer closeFd(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return "", false, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return "", false, fmt.Errorf("fileKeyRef %s in volume %s is not a regular file", ref.Path, ref.VolumeName)
	}
	if st.Size > maxEnvFileBytes {
		return "", false, fmt.Errorf("fileKeyRef %s in volume %s holds more than %d bytes", ref.Path, ref.VolumeName, maxEnvFileBytes)
	}
	// The parser opens the fd's /proc link: exactly the file checked above.
	v, err := envutil.ParseEnv("/proc/self/fd/"+strconv.Itoa(fd), ref.Key)
	if err != nil {
		return "", false, fmt.Errorf("fileKeyRef %s in volume %s: %w", ref.Path, ref.VolumeName, err)
	}
	if v == "" {
		if ref.Optional != nil && *ref.Optional {
			return "", false, nil
		}
		return "", false, fmt.Errorf("environment variable key %q not found in file %s of volume %s", ref.Key, ref.Path, ref.VolumeName)
	}
	return v, true, nil
}
