package cri

import (
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/mqlet/mqlet/internal/defaults"
	"github.com/mqlet/mqlet/internal/imagepolicy"
	"github.com/mqlet/mqlet/internal/redact"
	"github.com/mqlet/mqlet/internal/runtimeclass"
)

// Config says where the CRI runtime is and where pod state lives on the node.
type Config struct {
	// Endpoint of the CRI runtime, e.g. unix:///run/containerd/containerd.sock.
	Endpoint string
	// ExitEvents makes the PLEG relist at each task exit containerd
	// publishes on its events service (see exits.go).
	ExitEvents bool
	// EventedRelistPeriod is how often the PLEG relists while those events
	// are received (never more often than its own period); 0 leaves it at
	// its own period.
	EventedRelistPeriod time.Duration
	// PodLogDir holds one directory per pod, <ns>_<name>_<uid>.
	PodLogDir string
	// PodDir holds one directory per pod UID with its volumes.
	PodDir string
	// CgroupRoot is the cgroupfs parent of all pod cgroups (pods get <root>/pod<uid>).
	CgroupRoot string
	// CgroupFS is where the cgroup hierarchies are mounted.
	CgroupFS string
	// PodPidsLimit is pids.max of every pod's cgroup (all its containers
	// together); 0: no limit.
	PodPidsLimit int64
	// ConnectTimeout bounds one connection attempt (dial and version handshake).
	ConnectTimeout time.Duration
	// RequestTimeout bounds one ordinary CRI call (pulls and stops get more).
	RequestTimeout time.Duration
	// RuntimeRetryMin and RuntimeRetryMax bound the reconnect backoff.
	RuntimeRetryMin time.Duration
	RuntimeRetryMax time.Duration
	// HealthInterval is how often a connected runtime is checked.
	HealthInterval time.Duration
	// ResolvConf is the node's resolver configuration pods inherit.
	ResolvConf string
	// AllowedHostPaths are the directories hostPath volumes may resolve
	// into (after symlinks); empty refuses every hostPath. The agent fills
	// it from the admission policy, so the runtime re-checks at mount time
	// what admission could only check as a string.
	AllowedHostPaths []string
	// PullParallelism bounds the image pulls running at once.
	PullParallelism int
	// PullTimeout bounds one image pull.
	PullTimeout time.Duration
	// PullBackoffBase and PullBackoffMax bound the per-image backoff after
	// a failed pull (the kubelet's 10 s doubling to 300 s).
	PullBackoffBase time.Duration
	PullBackoffMax  time.Duration
	// NodeCredentials is a docker config.json with the node's own registry
	// credentials, tried after the pod's imagePullSecrets; empty: none.
	NodeCredentials string
	// ScrubPod gives the scrubber of a pod's text (the agent's
	// redact.Live.ForPod: the current and retired values of the secrets the
	// pod refers to, and no other, so scrubbing is no oracle for secrets a
	// pod was not given). Without it only the secrets a pod refers to now
	// are scrubbed from its sync.
	ScrubPod func(namespace, name string) *redact.Scrubber
	// HostIPs are the node's addresses, primary first: status.hostIP(s) in
	// the downward API, and a hostNetwork pod's IPs.
	HostIPs []string
	// Registries are the registries images may come from; a name is
	// checked again, resolved, just before its pull. nil: the default.
	Registries *imagepolicy.Policy
	// Allocatable is what resourceFieldRef reads for a container without
	// a limit (nil: the machine's CPUs and memory).
	Allocatable v1.ResourceList
	// ClusterDomain ends a pod's FQDN in its /etc/hosts
	// (hostname.subdomain.namespace.svc.<domain>).
	ClusterDomain string
	// HostsFile is the node's hosts file, which hostNetwork pods get.
	HostsFile string
	// RuntimeClasses give the runtime handler of a pod's runtimeClassName
	// (nil: none known, every pod on the default handler).
	RuntimeClasses runtimeclass.Set
}

// Defaults used for zero Config fields.
const (
	DefaultEndpoint        = "unix:///run/containerd/containerd.sock"
	DefaultPodLogDir       = "/var/log/pods"
	DefaultPodDir          = "/var/lib/mqlet/pods"
	DefaultCgroupRoot      = "/mqlet"
	DefaultCgroupFS        = "/sys/fs/cgroup"
	DefaultConnectTimeout  = 5 * time.Second
	DefaultRequestTimeout  = 2 * time.Minute
	DefaultRetryMin        = 500 * time.Millisecond
	DefaultRetryMax        = 30 * time.Second
	DefaultHealthInterval  = 5 * time.Second
	DefaultResolvConf      = "/etc/resolv.conf"
	DefaultClusterDomain   = "cluster.local"
	DefaultHostsFile       = "/etc/hosts"
	DefaultPullParallelism = 2
	DefaultPullTimeout     = 10 * time.Minute
	DefaultPullBackoffBase = 10 * time.Second
	DefaultPullBackoffMax  = 300 * time.Second
	defaultStopGracePeriod = 30
)

func (c Config) withDefaults() Config {
	defaults.Set(&c.Endpoint, DefaultEndpoint)
	defaults.Set(&c.PodLogDir, DefaultPodLogDir)
	defaults.Set(&c.PodDir, DefaultPodDir)
	defaults.Set(&c.CgroupRoot, DefaultCgroupRoot)
	defaults.Set(&c.CgroupFS, DefaultCgroupFS)
	defaults.Set(&c.ConnectTimeout, DefaultConnectTimeout)
	defaults.Set(&c.RequestTimeout, DefaultRequestTimeout)
	defaults.Set(&c.RuntimeRetryMin, DefaultRetryMin)
	if c.RuntimeRetryMax < c.RuntimeRetryMin {
		c.RuntimeRetryMax = DefaultRetryMax
		if c.RuntimeRetryMax < c.RuntimeRetryMin {
			c.RuntimeRetryMax = c.RuntimeRetryMin
		}
	}
	defaults.Set(&c.ClusterDomain, DefaultClusterDomain)
	defaults.Set(&c.HostsFile, DefaultHostsFile)
	defaults.Set(&c.HealthInterval, DefaultHealthInterval)
	defaults.Set(&c.PullParallelism, DefaultPullParallelism)
	defaults.Set(&c.PullTimeout, DefaultPullTimeout)
	defaults.Set(&c.PullBackoffBase, DefaultPullBackoffBase)
	if c.PullBackoffMax < c.PullBackoffBase {
		c.PullBackoffMax = max(DefaultPullBackoffMax, c.PullBackoffBase)
	}
	defaults.Set(&c.ResolvConf, DefaultResolvConf)
	return c
}
