package cri

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"

	v1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/kubernetes/pkg/securitycontext"
	"k8s.io/kubernetes/third_party/forked/golang/expansion"
)

// containerParams is everything a container config needs beyond the spec.
type containerParams struct {
	restartCount int
	init         bool
	podIP        string
	imageRef     string // resolved image to run
	mounts       []*runtimeapi.Mount
	env          []v1.EnvVar // resolved by resolveEnv; nil resolves here
}

// Bounds on $(VAR) expansion: a pod whose env doubles through references
// ($(A)$(A) forty times) would otherwise need terabytes. A stored pod is as
// hostile as the command that sent it, so the runtime enforces these even
// though admission rejects such pods earlier.
const (
	// maxEnvValueBytes bounds what expansion adds to one env value, command
	// or args element, or subPathExpr (literal text is bounded by the pod's
	// size).
	maxEnvValueBytes = 32 << 10
	// maxEnvTotalBytes bounds the container's whole environment (names and
	// values) plus what expansion adds to its command and args.
	maxEnvTotalBytes = 1 << 20
)

// boundedMapping resolves $(VAR) like expansion.MappingFuncFor but stops
// substituting once budget bytes were added, recording that it did.
type boundedMapping struct {
	vars   map[string]string
	budget int
	used   int
	over   bool
}

func newBoundedMapping(vars map[string]string, budget int) *boundedMapping {
	return &boundedMapping{vars: vars, budget: budget}
}

func (b *boundedMapping) mapping(name string) string {
	v, ok := b.vars[name]
	if !ok {
		return "$(" + name + ")"
	}
	if b.used+len(v) > b.budget {
		b.over = true
		return ""
	}
	b.used += len(v)
	return v
}

// expandBounded expands s, failing when substitutions exceed the per-value
// bound.
func expandBounded(s string, vars map[string]string) (string, int, error) {
	b := newBoundedMapping(vars, maxEnvValueBytes)
	out := expansion.Expand(s, b.mapping)
	if b.over {
		return "", 0, fmt.Errorf("expansion of $(VAR) references adds more than %d bytes", maxEnvValueBytes)
	}
	return out, b.used, nil
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
	if err := checkLabelName("container", c.Name); err != nil {
		return nil, err
	}
	env := p.env
	if env == nil {
		var err error
		if env, err = resolveEnv(pod, c, m.downward(pod, p.podIP), objects); err != nil {
			return nil, fmt.Errorf("resolve environment of container %s: %w", c.Name, err)
		}
	}
	total := envBytes(env)
	vars := envMap(env)
	command, err := expandAll(c.Command, vars, &total)
	if err != nil {
		return nil, fmt.Errorf("command of container %s: %w", c.Name, err)
	}
	args, err := expandAll(c.Args, vars, &total)
	if err != nil {
		return nil, fmt.Errorf("args of container %s: %w", c.Name, err)
	}
	sc, err := containerSecurityContext(pod, c)
	if err != nil {
		return nil, fmt.Errorf("security context of container %s: %w", c.Name, err)
	}

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
			SecurityContext: sc,
		},
	}
	if i := sidecarOrder(pod, c, p.init); i > 0 {
		cfg.Annotations[AnnotationSidecar] = strconv.Itoa(i)
	}
	if c.TerminationMessagePath != "" {
		cfg.Annotations[AnnotationTerminationMsg] = c.TerminationMessagePath
	}
	if c.TerminationMessagePolicy != "" {
		cfg.Annotations[AnnotationTerminationPolicy] = string(c.TerminationMessagePolicy)
	}
	preStop, err := preStopAnnotation(c)
	if err != nil {
		return nil, err
	}
	if preStop != "" {
		cfg.Annotations[AnnotationPreStop] = preStop
	}
	for _, e := range env {
		cfg.Envs = append(cfg.Envs, &runtimeapi.KeyValue{Key: e.Name, Value: []byte(e.Value)})
	}
	return cfg, nil
}

// expandAll expands each element, adding what substitution added to
// *total and failing beyond the bounds.
func expandAll(in []string, vars map[string]string, total *int) ([]string, error) {
	if in == nil {
		return nil, nil
	}
	out := make([]string, len(in))
	for i, s := range in {
		v, added, err := expandBounded(s, vars)
		if err != nil {
			return nil, fmt.Errorf("element %d: %w", i, err)
		}
		if *total += added; *total > maxEnvTotalBytes {
			return nil, fmt.Errorf("environment and expanded command exceed %d bytes", maxEnvTotalBytes)
		}
		out[i] = v
	}
	return out, nil
}

func envBytes(env []v1.EnvVar) int {
	n := 0
	for _, e := range env {
		n += len(e.Name) + len(e.Value)
	}
	return n
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
func resolveEnv(pod *v1.Pod, c *v1.Container, d downwardValues, objects ObjectSource) ([]v1.EnvVar, error) {
	var env []v1.EnvVar
	index := map[string]int{}
	total := 0
	set := func(name, value string) error {
		if i, ok := index[name]; ok {
			total += len(value) - len(env[i].Value)
			env[i].Value = value
		} else {
			index[name] = len(env)
			env = append(env, v1.EnvVar{Name: name, Value: value})
			total += len(name) + len(value)
		}
		if total > maxEnvTotalBytes {
			return fmt.Errorf("environment exceeds %d bytes at %s", maxEnvTotalBytes, name)
		}
		return nil
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
				if err := set(from.Prefix+k, cm.Data[k]); err != nil {
					return nil, err
				}
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
				if err := set(from.Prefix+k, string(s.Data[k])); err != nil {
					return nil, err
				}
			}
			for _, k := range sortedKeys(s.StringData) {
				if err := set(from.Prefix+k, s.StringData[k]); err != nil {
					return nil, err
				}
			}
		}
	}
	for _, e := range c.Env {
		if e.ValueFrom == nil {
			v, _, err := expandBounded(e.Value, envMap(env))
			if err != nil {
				return nil, fmt.Errorf("env %s: %w", e.Name, err)
			}
			if err := set(e.Name, v); err != nil {
				return nil, err
			}
			continue
		}
		value, ok, err := envValueFrom(pod, c, e.ValueFrom, d, objects)
		if err != nil {
			return nil, fmt.Errorf("env %s: %w", e.Name, err)
		}
		if ok {
			if err := set(e.Name, value); err != nil {
				return nil, err
			}
		}
	}
	return env, nil
}

// envValueFrom resolves one valueFrom; ok is false for a missing optional key.
func envValueFrom(pod *v1.Pod, c *v1.Container, from *v1.EnvVarSource, d downwardValues, objects ObjectSource) (string, bool, error) {
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
		v, err := podFieldValue(pod, from.FieldRef, d)
		return v, err == nil, err
	case from.ResourceFieldRef != nil:
		v, err := resourceFieldValue(pod, c, from.ResourceFieldRef, d)
		return v, err == nil, err
	case from.FileKeyRef != nil:
		return fileKeyValue(from.FileKeyRef, d)
	default:
		return "", false, fmt.Errorf("unsupported valueFrom source")
	}
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

func containerSecurityContext(pod *v1.Pod, c *v1.Container) (*runtimeapi.LinuxContainerSecurityContext, error) {
	sc := &runtimeapi.LinuxContainerSecurityContext{NamespaceOptions: namespaceOptions(pod)}
	seccomp, err := seccompProfile(pod, c)
	if err != nil {
		return nil, err
	}
	sc.Seccomp = seccomp
	sc.Apparmor, sc.ApparmorProfile = appArmorProfile(pod, c)
	sc.SelinuxOptions = seLinuxOptions(pod, c)
	var procMount *v1.ProcMountType
	if c.SecurityContext != nil {
		procMount = c.SecurityContext.ProcMount
	}
	// The kubelet's masked and read-only /proc paths unless the pod asked
	// for (and admission allowed) an unmasked /proc.
	sc.MaskedPaths = securitycontext.ConvertToRuntimeMaskedPaths(procMount)
	sc.ReadonlyPaths = securitycontext.ConvertToRuntimeReadonlyPaths(procMount)
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
		return sc, nil
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
	return sc, nil
}

// seccompProfile is the container's seccomp profile, else the pod's, else
// RuntimeDefault (unlike the kubelet, whose default is Unconfined).
// Unconfined is honoured when asked: admission decides whether a pod may.
// Localhost profiles are refused: mqlet keeps no profile directory.
func seccompProfile(pod *v1.Pod, c *v1.Container) (*runtimeapi.SecurityProfile, error) {
	var p *v1.SeccompProfile
	if c.SecurityContext != nil && c.SecurityContext.SeccompProfile != nil {
		p = c.SecurityContext.SeccompProfile
	} else if pod.Spec.SecurityContext != nil {
		p = pod.Spec.SecurityContext.SeccompProfile
	}
	if p == nil {
		return &runtimeapi.SecurityProfile{ProfileType: runtimeapi.SecurityProfile_RuntimeDefault}, nil
	}
	switch p.Type {
	case v1.SeccompProfileTypeRuntimeDefault:
		return &runtimeapi.SecurityProfile{ProfileType: runtimeapi.SecurityProfile_RuntimeDefault}, nil
	case v1.SeccompProfileTypeUnconfined:
		return &runtimeapi.SecurityProfile{ProfileType: runtimeapi.SecurityProfile_Unconfined}, nil
	case v1.SeccompProfileTypeLocalhost:
		return nil, fmt.Errorf("seccompProfile type Localhost is not supported on this node (no local profile directory); use RuntimeDefault")
	default:
		return nil, fmt.Errorf("seccompProfile type %q is not supported", p.Type)
	}
}

// checkRunAsNonRoot enforces runAsNonRoot against the effective user: the
// runAsUser, else the image's user (uid, or a name that cannot be
// verified), where an image naming no user runs as root. The messages are
// the kubelet's.
func checkRunAsNonRoot(pod *v1.Pod, c *v1.Container, imageUID *int64, imageUser string) error {
	esc := securitycontext.DetermineEffectiveSecurityContext(pod, c)
	if esc == nil || esc.RunAsNonRoot == nil || !*esc.RunAsNonRoot {
		return nil
	}
	podName := pod.Namespace + "/" + pod.Name
	if esc.RunAsUser != nil {
		if *esc.RunAsUser == 0 {
			return fmt.Errorf("container's runAsUser breaks non-root policy (pod: %q, container: %s)", podName, c.Name)
		}
		return nil
	}
	switch {
	case imageUID == nil && imageUser != "":
		return fmt.Errorf("container has runAsNonRoot and image has non-numeric user (%s), cannot verify user is non-root (pod: %q, container: %s)", imageUser, podName, c.Name)
	case imageUID == nil || *imageUID == 0:
		return fmt.Errorf("container has runAsNonRoot and image will run as root (pod: %q, container: %s)", podName, c.Name)
	}
	return nil
}

// capName accepts both NET_ADMIN and CAP_NET_ADMIN and returns the form the
// CRI expects (the runtime adds the CAP_ prefix itself).
func capName(c v1.Capability) string {
	return strings.TrimPrefix(strings.ToUpper(string(c)), "CAP_")
}
