package cri

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
)

func TestHostsContent(t *testing.T) {
	m := testManager(t)
	nodeHosts := filepath.Join(t.TempDir(), "hosts")
	must(t, os.WriteFile(nodeHosts, []byte("127.0.0.1 localhost\n10.1.1.1 gateway"), 0o644))
	m.cfg.HostsFile = nodeHosts
	m.cfg.HostIPs = []string{"192.168.5.5"}
	aliases := []v1.HostAlias{{IP: "10.9.9.9", Hostnames: []string{"db", "db.lan"}}}

	pod := volumePod()
	pod.Spec.HostAliases = aliases
	got, ok, err := m.hostsContent(pod, "10.88.0.7")
	if err != nil || !ok {
		t.Fatalf("pod network: %v %v", ok, err)
	}
	want := "# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n" +
		"fe00::\tip6-localnet\nfe00::\tip6-mcastprefix\nfe00::1\tip6-allnodes\nfe00::2\tip6-allrouters\n" +
		"10.88.0.7\tweb\n\n# Entries added by HostAliases.\n10.9.9.9\tdb\tdb.lan\n"
	if string(got) != want {
		t.Errorf("pod network:\n%s\nwant:\n%s", got, want)
	}

	pod.Spec.Hostname, pod.Spec.Subdomain = "box", "grp"
	got, _, _ = m.hostsContent(pod, "10.88.0.7")
	if !strings.Contains(string(got), "\n10.88.0.7\tbox.grp.default.svc.cluster.local\tbox\n") {
		t.Errorf("with a subdomain:\n%s", got)
	}

	if _, ok, err := m.hostsContent(volumePod(), ""); ok || err != nil {
		t.Errorf("no pod IP: managed %v, %v", ok, err)
	}

	hn := volumePod()
	hn.Spec.HostNetwork = true
	hn.Spec.HostAliases = aliases
	got, ok, err = m.hostsContent(hn, "")
	want = "# Kubernetes-managed hosts file (host network).\n127.0.0.1 localhost\n10.1.1.1 gateway\n\n# Entries added by HostAliases.\n10.9.9.9\tdb\tdb.lan\n"
	if err != nil || !ok || string(got) != want {
		t.Errorf("host network (%v, %v):\n%s\nwant:\n%s", ok, err, got, want)
	}

	bad := volumePod()
	bad.Spec.HostAliases = []v1.HostAlias{{IP: "10.0.0.1", Hostnames: []string{"x\n6.6.6.6 bank"}}}
	if _, _, err := m.hostsContent(bad, "10.88.0.7"); err == nil {
		t.Error("a hostname with a newline was written")
	}
}

// The file is written in place (containers bind-mount it) and mounted
// unless the container mounts /etc/hosts itself.
func TestEtcHostsMount(t *testing.T) {
	m := testManager(t)
	pod := volumePod()
	must(t, m.createPodDirs(pod))
	c := &pod.Spec.Containers[0]
	if mnt, err := m.hostsMount(pod, c); err != nil || mnt != nil {
		t.Fatalf("mount before the file exists: %v %v", mnt, err)
	}
	must(t, m.writeEtcHosts(pod, "10.88.0.7"))
	path, _ := m.podHostsFile(testUID)
	var before, after os.FileInfo
	before, _ = os.Stat(path)
	pod.Spec.HostAliases = []v1.HostAlias{{IP: "10.9.9.9", Hostnames: []string{"db"}}}
	must(t, m.writeEtcHosts(pod, "10.88.0.7"))
	after, _ = os.Stat(path)
	if !os.SameFile(before, after) {
		t.Error("the hosts file was replaced, not rewritten in place")
	}
	if data, _ := os.ReadFile(path); !strings.HasSuffix(string(data), "10.9.9.9\tdb\n") {
		t.Errorf("hosts file:\n%s", data)
	}
	mnt, err := m.hostsMount(pod, c)
	if err != nil || mnt == nil || mnt.ContainerPath != "/etc/hosts" || mnt.HostPath != path {
		t.Fatalf("mount: %v %v", mnt, err)
	}
	c.VolumeMounts = []v1.VolumeMount{{Name: "own", MountPath: "/etc/hosts/"}}
	if mnt, err := m.hostsMount(pod, c); err != nil || mnt != nil {
		t.Errorf("mounted over the container's own /etc/hosts: %v %v", mnt, err)
	}
	// A symlink planted at the file's place is not written through.
	outside := filepath.Join(t.TempDir(), "target")
	must(t, os.WriteFile(outside, []byte("keep"), 0o644))
	must(t, os.Remove(path))
	must(t, os.Symlink(outside, path))
	if err := m.writeEtcHosts(pod, "10.88.0.7"); err == nil {
		t.Error("wrote through a symlink")
	}
	if data, _ := os.ReadFile(outside); string(data) != "keep" {
		t.Errorf("symlink target changed: %q", data)
	}
	must(t, m.removePodDirs(testUID, "web", "default"))
}

func TestSetHostnameAsFQDN(t *testing.T) {
	m := testManager(t)
	yes := true
	pod := volumePod()
	pod.Spec.Subdomain, pod.Spec.SetHostnameAsFQDN = "grp", &yes
	cfg, err := m.buildSandboxConfig(pod, 0)
	if err != nil || cfg.Hostname != "web.grp.default.svc.cluster.local" {
		t.Fatalf("hostname %q, %v", cfg.GetHostname(), err)
	}
	pod.Spec.Hostname = strings.Repeat("h", 50)
	if _, err := m.buildSandboxConfig(pod, 0); err == nil || !strings.Contains(err.Error(), "too long") {
		t.Fatalf("a 90-character FQDN: %v", err)
	}
	pod.Spec.Subdomain = ""
	if cfg, err := m.buildSandboxConfig(pod, 0); err != nil || cfg.Hostname != pod.Spec.Hostname {
		t.Fatalf("without a subdomain: %q, %v", cfg.GetHostname(), err)
	}
}
