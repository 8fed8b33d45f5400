package metrics

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	cadvisorcontainer "github.com/google/cadvisor/lib/container"
	"github.com/google/cadvisor/lib/container/common"
	"github.com/google/cadvisor/lib/container/libcontainer"
	"github.com/google/cadvisor/lib/fs"
	"github.com/google/cadvisor/lib/machine"
	cadvisorapi "github.com/google/cadvisor/lib/model"
	"github.com/google/cadvisor/lib/utils/sysfs"
	"github.com/opencontainers/cgroups"
	"github.com/rs/zerolog"

	// Filesystem plugins that turn a mount into capacity/usage figures.
	_ "github.com/google/cadvisor/lib/fs/overlay/install"
	_ "github.com/google/cadvisor/lib/fs/tmpfs/install"
	_ "github.com/google/cadvisor/lib/fs/vfs/install"

	"github.com/mqlet/mqlet/internal/defaults"
)

// Defaults for Options.
const (
	DefaultCgroupRoot           = "/mqlet"
	DefaultHousekeepingInterval = 10 * time.Second
	DefaultStateDir             = "/var/lib/mqlet"
	// machineInfoMaxAge is how long MachineInfo is cached (cAdvisor's manager
	// refreshes it every 5 minutes too).
	machineInfoMaxAge = 5 * time.Minute
)

// DefaultGaugeMetrics are the names in Summary's extra map that are levels
// rather than running totals, used when Options.GaugeMetrics is nil.
var DefaultGaugeMetrics = []string{"outbox_depth", "outbox_bytes", "queue_depth"}

// Options configure a Collector.
type Options struct {
	// NodeName goes into node.nodeName.
	NodeName string
	// CgroupRoot is the cgroupfs parent of mqlet's pods: pod cgroups are
	// <CgroupRoot>/pod<uid>, container cgroups <CgroupRoot>/pod<uid>/<containerID>.
	CgroupRoot string
	// HousekeepingInterval is the age under which a cgroup sample is reused
	// rather than read again (0 means DefaultHousekeepingInterval).
	HousekeepingInterval time.Duration
	// StateDir is mqlet's state directory; its filesystem is node.fs.
	StateDir string
	// GaugeMetrics names the extra counters that are gauges; the others are
	// cumulative. nil means DefaultGaugeMetrics.
	GaugeMetrics []string
}

func (o Options) withDefaults() Options {
	defaults.Set(&o.CgroupRoot, DefaultCgroupRoot)
	defaults.Set(&o.HousekeepingInterval, DefaultHousekeepingInterval)
	defaults.Set(&o.StateDir, DefaultStateDir)
	if o.GaugeMetrics == nil {
		o.GaugeMetrics = DefaultGaugeMetrics
	}
	return o
}

// PodInfo tells the Collector which pods exist and how their containers are
// named; the agent knows this, cgroups do not.
type PodInfo struct {
	UID       string
	Name      string
	Namespace string
	// Containers maps a runtime container ID to the container's name.
	Containers map[string]string
	// Filesystems, by container ID, says how much disk each container uses
	// (from the runtime); containers missing here get no rootfs/logs stats.
	Filesystems map[string]ContainerFilesystem
}

// ContainerFilesystem is one container's disk use and where it lives, so
// capacity and availability can be read from those filesystems.
type ContainerFilesystem struct {
	RootfsUsedBytes uint64
	RootfsDir       string
	LogsUsedBytes   uint64
	LogsDir         string
}

// ErrClosed is returned by a Collector after Close.
var ErrClosed = errors.New("metrics collector closed")

// Collector samples cgroups through cAdvisor's library on demand. It starts no
// goroutines; it is safe for concurrent use.
type Collector struct {
	log          zerolog.Logger
	opts         Options
	gauges       map[string]bool
	cgroupMounts map[string]string // v1 controller → mount point
	unified      bool              // cgroup v2 only
	metrics      cadvisorcontainer.MetricSet
	fsInfo       fs.FsInfo
	sysFs        sysfs.SysFs

	mu          sync.Mutex
	closed      bool
	machine     *cadvisorapi.MachineInfo
	machineAt   time.Time
	cgroups     map[string]*cgroupSampler
	self        selfSampler
	fsCache     map[string]fsSample
	rootMachine machineInfoSource
	started     time.Time // stands for the agent's start time
}

// New prepares a Collector: it finds the cgroup mounts and filesystems and
// reads the machine information once.
func New(ctx context.Context, opts Options, log zerolog.Logger) (*Collector, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("creating metrics collector: %w", err)
	}
	opts = opts.withDefaults()
	included := cadvisorcontainer.MetricSet{
		cadvisorcontainer.CpuUsageMetrics:     struct{}{},
		cadvisorcontainer.MemoryUsageMetrics:  struct{}{},
		cadvisorcontainer.NetworkUsageMetrics: struct{}{},
	}
	mounts, err := libcontainer.GetCgroupSubsystems(included)
	if err != nil {
		return nil, fmt.Errorf("finding cgroup mounts for cpu and memory: %w", err)
	}
	if len(mounts) == 0 {
		return nil, errors.New("finding cgroup mounts for cpu and memory: none mounted")
	}
	fsInfo, err := fs.NewFsInfo(fs.Context{})
	if err != nil {
		return nil, fmt.Errorf("reading filesystems: %w", err)
	}
	c := &Collector{
		log:          log,
		opts:         opts,
		gauges:       make(map[string]bool, len(opts.GaugeMetrics)),
		cgroupMounts: mounts,
		unified:      cgroups.IsCgroup2UnifiedMode(),
		metrics:      included,
		fsInfo:       fsInfo,
		sysFs:        sysfs.NewRealSysFs(),
		cgroups:      make(map[string]*cgroupSampler),
		fsCache:      make(map[string]fsSample),
		started:      time.Now(),
	}
	c.rootMachine = machineInfoSource{c: c}
	for _, name := range opts.GaugeMetrics {
		c.gauges[name] = true
	}
	if _, err := c.MachineInfo(); err != nil {
		return nil, err
	}
	log.Debug().Interface("cgroupMounts", mounts).Str("cgroupRoot", opts.CgroupRoot).Msg("metrics collector ready")
	return c, nil
}

// Close releases the Collector's caches. Nothing runs in the background, so
// there is nothing else to stop; later calls fail with ErrClosed.
func (c *Collector) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	c.cgroups = nil
	c.fsCache = nil
	return nil
}

// MachineInfo returns cAdvisor's description of the machine (cores, memory
// capacity, machine/system/boot IDs, filesystems), cached for a few minutes.
func (c *Collector) MachineInfo() (*cadvisorapi.MachineInfo, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, ErrClosed
	}
	mi, err := c.machineInfoLocked(time.Now())
	if err != nil {
		return nil, err
	}
	return mi.Clone(), nil
}

func (c *Collector) machineInfoLocked(now time.Time) (*cadvisorapi.MachineInfo, error) {
	if c.machine != nil && now.Sub(c.machineAt) < machineInfoMaxAge {
		return c.machine, nil
	}
	mi, err := machine.Info(c.sysFs, c.fsInfo, true)
	if err != nil {
		if c.machine != nil {
			c.log.Warn().Err(err).Msg("refreshing machine info failed; keeping the previous one")
			return c.machine, nil
		}
		return nil, fmt.Errorf("reading machine info: %w", err)
	}
	c.machine, c.machineAt = mi, now
	return mi, nil
}

// machineInfoSource hands cAdvisor's spec reader the cached MachineInfo
// without taking the Collector's lock (the caller already holds it).
type machineInfoSource struct{ c *Collector }

func (s machineInfoSource) GetMachineInfo() (*cadvisorapi.MachineInfo, error) {
	if s.c.machine == nil {
		return nil, errors.New("machine info not read yet")
	}
	return s.c.machine, nil
}

func (s machineInfoSource) GetVersionInfo() (*cadvisorapi.VersionInfo, error) {
	return &cadvisorapi.VersionInfo{}, nil
}

// errNoCgroup says a cgroup is not (or no longer) there.
var errNoCgroup = errors.New("cgroup does not exist")

// cgroupSampler keeps one cgroup's cAdvisor handler and its last two samples.
// specMaxAge is how long a cgroup's spec is reused.
const specMaxAge = 5 * time.Minute

type cgroupSampler struct {
	name    string
	paths   map[string]string
	handler *libcontainer.Handler
	spec    cadvisorapi.ContainerSpec
	specAt  time.Time // when spec was read
	last    *cadvisorapi.ContainerStats
	prev    *cadvisorapi.ContainerStats
	seen    bool // touched by the Summary in progress
}

// sample is one reading of a cgroup plus its CPU rate when known.
type sample struct {
	spec  cadvisorapi.ContainerSpec
	stats *cadvisorapi.ContainerStats
	inst  *cadvisorapi.CpuInstStats
}

// sampleLocked reads cgroup name (pid > 0 adds that process's network
// stats), reusing a sample younger than the housekeeping interval.
func (c *Collector) sampleLocked(name string, pid int, now time.Time) (sample, error) {
	// The handler reads network stats of a fixed pid, so a new pid (a pod's
	// sandbox re-created) needs a sampler of its own.
	key := name
	if pid > 0 {
		key += "#" + strconv.Itoa(pid)
	}
	s := c.cgroups[key]
	if s == nil {
		paths := common.MakeCgroupPaths(c.cgroupMounts, name)
		if !common.CgroupExists(paths) {
			return sample{}, fmt.Errorf("sampling cgroup %q: %w", name, errNoCgroup)
		}
		mgr, err := libcontainer.NewCgroupManager(name, paths)
		if err != nil {
			return sample{}, fmt.Errorf("opening cgroup %q: %w", name, err)
		}
		lean := &leanStats{Manager: mgr, paths: paths, unified: c.unified}
		s = &cgroupSampler{name: name, paths: paths, handler: libcontainer.NewHandler(lean, "/", pid, c.metrics)}
		c.cgroups[key] = s
	}
	s.seen = true
	if s.last == nil || now.Sub(s.last.Timestamp) >= c.opts.HousekeepingInterval {
		if !common.CgroupExists(s.paths) {
			delete(c.cgroups, key)
			return sample{}, fmt.Errorf("sampling cgroup %q: %w", name, errNoCgroup)
		}
		// The spec (creation time, limits) is a third of a sample's reads
		// and changes only with a new cgroup, which gets a sampler of its
		// own: it is read again only now and then.
		if s.specAt.IsZero() || now.Sub(s.specAt) >= specMaxAge {
			spec, err := common.GetSpec(s.paths, c.rootMachine, false, false)
			if err != nil {
				return sample{}, fmt.Errorf("reading spec of cgroup %q: %w", name, err)
			}
			s.spec, s.specAt = spec, now
		}
		stats, err := s.handler.GetStats()
		if err != nil {
			return sample{}, fmt.Errorf("reading stats of cgroup %q: %w", name, err)
		}
		stats.Timestamp = now
		s.prev, s.last = s.last, stats
	}
	out := sample{spec: s.spec, stats: s.last}
	if inst, err := cadvisorapi.InstCpuStats(s.prev, s.last); err == nil {
		out.inst = inst
	} else {
		c.log.Debug().Err(err).Str("cgroup", name).Msg("no cpu rate for this sample")
	}
	return out, nil
}

// pruneLocked forgets cgroups that the last Summary did not ask about, so
// removed pods do not pile up.
func (c *Collector) pruneLocked() {
	for name, s := range c.cgroups {
		if !s.seen {
			delete(c.cgroups, name)
			continue
		}
		s.seen = false
	}
}

// PodCgroup is the cgroupfs name of a pod's cgroup.
func (c *Collector) PodCgroup(uid string) string {
	return path.Join(c.opts.CgroupRoot, "pod"+uid)
}

// fsSample caches one directory's filesystem figures.
type fsSample struct {
	at    time.Time
	stats fs.Fs
}

// dirFsLocked returns the filesystem holding dir (or its nearest existing
// parent, so a state dir not created yet still reports its future disk).
func (c *Collector) dirFsLocked(dir string, now time.Time) (fs.Fs, error) {
	if cached, ok := c.fsCache[dir]; ok && now.Sub(cached.at) < c.opts.HousekeepingInterval {
		return cached.stats, nil
	}
	existing := existingAncestor(dir)
	dev, err := c.fsInfo.GetDirFsDevice(existing)
	if err != nil {
		return fs.Fs{}, fmt.Errorf("finding the device of %q: %w", existing, err)
	}
	mountpoint, err := c.fsInfo.GetMountpointForDevice(dev.Device)
	if err != nil {
		return fs.Fs{}, fmt.Errorf("finding the mount point of %q: %w", dev.Device, err)
	}
	found, err := c.fsInfo.GetFsInfoForPath(map[string]struct{}{mountpoint: {}})
	if err != nil {
		return fs.Fs{}, fmt.Errorf("reading filesystem %q: %w", mountpoint, err)
	}
	if len(found) == 0 {
		return fs.Fs{}, fmt.Errorf("reading filesystem %q: no statistics for its type", mountpoint)
	}
	c.fsCache[dir] = fsSample{at: now, stats: found[0]}
	return found[0], nil
}

func existingAncestor(dir string) string {
	dir = filepath.Clean(dir)
	for {
		if _, err := os.Stat(dir); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return dir
		}
		dir = parent
	}
}
