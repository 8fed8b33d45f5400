package cri

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"strconv"

	v1 "k8s.io/api/core/v1"
)

// Labels and annotations mqlet puts on what it creates. The io.kubernetes.*
// ones are the kubelet's, so standard tools understand them.
const (
	LabelManaged       = "io.mqlet.managed"
	LabelPodName       = "io.kubernetes.pod.name"
	LabelPodNamespace  = "io.kubernetes.pod.namespace"
	LabelPodUID        = "io.kubernetes.pod.uid"
	LabelContainerName = "io.kubernetes.container.name"
	LabelInitContainer = "io.mqlet.container.init"

	AnnotationContainerHash  = "io.mqlet.container.hash"
	AnnotationRestartCount   = "io.kubernetes.container.restartCount"
	AnnotationSandboxHash    = "io.mqlet.sandbox.hash"
	AnnotationTerminationMsg = "io.kubernetes.container.terminationMessagePath"
	// AnnotationGracePeriod keeps the pod's terminationGracePeriodSeconds on
	// each container, so a pod killed without its spec (deleted while mqlet
	// was down) still gets its own grace period.
	AnnotationGracePeriod = "io.kubernetes.pod.terminationGracePeriod"
)

func managedSelector() map[string]string { return map[string]string{LabelManaged: "true"} }

func podSelector(uid string) map[string]string {
	return map[string]string{LabelManaged: "true", LabelPodUID: uid}
}

func podLabels(pod *v1.Pod) map[string]string {
	labels := make(map[string]string, len(pod.Labels)+4)
	for k, v := range pod.Labels {
		labels[k] = v
	}
	labels[LabelManaged] = "true"
	labels[LabelPodName] = pod.Name
	labels[LabelPodNamespace] = pod.Namespace
	labels[LabelPodUID] = string(pod.UID)
	return labels
}

func containerLabels(pod *v1.Pod, c *v1.Container, init bool) map[string]string {
	return map[string]string{
		LabelManaged:       "true",
		LabelPodName:       pod.Name,
		LabelPodNamespace:  pod.Namespace,
		LabelPodUID:        string(pod.UID),
		LabelContainerName: c.Name,
		LabelInitContainer: strconv.FormatBool(init),
	}
}

// BackoffKey identifies one spec of one container of one pod for
// RestartBackoff, as the kubelet's key does (pod name, namespace, uid,
// container name, spec hash): a changed spec starts with no backoff of
// its own, so the crash loop of an old spec never holds back the new one.
func BackoffKey(pod *v1.Pod, c *v1.Container) string {
	return pod.Name + "_" + pod.Namespace + "_" + string(pod.UID) + "_" + c.Name + "_" + HashContainer(c)
}

// HashContainer hashes a container spec; a change means the container must
// be replaced.
func HashContainer(c *v1.Container) string { return hashJSON(c) }

// OfOlderSpec reports whether attempt s was created from another spec than
// c (its recorded hash differs): it is the container being replaced, so
// its exit says nothing of how c runs, and c has not run yet. An attempt
// with no hash recorded counts as c's own.
func OfOlderSpec(c *v1.Container, s *ContainerStatus) bool {
	return s != nil && s.SpecHash != "" && s.SpecHash != HashContainer(c)
}

// sandboxSpec is the part of a pod spec baked into its sandbox: a change
// needs a new sandbox.
type sandboxSpec struct {
	HostNetwork bool               `json:"hostNetwork,omitempty"`
	HostPID     bool               `json:"hostPID,omitempty"`
	HostIPC     bool               `json:"hostIPC,omitempty"`
	Hostname    string             `json:"hostname,omitempty"`
	Subdomain   string             `json:"subdomain,omitempty"`
	DNSPolicy   v1.DNSPolicy       `json:"dnsPolicy,omitempty"`
	DNSConfig   *v1.PodDNSConfig   `json:"dnsConfig,omitempty"`
	Ports       []v1.ContainerPort `json:"ports,omitempty"`
	Sysctls     []v1.Sysctl        `json:"sysctls,omitempty"`
	HostAliases []v1.HostAlias     `json:"hostAliases,omitempty"`
	Runtime     *string            `json:"runtimeClassName,omitempty"`
	Overhead    v1.ResourceList    `json:"overhead,omitempty"`
	Share       *bool              `json:"shareProcessNamespace,omitempty"`
	// Pod-level resources are written to the pod cgroup before the sandbox
	// runs, so a change needs a new sandbox. Nil leaves older hashes as they were.
	Resources *v1.ResourceRequirements `json:"resources,omitempty"`
}

// HashSandbox hashes the sandbox-relevant part of a pod spec.
func HashSandbox(pod *v1.Pod) string {
	s := sandboxSpec{
		HostNetwork: pod.Spec.HostNetwork,
		HostPID:     pod.Spec.HostPID,
		HostIPC:     pod.Spec.HostIPC,
		Hostname:    pod.Spec.Hostname,
		Subdomain:   pod.Spec.Subdomain,
		DNSPolicy:   pod.Spec.DNSPolicy,
		DNSConfig:   pod.Spec.DNSConfig,
		Ports:       sandboxPorts(pod),
		HostAliases: pod.Spec.HostAliases,
		Runtime:     pod.Spec.RuntimeClassName,
		Share:       pod.Spec.ShareProcessNamespace,
		Resources:   pod.Spec.Resources,
	}
	if sc := pod.Spec.SecurityContext; sc != nil {
		s.Sysctls = sc.Sysctls
	}
	return hashJSON(s)
}

// sandboxPorts are the container ports that need a host port mapping.
func sandboxPorts(pod *v1.Pod) []v1.ContainerPort {
	var ports []v1.ContainerPort
	for _, c := range pod.Spec.Containers {
		for _, p := range c.Ports {
			if p.HostPort != 0 {
				ports = append(ports, p)
			}
		}
	}
	return ports
}

func hashJSON(v any) string {
	data, err := json.Marshal(v)
	if err != nil {
		// Only unmarshalable values (channels, funcs) fail; API types never do.
		panic("hash: " + err.Error())
	}
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:8])
}
