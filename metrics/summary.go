package metrics

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/google/cadvisor/lib/fs"
	cadvisorapi "github.com/google/cadvisor/lib/model"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	statsv1alpha1 "k8s.io/kubelet/pkg/apis/stats/v1alpha1"
)

// SystemContainerMqlet names the node.systemContainers entry that carries
// mqlet's own usage and counters.
const SystemContainerMqlet = "mqlet"

// defaultInterfaceName is the interface kubelet reports as the node's
// primary one when present.
const defaultInterfaceName = "eth0"

// Summary samples the node, the given pods and their containers, and returns
// them in kubelet's stats Summary shape. extra holds mqlet's own counters;
// they are published as userDefinedMetrics of the "mqlet" system container.
// A pod or container whose cgroup is gone is reported without usage rather
// than failing the whole Summary.
func (c *Collector) Summary(ctx context.Context, pods []PodInfo, extra map[string]uint64) (*statsv1alpha1.Summary, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, ErrClosed
	}
	now := time.Now()
	mi, err := c.machineInfoLocked(now)
	if err != nil {
		return nil, err
	}
	node, err := c.nodeStatsLocked(mi, now)
	if err != nil {
		return nil, err
	}
	node.SystemContainers = []statsv1alpha1.ContainerStats{c.mqletStatsLocked(extra, now)}

	summary := &statsv1alpha1.Summary{Node: node, Pods: make([]statsv1alpha1.PodStats, 0, len(pods))}
	for _, pod := range pods {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("collecting pod stats: %w", err)
		}
		summary.Pods = append(summary.Pods, c.podStatsLocked(pod, now))
	}
	c.pruneLocked()
	return summary, nil
}

func (c *Collector) nodeStatsLocked(mi *cadvisorapi.MachineInfo, now time.Time) (statsv1alpha1.NodeStats, error) {
	// PID 1 lives in the host network namespace: its /proc/1/net/dev is the node's.
	root, err := c.sampleLocked("/", 1, now)
	if err != nil {
		return statsv1alpha1.NodeStats{}, fmt.Errorf("sampling the node: %w", err)
	}
	node := statsv1alpha1.NodeStats{
		NodeName:  c.opts.NodeName,
		StartTime: metav1.NewTime(root.spec.CreationTime),
		CPU:       cpuStats(root),
		Memory:    memoryStats(root, mi.MemoryCapacity),
		Network:   networkStats(root.stats),
	}
	if stateFs, err := c.dirFsLocked(c.opts.StateDir, now); err == nil {
		node.Fs = fsStats(stateFs, now)
	} else {
		c.log.Warn().Err(err).Str("dir", c.opts.StateDir).Msg("no filesystem stats for the state directory")
	}
	return node, nil
}

func (c *Collector) podStatsLocked(pod PodInfo, now time.Time) statsv1alpha1.PodStats {
	out := statsv1alpha1.PodStats{
		PodRef:     statsv1alpha1.PodReference{Name: pod.Name, Namespace: pod.Namespace, UID: pod.UID},
		Containers: []statsv1alpha1.ContainerStats{},
	}
	podCgroup := c.PodCgroup(pod.UID)
	ids := make([]string, 0, len(pod.Containers))
	for id := range pod.Containers {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		s, err := c.sampleLocked(path.Join(podCgroup, id), 0, now)
		if err != nil {
			c.logMissing(err, pod, id)
			continue
		}
		cs := statsv1alpha1.ContainerStats{
			Name:      pod.Containers[id],
			StartTime: metav1.NewTime(s.spec.CreationTime),
			CPU:       cpuStats(s),
			Memory:    memoryStats(s, 0),
		}
		if use, ok := pod.Filesystems[id]; ok {
			cs.Rootfs = c.usageOnLocked(use.RootfsDir, use.RootfsUsedBytes, now)
			cs.Logs = c.usageOnLocked(use.LogsDir, use.LogsUsedBytes, now)
		}
		out.Containers = append(out.Containers, cs)
	}
	sort.Slice(out.Containers, func(i, j int) bool { return out.Containers[i].Name < out.Containers[j].Name })
	// The pod is read after its containers so its totals cover theirs; the
	// network counters come from a process in the pod's network namespace.
	if s, err := c.sampleLocked(podCgroup, c.podNetPID(pod.UID), now); err == nil {
		out.StartTime = metav1.NewTime(s.spec.CreationTime)
		out.CPU = cpuStats(s)
		out.Memory = memoryStats(s, 0)
		out.Network = networkStats(s.stats)
	} else {
		c.logMissing(err, pod, "")
	}
	return out
}

func (c *Collector) logMissing(err error, pod PodInfo, containerID string) {
	ev := c.log.Warn()
	if errors.Is(err, errNoCgroup) {
		ev = c.log.Debug() // a pod being created or removed
	}
	ev.Err(err).Str("pod", pod.Namespace+"/"+pod.Name).Str("containerID", containerID).Msg("no usage for this cgroup")
}

// cpuStats follows kubelet: cumulative usage always, the rate when two
// samples exist.
func cpuStats(s sample) *statsv1alpha1.CPUStats {
	if s.stats == nil || s.stats.Cpu == nil {
		return nil
	}
	total := s.stats.Cpu.Usage.Total
	out := &statsv1alpha1.CPUStats{Time: metav1.NewTime(s.stats.Timestamp), UsageCoreNanoSeconds: &total}
	if s.inst != nil {
		rate := s.inst.Usage.Total
		out.UsageNanoCores = &rate
	}
	return out
}

// memoryStats follows kubelet: working set is cAdvisor's (usage minus
// inactive file pages); available is the limit minus the working set when a
// limit is known. capacity, when non-zero, stands in for the limit (the root
// cgroup has none).
func memoryStats(s sample, capacity uint64) *statsv1alpha1.MemoryStats {
	if s.stats == nil || s.stats.Memory == nil {
		return nil
	}
	m := s.stats.Memory
	usage, workingSet, rss := m.Usage, m.WorkingSet, m.RSS
	faults, majorFaults := m.ContainerData.Pgfault, m.ContainerData.Pgmajfault
	out := &statsv1alpha1.MemoryStats{
		Time:            metav1.NewTime(s.stats.Timestamp),
		UsageBytes:      &usage,
		WorkingSetBytes: &workingSet,
		RSSBytes:        &rss,
		PageFaults:      &faults,
		MajorPageFaults: &majorFaults,
	}
	limit := capacity
	if limit == 0 && s.spec.HasMemory {
		limit = s.spec.Memory.Limit
	}
	if limit != 0 && !memoryUnlimited(limit) {
		var available uint64
		if limit > workingSet {
			available = limit - workingSet
		}
		out.AvailableBytes = &available
	}
	return out
}

// memoryUnlimited recognises cgroup v1's "no limit" (a page-rounded MaxInt64).
func memoryUnlimited(limit uint64) bool {
	return limit > 1<<62
}

func networkStats(stats *cadvisorapi.ContainerStats) *statsv1alpha1.NetworkStats {
	if stats == nil || stats.Network == nil || len(stats.Network.Interfaces) == 0 {
		return nil
	}
	out := &statsv1alpha1.NetworkStats{Time: metav1.NewTime(stats.Timestamp)}
	for _, iface := range stats.Network.Interfaces {
		rx, rxErr, tx, txErr := iface.RxBytes, iface.RxErrors, iface.TxBytes, iface.TxErrors
		out.Interfaces = append(out.Interfaces, statsv1alpha1.InterfaceStats{
			Name: iface.Name, RxBytes: &rx, RxErrors: &rxErr, TxBytes: &tx, TxErrors: &txErr,
		})
	}
	sort.Slice(out.Interfaces, func(i, j int) bool { return out.Interfaces[i].Name < out.Interfaces[j].Name })
	// kubelet's primary interface is eth0; elsewhere take the busiest one.
	primary := 0
	for i, iface := range out.Interfaces {
		if iface.Name == defaultInterfaceName {
			primary = i
			break
		}
		if *iface.RxBytes+*iface.TxBytes > *out.Interfaces[primary].RxBytes+*out.Interfaces[primary].TxBytes {
			primary = i
		}
	}
	out.InterfaceStats = out.Interfaces[primary]
	return out
}

func fsStats(f fs.Fs, now time.Time) *statsv1alpha1.FsStats {
	capacity, available := f.Capacity, f.Available
	var used uint64
	if f.Capacity > f.Free {
		used = f.Capacity - f.Free
	}
	out := &statsv1alpha1.FsStats{
		Time:           metav1.NewTime(now),
		CapacityBytes:  &capacity,
		AvailableBytes: &available,
		UsedBytes:      &used,
	}
	if f.Inodes != nil && f.InodesFree != nil {
		inodes, free := *f.Inodes, *f.InodesFree
		out.Inodes, out.InodesFree = &inodes, &free
		if inodes >= free {
			inodesUsed := inodes - free
			out.InodesUsed = &inodesUsed
		}
	}
	return out
}

// usageOnLocked is a container's own use of the filesystem holding dir:
// UsedBytes is the container's, capacity and availability the filesystem's.
func (c *Collector) usageOnLocked(dir string, used uint64, now time.Time) *statsv1alpha1.FsStats {
	out := &statsv1alpha1.FsStats{Time: metav1.NewTime(now), UsedBytes: &used}
	if dir == "" {
		return out
	}
	f, err := c.dirFsLocked(dir, now)
	if err != nil {
		c.log.Debug().Err(err).Str("dir", dir).Msg("no filesystem figures for container usage")
		return out
	}
	capacity, available := f.Capacity, f.Available
	out.CapacityBytes, out.AvailableBytes = &capacity, &available
	return out
}

// selfSampler keeps the previous CPU reading of the mqlet process.
type selfSampler struct {
	at      time.Time
	cpuNano uint64
}

// mqletStatsLocked describes the agent itself: its CPU time and resident
// memory, the filesystem of "/" as its rootfs, and its counters.
func (c *Collector) mqletStatsLocked(extra map[string]uint64, now time.Time) statsv1alpha1.ContainerStats {
	out := statsv1alpha1.ContainerStats{Name: SystemContainerMqlet, StartTime: metav1.NewTime(c.started)}
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err == nil {
		cpuNano := uint64(ru.Utime.Nano() + ru.Stime.Nano())
		out.CPU = &statsv1alpha1.CPUStats{Time: metav1.NewTime(now), UsageCoreNanoSeconds: &cpuNano}
		if !c.self.at.IsZero() && now.After(c.self.at) && cpuNano >= c.self.cpuNano {
			rate := uint64(float64(cpuNano-c.self.cpuNano) / float64(now.Sub(c.self.at).Nanoseconds()) * 1e9)
			out.CPU.UsageNanoCores = &rate
		}
		c.self = selfSampler{at: now, cpuNano: cpuNano}
	}
	if rss, err := selfRSS(); err == nil {
		out.Memory = &statsv1alpha1.MemoryStats{Time: metav1.NewTime(now), RSSBytes: &rss, WorkingSetBytes: &rss}
	}
	if rootFs, err := c.dirFsLocked("/", now); err == nil {
		out.Rootfs = fsStats(rootFs, now)
	} else {
		c.log.Warn().Err(err).Msg("no filesystem stats for /")
	}
	out.UserDefinedMetrics = c.userDefinedMetrics(extra, now)
	return out
}

func (c *Collector) userDefinedMetrics(extra map[string]uint64, now time.Time) []statsv1alpha1.UserDefinedMetric {
	if len(extra) == 0 {
		return nil
	}
	names := make([]string, 0, len(extra))
	for name := range extra {
		names = append(names, name)
	}
	sort.Strings(names)
	out := make([]statsv1alpha1.UserDefinedMetric, 0, len(names))
	for _, key := range names {
		name, labels := splitLabelledName(key)
		kind := statsv1alpha1.MetricCumulative
		if c.gauges[name] {
			kind = statsv1alpha1.MetricGauge
		}
		units := "count"
		if strings.HasSuffix(name, "_bytes") {
			units = "bytes"
		}
		out = append(out, statsv1alpha1.UserDefinedMetric{
			UserDefinedMetricDescriptor: statsv1alpha1.UserDefinedMetricDescriptor{Name: name, Type: kind, Units: units, Labels: labels},
			Time:                        metav1.NewTime(now),
			Value:                       float64(extra[key]),
		})
	}
	return out
}

// LabelledName is the key of a counter that is one of several under the
// same name, told apart by labels: name{k1=v1,k2=v2} (keys sorted). It is
// published as name with those labels.
func LabelledName(name string, labels map[string]string) string {
	keys := make([]string, 0, len(labels))
	for k := range labels {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	b.WriteString(name)
	b.WriteByte('{')
	for i, k := range keys {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(k + "=" + labels[k])
	}
	b.WriteByte('}')
	return b.String()
}

// splitLabelledName undoes LabelledName; a plain name has no labels.
func splitLabelledName(key string) (string, map[string]string) {
	open := strings.IndexByte(key, '{')
	if open < 0 || !strings.HasSuffix(key, "}") {
		return key, nil
	}
	labels := map[string]string{}
	for _, kv := range strings.Split(key[open+1:len(key)-1], ",") {
		if k, v, ok := strings.Cut(kv, "="); ok {
			labels[k] = v
		}
	}
	return key[:open], labels
}

// selfRSS reads the resident set size of this process from /proc/self/statm.
func selfRSS() (uint64, error) {
	raw, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0, fmt.Errorf("reading /proc/self/statm: %w", err)
	}
	fields := strings.Fields(string(raw))
	if len(fields) < 2 {
		return 0, fmt.Errorf("parsing /proc/self/statm: %q", raw)
	}
	pages, err := strconv.ParseUint(fields[1], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("parsing /proc/self/statm: %w", err)
	}
	return pages * uint64(os.Getpagesize()), nil
}
