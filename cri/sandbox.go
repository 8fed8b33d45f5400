package cri

import (
	"bufio"
	"fmt"
	"os"
	"path"
	"strings"

	v1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// podLogDir is where the runtime writes the pod's container logs.
func (m *Manager) podLogDir(namespace, name, uid string) (string, error) {
	if err := checkPodIdentity(uid, name, namespace); err != nil {
		return "", err
	}
	return childOf(m.cfg.PodLogDir, namespace+"_"+name+"_"+uid)
}

// podDir holds the pod's volumes and subpath mounts.
func (m *Manager) podDir(uid string) (string, error) {
	if err := checkUID(uid); err != nil {
		return "", err
	}
	return childOf(m.cfg.PodDir, uid)
}

// podCgroupParent is the pod's cgroupfs parent.
func (m *Manager) podCgroupParent(uid string) (string, error) {
	if err := checkUID(uid); err != nil {
		return "", err
	}
	return path.Join(m.cfg.CgroupRoot, "pod"+uid), nil
}

// buildSandboxConfig turns a pod into the CRI sandbox config for attempt.
func (m *Manager) buildSandboxConfig(pod *v1.Pod, attempt uint32) (*runtimeapi.PodSandboxConfig, error) {
	uid := string(pod.UID)
	logDir, err := m.podLogDir(pod.Namespace, pod.Name, uid)
	if err != nil {
		return nil, err
	}
	cgroupParent, err := m.podCgroupParent(uid)
	if err != nil {
		return nil, err
	}
	annotations := make(map[string]string, len(pod.Annotations)+1)
	for k, v := range pod.Annotations {
		annotations[k] = v
	}
	annotations[AnnotationSandboxHash] = HashSandbox(pod)

	cfg := &runtimeapi.PodSandboxConfig{
		Metadata: &runtimeapi.PodSandboxMetadata{
			Name:      pod.Name,
			Uid:       uid,
			Namespace: pod.Namespace,
			Attempt:   attempt,
		},
		Labels:       podLabels(pod),
		Annotations:  annotations,
		LogDirectory: logDir,
		Linux: &runtimeapi.LinuxPodSandboxConfig{
			CgroupParent: cgroupParent,
			SecurityContext: &runtimeapi.LinuxSandboxSecurityContext{
				NamespaceOptions: namespaceOptions(pod),
				Privileged:       podHasPrivileged(pod),
			},
		},
	}
	// The pause container too runs under the pod's seccomp profile.
	seccomp, err := seccompProfile(pod, &v1.Container{})
	if err != nil {
		return nil, err
	}
	cfg.Linux.SecurityContext.Seccomp = seccomp
	cfg.Linux.SecurityContext.SelinuxOptions = seLinuxOptions(pod, &v1.Container{})
	// runc cannot set a hostname without a private UTS namespace.
	if !pod.Spec.HostNetwork {
		cfg.Hostname = podHostname(pod)
		if fqdn := m.podFQDN(pod); fqdn != "" && pod.Spec.SetHostnameAsFQDN != nil && *pod.Spec.SetHostnameAsFQDN {
			// The kubelet's bound: the kernel's hostname holds 64 bytes.
			if len(fqdn) > 64 {
				return nil, fmt.Errorf("setHostnameAsFQDN: FQDN %s is too long (64 characters is the max, %d characters requested): %w", fqdn, len(fqdn), errRefused)
			}
			cfg.Hostname = fqdn
		}
	}
	if sc := pod.Spec.SecurityContext; sc != nil {
		lsc := cfg.Linux.SecurityContext
		if sc.RunAsUser != nil {
			lsc.RunAsUser = &runtimeapi.Int64Value{Value: *sc.RunAsUser}
		}
		if sc.RunAsGroup != nil {
			lsc.RunAsGroup = &runtimeapi.Int64Value{Value: *sc.RunAsGroup}
		}
		lsc.SupplementalGroups = append(lsc.SupplementalGroups, sc.SupplementalGroups...)
		if sc.FSGroup != nil {
			lsc.SupplementalGroups = append(lsc.SupplementalGroups, *sc.FSGroup)
		}
		if len(sc.Sysctls) > 0 {
			cfg.Linux.Sysctls = map[string]string{}
			for _, s := range sc.Sysctls {
				cfg.Linux.Sysctls[s.Name] = s.Value
			}
		}
	}
	if !pod.Spec.HostNetwork {
		for _, p := range sandboxPorts(pod) {
			cfg.PortMappings = append(cfg.PortMappings, &runtimeapi.PortMapping{
				Protocol:      toProtocol(p.Protocol),
				ContainerPort: p.ContainerPort,
				HostPort:      p.HostPort,
				HostIp:        p.HostIP,
			})
		}
	}
	dns, err := m.dnsConfig(pod)
	if err != nil {
		return nil, err
	}
	cfg.DnsConfig = dns
	return cfg, nil
}

func podHostname(pod *v1.Pod) string {
	if pod.Spec.Hostname != "" {
		return pod.Spec.Hostname
	}
	name := pod.Name
	if len(name) > 63 {
		name = strings.TrimRight(name[:63], "-.")
	}
	return name
}

func podHasPrivileged(pod *v1.Pod) bool {
	for _, list := range [][]v1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for _, c := range list {
			if c.SecurityContext != nil && c.SecurityContext.Privileged != nil && *c.SecurityContext.Privileged {
				return true
			}
		}
	}
	return false
}

func namespaceOptions(pod *v1.Pod) *runtimeapi.NamespaceOption {
	ns := &runtimeapi.NamespaceOption{
		Network: runtimeapi.NamespaceMode_POD,
		Pid:     runtimeapi.NamespaceMode_CONTAINER,
		Ipc:     runtimeapi.NamespaceMode_POD,
	}
	if pod.Spec.HostNetwork {
		ns.Network = runtimeapi.NamespaceMode_NODE
	}
	if pod.Spec.ShareProcessNamespace != nil && *pod.Spec.ShareProcessNamespace {
		ns.Pid = runtimeapi.NamespaceMode_POD
	}
	if pod.Spec.HostPID {
		ns.Pid = runtimeapi.NamespaceMode_NODE
	}
	if pod.Spec.HostIPC {
		ns.Ipc = runtimeapi.NamespaceMode_NODE
	}
	return ns
}

func toProtocol(p v1.Protocol) runtimeapi.Protocol {
	switch p {
	case v1.ProtocolUDP:
		return runtimeapi.Protocol_UDP
	case v1.ProtocolSCTP:
		return runtimeapi.Protocol_SCTP
	default:
		return runtimeapi.Protocol_TCP
	}
}

// dnsConfig derives the pod's resolver settings from the node's resolv.conf
// (mqlet runs no cluster DNS, so ClusterFirst behaves like Default) and the
// pod's dnsConfig.
func (m *Manager) dnsConfig(pod *v1.Pod) (*runtimeapi.DNSConfig, error) {
	dns := &runtimeapi.DNSConfig{}
	if pod.Spec.DNSPolicy != v1.DNSNone {
		servers, searches, options, err := parseResolvConf(m.cfg.ResolvConf)
		if err != nil {
			return nil, err
		}
		dns.Servers, dns.Searches, dns.Options = servers, searches, options
	}
	if c := pod.Spec.DNSConfig; c != nil {
		dns.Servers = append(dns.Servers, c.Nameservers...)
		dns.Searches = append(dns.Searches, c.Searches...)
		for _, o := range c.Options {
			opt := o.Name
			if o.Value != nil {
				opt += ":" + *o.Value
			}
			dns.Options = append(dns.Options, opt)
		}
	}
	return dns, nil
}

// parseResolvConf reads nameserver, search and options lines. A missing file
// means no settings.
func parseResolvConf(file string) (servers, searches, options []string, err error) {
	f, err := os.Open(file)
	if os.IsNotExist(err) {
		return nil, nil, nil, nil
	}
	if err != nil {
		return nil, nil, nil, fmt.Errorf("read node resolver config: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 || strings.HasPrefix(fields[0], "#") || strings.HasPrefix(fields[0], ";") {
			continue
		}
		switch fields[0] {
		case "nameserver":
			servers = append(servers, fields[1])
		case "search", "domain":
			searches = fields[1:]
		case "options":
			options = append(options, fields[1:]...)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, nil, nil, fmt.Errorf("read node resolver config: %w", err)
	}
	return servers, searches, options, nil
}
