package cri

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Each pod gets a hosts file managed as the kubelet manages it: the
// loopback names, the pod's IPs with its hostname (and FQDN when it has a
// subdomain), and its hostAliases; a hostNetwork pod gets the node's file
// plus its hostAliases. It lives in the pod directory and is bind-mounted
// at /etc/hosts into every container that does not mount one itself.

const (
	etcHostsName = "etc-hosts"
	etcHostsPath = "/etc/hosts"
	// maxHostsBytes bounds the node's hosts file copied into hostNetwork
	// pods and a pod's file read back for comparison.
	maxHostsBytes = 1 << 20
)

// podHostsFile is the pod's managed hosts file on the node.
func (m *Manager) podHostsFile(uid string) (string, error) {
	dir, err := m.podDir(uid)
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, etcHostsName), nil
}

// hostsContent is the pod's hosts file; ok is false when the pod has no
// address yet (the runtime's own file is left in place then, as the
// kubelet does).
func (m *Manager) hostsContent(pod *v1.Pod, podIP string) ([]byte, bool, error) {
	var b bytes.Buffer
	if pod.Spec.HostNetwork {
		node, err := readBounded(m.cfg.HostsFile, maxHostsBytes)
		if err != nil {
			return nil, false, fmt.Errorf("read the node's hosts file: %w", err)
		}
		b.WriteString("# Kubernetes-managed hosts file (host network).\n")
		b.Write(node)
		if len(node) > 0 && node[len(node)-1] != '\n' {
			b.WriteByte('\n')
		}
	} else {
		ips := m.downward(pod, podIP).podIPs
		if len(ips) == 0 {
			return nil, false, nil
		}
		b.WriteString("# Kubernetes-managed hosts file.\n")
		b.WriteString("127.0.0.1\tlocalhost\n")
		b.WriteString("::1\tlocalhost ip6-localhost ip6-loopback\n")
		b.WriteString("fe00::\tip6-localnet\n")
		b.WriteString("fe00::\tip6-mcastprefix\n")
		b.WriteString("fe00::1\tip6-allnodes\n")
		b.WriteString("fe00::2\tip6-allrouters\n")
		host := podHostname(pod)
		for _, f := range []string{host, pod.Namespace} {
			if err := hostsField(f); err != nil {
				return nil, false, err
			}
		}
		if err := hostsField(pod.Spec.Subdomain); err != nil && pod.Spec.Subdomain != "" {
			return nil, false, err
		}
		names := host
		if fqdn := m.podFQDN(pod); fqdn != "" {
			names = fqdn + "\t" + host
		}
		for _, ip := range ips {
			if err := hostsField(ip); err != nil {
				return nil, false, err
			}
			fmt.Fprintf(&b, "%s\t%s\n", ip, names)
		}
	}
	if len(pod.Spec.HostAliases) > 0 {
		b.WriteString("\n# Entries added by HostAliases.\n")
		for _, a := range pod.Spec.HostAliases {
			if err := hostsField(a.IP); err != nil {
				return nil, false, fmt.Errorf("hostAliases: %w", err)
			}
			for _, h := range a.Hostnames {
				if err := hostsField(h); err != nil {
					return nil, false, fmt.Errorf("hostAliases: %w", err)
				}
			}
			fmt.Fprintf(&b, "%s\t%s\n", a.IP, strings.Join(a.Hostnames, "\t"))
		}
	}
	if b.Len() > 2*maxHostsBytes {
		return nil, false, fmt.Errorf("hosts file of more than %d bytes", 2*maxHostsBytes)
	}
	return b.Bytes(), true, nil
}

// hostsField refuses what would break a hosts line (validation already
// keeps such values out of a pod; a stored pod is checked again).
func hostsField(s string) error {
	if s == "" || strings.ContainsAny(s, " \t\r\n#\x00") {
		return fmt.Errorf("%q cannot be written in a hosts file", s)
	}
	return nil
}

// writeEtcHosts writes the pod's hosts file when its content changed,
// in place (containers bind-mount the file, so it keeps its inode).
func (m *Manager) writeEtcHosts(pod *v1.Pod, podIP string) error {
	content, ok, err := m.hostsContent(pod, podIP)
	if err != nil || !ok {
		return err
	}
	path, err := m.podHostsFile(string(pod.UID))
	if err != nil {
		return err
	}
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o644)
	if err != nil {
		return fmt.Errorf("open %s: %w", path, err)
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		return fmt.Errorf("%s is not a regular file", path)
	}
	cur, err := io.ReadAll(io.LimitReader(f, int64(len(content))+1))
	if err != nil {
		return fmt.Errorf("read %s: %w", path, err)
	}
	if bytes.Equal(cur, content) && st.Mode&0o7777 == 0o644 {
		return nil
	}
	if err := f.Truncate(0); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if _, err := f.WriteAt(content, 0); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return f.Chmod(0o644)
}

// hostsMount is the /etc/hosts mount of container c, nil when the pod has
// no managed file or the container mounts /etc/hosts itself.
func (m *Manager) hostsMount(pod *v1.Pod, c *v1.Container) (*runtimeapi.Mount, error) {
	for _, vm := range c.VolumeMounts {
		if filepath.Clean(vm.MountPath) == etcHostsPath {
			return nil, nil
		}
	}
	path, err := m.podHostsFile(string(pod.UID))
	if err != nil {
		return nil, err
	}
	if _, err := os.Lstat(path); errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	return &runtimeapi.Mount{ContainerPath: etcHostsPath, HostPath: path, Propagation: runtimeapi.MountPropagation_PROPAGATION_PRIVATE}, nil
}

// readBounded reads at most limit bytes of path, failing when it holds more.
func readBounded(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("%s holds more than %d bytes", path, limit)
	}
	return data, nil
}

// podFQDN is hostname.subdomain.namespace.svc.<cluster domain>, "" when
// the pod has no subdomain.
func (m *Manager) podFQDN(pod *v1.Pod) string {
	if pod.Spec.Subdomain == "" {
		return ""
	}
	return podHostname(pod) + "." + pod.Spec.Subdomain + "." + pod.Namespace + ".svc." + m.cfg.ClusterDomain
}
