package agent

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/mqlet/mqlet/agent/eviction"
	"github.com/mqlet/mqlet/agent/nodestatus"
	"github.com/mqlet/mqlet/agent/telemetry"
	"github.com/mqlet/mqlet/cri"
)

// EvictionRuntime is what eviction needs of the runtime manager beyond
// Runtime: each pod's usage, the image filesystem, and the release of an
// evicted pod's emptyDirs.
type EvictionRuntime interface {
	PodUsage(ctx context.Context, uids map[string]bool) (map[string]cri.PodUsage, error)
	ImageFilesystem(ctx context.Context) (string, error)
	ReleasePodStorage(uid string) error
}

// EvictionOptions turn the eviction manager on.
type EvictionOptions struct {
	eviction.Config
	// NodeFsPath is on the node's filesystem: the state directory, where
	// the pods' emptyDirs live.
	NodeFsPath string
	// ProcRoot defaults to /proc.
	ProcRoot string
	// MemoryCgroup, when set (a directory of the memory controller), gives
	// memory.available as its limit less its working set.
	MemoryCgroup string
}

// evictionStats reads the node's signals and the pods' usage for the
// eviction manager.
type evictionStats struct {
	rt        EvictionRuntime
	ready     func() bool
	nodeFs    string
	procRoot  string
	memCgroup string
}

func (s evictionStats) Node(ctx context.Context) (eviction.NodeStats, error) {
	out := eviction.NodeStats{}
	var errs []error
	total, err := nodestatus.ReadMemTotal(s.procRoot)
	if err == nil && s.memCgroup != "" {
		var obs eviction.Observation
		if obs, err = cgroupMemory(s.memCgroup, int64(total)); err == nil {
			out[eviction.MemoryAvailable] = obs
		}
	} else if err == nil {
		var avail uint64
		if avail, err = telemetry.ReadMemAvailable(s.procRoot + "/meminfo"); err == nil {
			out[eviction.MemoryAvailable] = eviction.Observation{Available: int64(avail), Capacity: int64(total)}
		}
	}
	if err != nil {
		errs = append(errs, err)
	}
	if err := statfsSignals(s.nodeFs, eviction.NodeFsAvailable, eviction.NodeFsInodesFree, out); err != nil {
		errs = append(errs, err)
	}
	if s.ready() {
		if mount, err := s.rt.ImageFilesystem(ctx); err != nil {
			errs = append(errs, err)
		} else if mount != "" {
			if err := statfsSignals(mount, eviction.ImageFsAvailable, eviction.ImageFsInodesFree, out); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if pids, err := nodestatus.ReadPIDUsage(s.procRoot); err != nil {
		errs = append(errs, err)
	} else if pids.Max > 0 {
		out[eviction.PIDAvailable] = eviction.Observation{Available: int64(pids.Max) - int64(pids.Running), Capacity: int64(pids.Max)}
	}
	if len(errs) > 0 {
		return out, fmt.Errorf("%d signals unread: %w", len(errs), errs[0])
	}
	return out, nil
}

// cgroupMemory is memory.available of a cgroup: its limit (the node's
// memory when unlimited) less its working set (usage less inactive file
// pages), cgroup v1 or v2.
func cgroupMemory(dir string, nodeTotal int64) (eviction.Observation, error) {
	read := func(name string) (string, error) {
		raw, err := os.ReadFile(filepath.Join(dir, name))
		return strings.TrimSpace(string(raw)), err
	}
	limitFile, usageFile, inactiveKey := "memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file"
	if _, err := os.Stat(filepath.Join(dir, "memory.max")); err == nil {
		limitFile, usageFile, inactiveKey = "memory.max", "memory.current", "inactive_file"
	}
	limitS, err := read(limitFile)
	if err != nil {
		return eviction.Observation{}, fmt.Errorf("reading the memory cgroup's limit: %w", err)
	}
	usageS, err := read(usageFile)
	if err != nil {
		return eviction.Observation{}, fmt.Errorf("reading the memory cgroup's usage: %w", err)
	}
	usage, err := strconv.ParseInt(usageS, 10, 64)
	if err != nil {
		return eviction.Observation{}, fmt.Errorf("memory cgroup usage %q: %w", usageS, err)
	}
	limit := nodeTotal
	if l, err := strconv.ParseInt(limitS, 10, 64); err == nil && l < nodeTotal {
		limit = l // "max" or a huge v1 value: unlimited
	}
	if stat, err := read("memory.stat"); err == nil {
		for _, line := range strings.Split(stat, "\n") {
			if k, v, ok := strings.Cut(line, " "); ok && k == inactiveKey {
				if n, err := strconv.ParseInt(v, 10, 64); err == nil && n < usage {
					usage -= n
				}
			}
		}
	}
	return eviction.Observation{Available: limit - usage, Capacity: limit}, nil
}

// statfsSignals observes the space and inodes of the filesystem at path.
func statfsSignals(path string, space, inodes eviction.Signal, out eviction.NodeStats) error {
	var st syscall.Statfs_t
	if err := syscall.Statfs(path, &st); err != nil {
		return fmt.Errorf("statfs %s: %w", path, err)
	}
	bsize := int64(st.Bsize) // int32 on 32-bit arm
	out[space] = eviction.Observation{Available: int64(st.Bavail) * bsize, Capacity: int64(st.Blocks) * bsize}
	if st.Files > 0 {
		out[inodes] = eviction.Observation{Available: int64(st.Ffree), Capacity: int64(st.Files)}
	}
	return nil
}

func (s evictionStats) Pods(ctx context.Context, pods []*v1.Pod) (map[types.UID]eviction.PodUsage, error) {
	if !s.ready() {
		return nil, cri.ErrUnavailable
	}
	uids := make(map[string]bool, len(pods))
	for _, p := range pods {
		uids[string(p.UID)] = true
	}
	usage, err := s.rt.PodUsage(ctx, uids)
	if err != nil {
		return nil, err
	}
	out := make(map[types.UID]eviction.PodUsage, len(usage))
	for uid, u := range usage {
		pu := eviction.PodUsage{MemoryWorkingSetBytes: u.MemoryWorkingSetBytes, Processes: u.Processes,
			Containers: make(map[string]eviction.ContainerUsage, len(u.Containers)), EmptyDirs: make(map[string]eviction.VolumeUsage, len(u.EmptyDirs))}
		for name, c := range u.Containers {
			pu.Containers[name] = eviction.ContainerUsage{RootfsBytes: c.RootfsBytes, RootfsInodes: c.RootfsInodes, LogsBytes: c.LogsBytes}
		}
		for name, d := range u.EmptyDirs {
			pu.EmptyDirs[name] = eviction.VolumeUsage{Bytes: d.Bytes, Inodes: d.Inodes}
		}
		out[types.UID(uid)] = pu
	}
	return out, nil
}

// activePods are the desired pods not yet finished (Succeeded or Failed).
func (a *Agent) activePods() []*v1.Pod {
	pods, err := a.store.ListPods()
	if err != nil {
		a.log.Warn().Err(err).Msg("listing desired pods for eviction")
		return nil
	}
	out := pods[:0]
	for _, p := range pods {
		if st, ok := a.status.Get(p.Namespace, p.Name); ok && st.UID == p.UID &&
			(st.Status.Phase == v1.PodSucceeded || st.Status.Phase == v1.PodFailed) {
			continue
		}
		out = append(out, p)
	}
	return out
}

// reclaimer frees dead containers and unused images before a pod is
// evicted for disk: every dead container, and every image no desired pod
// names (the kubelet's DeleteAllUnusedContainers and DeleteUnusedImages).
type reclaimer struct{ a *Agent }

func (r reclaimer) Reclaim(ctx context.Context) error {
	if !r.a.rt.Ready() {
		return cri.ErrUnavailable
	}
	policy := r.a.opts.GCPolicy
	policy.MinAge, policy.MaxPerPodContainer = 0, 0
	policy.ImageGCHighThresholdPercent, policy.ImageGCLowThresholdPercent = 1, 0
	r.a.collectGarbageWith(ctx, policy)
	return nil
}

// pressure gives the node status the eviction manager's conditions (nil
// before its first pass: the node status's own thresholds then).
func pressure(m *eviction.Manager) telemetry.PressureSource {
	return func() []nodestatus.PressureState {
		conds := m.Conditions()
		if conds == nil {
			return nil
		}
		out := make([]nodestatus.PressureState, len(conds))
		for i, c := range conds {
			out[i] = nodestatus.PressureState{Type: c.Type, Known: c.Known, Under: c.Under, Message: c.Message}
		}
		return out
	}
}

// buildEviction makes the eviction manager when it is configured and the
// runtime can report pod usage.
func (a *Agent) buildEviction(opts *EvictionOptions) error {
	if opts == nil {
		return nil
	}
	rt, ok := a.rt.(EvictionRuntime)
	if !ok {
		return fmt.Errorf("eviction is configured but the runtime cannot report pod usage")
	}
	procRoot := opts.ProcRoot
	if procRoot == "" {
		procRoot = "/proc"
	}
	stats := evictionStats{rt: rt, ready: a.rt.Ready, nodeFs: opts.NodeFsPath, procRoot: procRoot, memCgroup: opts.MemoryCgroup}
	m, err := eviction.New(opts.Config, eviction.Deps{Stats: stats, ActivePods: a.activePods, Killer: a.pool, Reclaimer: reclaimer{a}, Events: a.events},
		a.log.With().Str("component", "eviction").Logger())
	if err != nil {
		return err
	}
	a.eviction = m
	return nil
}
