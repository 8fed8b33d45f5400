package runtime

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"

	v1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/kubernetes/third_party/forked/golang/expansion"
)

// containerParams is everything a container config needs beyond the spec.
type containerParams struct {
	restartCount int
	init         bool
	podIP        string
	imageRef     string // resolved image to run
	mounts       []*runtimeapi.Mount
}

const (
	cpuPeriod      = 100000 // µs, the CFS default
	minCPUShares   = 2
	minCPUQuota    = 1000
	sharesPerCPU   = 1024
	milliCPUPerCPU = 1000
)

// buildContainerConfig turns one container of pod into its CRI config.
func (m *Manager) buildContainerConfig(pod *v1.Pod, c *v1.Container, p containerParams, objects ObjectSource) (*runtimeapi.ContainerConfig, error) {
	env, err := resolveEnv(pod, c, p.podIP, objects)
	if err != nil {
		return nil, fmt.Errorf("resolve environment of container %s: %w", c.Name, err)
	}
	mapping := expansion.MappingFuncFor(envMap(env))
	command := expandAll(c.Command, mapping)
	args := expandAll(c.Args, mapping)

	cfg := &runtimeapi.ContainerConfig{
		Metadata:   &runtimeapi.ContainerMetadata{Name: c.Name, Attempt: uint32(p.restartCount)},
		Image:      &runtimeapi.ImageSpec{Image: p.imageRef, UserSpecifiedImage: c.Image},
		Command:    command,
		Args:       args,
		WorkingDir: c.WorkingDir,
		Labels:     containerLabels(pod, c, p.init),
		Annotations: map[string]string{
			AnnotationContainerHash: HashContainer(c),
			AnnotationRestartCount:  strconv.Itoa(p.restartCount),
			AnnotationGracePeriod:   strconv.FormatInt(gracePeriod(pod, nil), 10),
		},
		Mounts:    p.mounts,
		LogPath:   filepath.Join(c.Name, strconv.Itoa(p.restartCount)+".log"),
		Stdin:     c.Stdin,
		StdinOnce: c.StdinOnce,
		Tty:       c.TTY,
		Linux: &runtimeapi.LinuxContainerConfig{
			Resources:       linuxResources(c),
			SecurityContext: containerSecurityContext(pod, c),
		},
	}
	if c.TerminationMessagePath != "" {
		cfg.Annotations[AnnotationTerminationMsg] = c.TerminationMessagePath
	}
	for _, e := range env {
		cfg.Envs = append(cfg.Envs, &runtimeapi.KeyValue{Key: e.Name, Value: []byte(e.Value)})
	}
	return cfg, nil
}

func expandAll(in []string, mapping func(string) string) []string {
	if in == nil {
		return nil
	}
	out := make([]string, len(in))
	for i, s := range in {
		out[i] = expansion.Expand(s, mapping)
	}
	return out
}

func envMap(env []v1.EnvVar) map[string]string {
	m := make(map[string]string, len(env))
	for _, e := range env {
		m[e.Name] = e.Value
	}
	return m
}

// resolveEnv computes the container's environment as the kubelet does:
// envFrom first, then env (which wins), with $(VAR) expansion in env values.
func resolveEnv(pod *v1.Pod, c *v1.Container, podIP string, objects ObjectSource) ([]v1.EnvVar, error) {
	var env []v1.EnvVar
	index := map[string]int{}
	set := func(name, value string) {
		if i, ok := index[name]; ok {
			env[i].Value = value
			return
		}
		index[name] = len(env)
		env = append(env, v1.EnvVar{Name: name, Value: value})
	}
	for _, from := range c.EnvFrom {
		switch {
		case from.ConfigMapRef != nil:
			optional := from.ConfigMapRef.Optional != nil && *from.ConfigMapRef.Optional
			cm, err := objects.ConfigMap(pod.Namespace, from.ConfigMapRef.Name)
			if err != nil || cm == nil {
				if optional {
					continue
				}
				return nil, fmt.Errorf("configmap %s/%s for envFrom: %w", pod.Namespace, from.ConfigMapRef.Name, errOrMissing(err))
			}
			for _, k := range sortedKeys(cm.Data) {
				set(from.Prefix+k, cm.Data[k])
			}
		case from.SecretRef != nil:
			optional := from.SecretRef.Optional != nil && *from.SecretRef.Optional
			s, err := objects.Secret(pod.Namespace, from.SecretRef.Name)
			if err != nil || s == nil {
				if optional {
					continue
				}
				return nil, fmt.Errorf("secret %s/%s for envFrom: %w", pod.Namespace, from.SecretRef.Name, errOrMissing(err))
			}
			for _, k := range sortedKeys(s.Data) {
				set(from.Prefix+k, string(s.Data[k]))
			}
			for _, k := range sortedKeys(s.StringData) {
				set(from.Prefix+k, s.StringData[k])
			}
		}
	}
	for _, e := range c.Env {
		if e.ValueFrom == nil {
			set(e.Name, expansion.Expand(e.Value, expansion.MappingFuncFor(envMap(env))))
			continue
		}
		value, ok, err := envValueFrom(pod, e.ValueFrom, podIP, objects)
		if err != nil {
			return nil, fmt.Errorf("env %s: %w", e.Name, err)
		}
		if ok {
			set(e.Name, value)
		}
	}
	return env, nil
}

// envValueFrom resolves one valueFrom; ok is false for a missing optional key.
func envValueFrom(pod *v1.Pod, from *v1.EnvVarSource, podIP string, objects ObjectSource) (string, bool, error) {
	switch {
	case from.ConfigMapKeyRef != nil:
		ref := from.ConfigMapKeyRef
		optional := ref.Optional != nil && *ref.Optional
		cm, err := objects.ConfigMap(pod.Namespace, ref.Name)
		if err != nil || cm == nil {
			if optional {
				return "", false, nil
			}
			return "", false, fmt.Errorf("configmap %s/%s: %w", pod.Namespace, ref.Name, errOrMissing(err))
		}
		if v, ok := cm.Data[ref.Key]; ok {
			return v, true, nil
		}
		if v, ok := cm.BinaryData[ref.Key]; ok {
			return string(v), true, nil
		}
		if optional {
			return "", false, nil
		}
		return "", false, fmt.Errorf("configmap %s/%s has no key %q", pod.Namespace, ref.Name, ref.Key)
	case from.SecretKeyRef != nil:
		ref := from.SecretKeyRef
		optional := ref.Optional != nil && *ref.Optional
		s, err := objects.Secret(pod.Namespace, ref.Name)
		if err != nil || s == nil {
			if optional {
				return "", false, nil
			}
			return "", false, fmt.Errorf("secret %s/%s: %w", pod.Namespace, ref.Name, errOrMissing(err))
		}
		if v, ok := s.Data[ref.Key]; ok {
			return string(v), true, nil
		}
		if v, ok := s.StringData[ref.Key]; ok {
			return v, true, nil
		}
		if optional {
			return "", false, nil
		}
		return "", false, fmt.Errorf("secret %s/%s has no key %q", pod.Namespace, ref.Name, ref.Key)
	case from.FieldRef != nil:
		v, err := podField(pod, from.FieldRef.FieldPath, podIP)
		return v, err == nil, err
	default:
		return "", false, fmt.Errorf("unsupported valueFrom source")
	}
}

func podField(pod *v1.Pod, fieldPath, podIP string) (string, error) {
	switch fieldPath {
	case "metadata.name":
		return pod.Name, nil
	case "metadata.namespace":
		return pod.Namespace, nil
	case "metadata.uid":
		return string(pod.UID), nil
	case "status.podIP":
		return podIP, nil
	case "spec.nodeName":
		return pod.Spec.NodeName, nil
	case "spec.serviceAccountName":
		return pod.Spec.ServiceAccountName, nil
	}
	for prefix, values := range map[string]map[string]string{
		"metadata.labels": pod.Labels, "metadata.annotations": pod.Annotations,
	} {
		if key, ok := strings.CutPrefix(fieldPath, prefix+"['"); ok && strings.HasSuffix(key, "']") {
			return values[strings.TrimSuffix(key, "']")], nil
		}
	}
	return "", fmt.Errorf("unsupported fieldRef %q", fieldPath)
}

func errOrMissing(err error) error {
	if err != nil {
		return err
	}
	return fmt.Errorf("not found")
}

// linuxResources maps requests and limits to cgroup settings.
func linuxResources(c *v1.Container) *runtimeapi.LinuxContainerResources {
	r := &runtimeapi.LinuxContainerResources{CpuShares: minCPUShares}
	cpuRequest := c.Resources.Requests.Cpu()
	if cpuRequest.IsZero() {
		cpuRequest = c.Resources.Limits.Cpu()
	}
	if !cpuRequest.IsZero() {
		r.CpuShares = max(cpuRequest.MilliValue()*sharesPerCPU/milliCPUPerCPU, minCPUShares)
	}
	if limit := c.Resources.Limits.Cpu(); !limit.IsZero() {
		r.CpuPeriod = cpuPeriod
		r.CpuQuota = max(limit.MilliValue()*cpuPeriod/milliCPUPerCPU, minCPUQuota)
	}
	if limit := c.Resources.Limits.Memory(); !limit.IsZero() {
		r.MemoryLimitInBytes = limit.Value()
	}
	r.OomScoreAdj = oomScoreAdj(c)
	return r
}

// oomScoreAdj follows the kubelet's QoS classes, for one container.
func oomScoreAdj(c *v1.Container) int64 {
	req, lim := c.Resources.Requests, c.Resources.Limits
	if len(req) == 0 && len(lim) == 0 {
		return 1000 // best effort
	}
	guaranteed := true
	for _, name := range []v1.ResourceName{v1.ResourceCPU, v1.ResourceMemory} {
		l, ok := lim[name]
		r, rok := req[name]
		if !ok || (rok && r.Cmp(l) != 0) {
			guaranteed = false
		}
	}
	if guaranteed {
		return -997
	}
	return 999
}

func containerSecurityContext(pod *v1.Pod, c *v1.Container) *runtimeapi.LinuxContainerSecurityContext {
	sc := &runtimeapi.LinuxContainerSecurityContext{NamespaceOptions: namespaceOptions(pod)}
	if psc := pod.Spec.SecurityContext; psc != nil {
		if psc.RunAsUser != nil {
			sc.RunAsUser = &runtimeapi.Int64Value{Value: *psc.RunAsUser}
		}
		if psc.RunAsGroup != nil {
			sc.RunAsGroup = &runtimeapi.Int64Value{Value: *psc.RunAsGroup}
		}
		sc.SupplementalGroups = append(sc.SupplementalGroups, psc.SupplementalGroups...)
		if psc.FSGroup != nil {
			sc.SupplementalGroups = append(sc.SupplementalGroups, *psc.FSGroup)
		}
	}
	csc := c.SecurityContext
	if csc == nil {
		return sc
	}
	if csc.RunAsUser != nil {
		sc.RunAsUser = &runtimeapi.Int64Value{Value: *csc.RunAsUser}
	}
	if csc.RunAsGroup != nil {
		sc.RunAsGroup = &runtimeapi.Int64Value{Value: *csc.RunAsGroup}
	}
	if csc.ReadOnlyRootFilesystem != nil {
		sc.ReadonlyRootfs = *csc.ReadOnlyRootFilesystem
	}
	if csc.Privileged != nil {
		sc.Privileged = *csc.Privileged
	}
	if csc.AllowPrivilegeEscalation != nil {
		sc.NoNewPrivs = !*csc.AllowPrivilegeEscalation
	}
	if caps := csc.Capabilities; caps != nil {
		sc.Capabilities = &runtimeapi.Capability{}
		for _, c := range caps.Add {
			sc.Capabilities.AddCapabilities = append(sc.Capabilities.AddCapabilities, capName(c))
		}
		for _, c := range caps.Drop {
			sc.Capabilities.DropCapabilities = append(sc.Capabilities.DropCapabilities, capName(c))
		}
	}
	return sc
}

// capName accepts both NET_ADMIN and CAP_NET_ADMIN and returns the form the
// CRI expects (the runtime adds the CAP_ prefix itself).
func capName(c v1.Capability) string {
	return strings.TrimPrefix(strings.ToUpper(string(c)), "CAP_")
}
