package runtime

import (
	"time"

	v1 "k8s.io/api/core/v1"
)

// Config says where the CRI runtime is and where pod state lives on the node.
type Config struct {
	// Endpoint of the CRI runtime, e.g. unix:///run/containerd/containerd.sock.
	Endpoint string
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
	// Secrets lists the secrets the node knows; their values are scrubbed
	// from every message and error the runtime hands out. Nil: none.
	Secrets SecretLister
}

// SecretLister lists the node's secrets (the agent's store is one).
type SecretLister interface {
	ListSecrets() ([]*v1.Secret, error)
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
	defaultStopGracePeriod = 30
)

func (c Config) withDefaults() Config {
	if c.Endpoint == "" {
		c.Endpoint = DefaultEndpoint
	}
	if c.PodLogDir == "" {
		c.PodLogDir = DefaultPodLogDir
	}
	if c.PodDir == "" {
		c.PodDir = DefaultPodDir
	}
	if c.CgroupRoot == "" {
		c.CgroupRoot = DefaultCgroupRoot
	}
	if c.CgroupFS == "" {
		c.CgroupFS = DefaultCgroupFS
	}
	if c.ConnectTimeout <= 0 {
		c.ConnectTimeout = DefaultConnectTimeout
	}
	if c.RequestTimeout <= 0 {
		c.RequestTimeout = DefaultRequestTimeout
	}
	if c.RuntimeRetryMin <= 0 {
		c.RuntimeRetryMin = DefaultRetryMin
	}
	if c.RuntimeRetryMax < c.RuntimeRetryMin {
		c.RuntimeRetryMax = DefaultRetryMax
		if c.RuntimeRetryMax < c.RuntimeRetryMin {
			c.RuntimeRetryMax = c.RuntimeRetryMin
		}
	}
	if c.HealthInterval <= 0 {
		c.HealthInterval = DefaultHealthInterval
	}
	if c.ResolvConf == "" {
		c.ResolvConf = DefaultResolvConf
	}
	return c
}
