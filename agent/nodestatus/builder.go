// Package nodestatus builds the v1.Node that mqlet publishes (retained) on
// `mqlet/v1/<node>/node`: labels, capacity and allocatable, the Ready and
// pressure conditions, nodeInfo and addresses.
//
// Build is pure: everything it needs comes in as Inputs (ReadHostInputs reads
// the host-side part), so the agent decides when to read and when to publish
// (Changed ignores heartbeat times, so a node is published when it changes and
// on a slow periodic heartbeat otherwise).
package nodestatus

import (
	"errors"
	"fmt"
	"time"

	cadvisorapi "github.com/google/cadvisor/lib/model"
	v1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Defaults, as kubelet's.
const (
	DefaultMaxPods              = 110
	DefaultDiskAvailablePercent = 10
	DefaultPIDAvailablePercent  = 5
)

// DefaultMemoryAvailable is kubelet's default hard eviction threshold.
var DefaultMemoryAvailable = resource.MustParse("100Mi")

// Condition reasons. Ready mirrors kubelet's, with mqlet's name.
const (
	ReasonReady              = "MqletReady"
	ReasonRuntimeUnreachable = "ContainerRuntimeUnreachable"
	ReasonSufficientMemory   = "MqletHasSufficientMemory"
	ReasonInsufficientMemory = "MqletHasInsufficientMemory"
	ReasonNoDiskPressure     = "MqletHasNoDiskPressure"
	ReasonDiskPressure       = "MqletHasDiskPressure"
	ReasonSufficientPID      = "MqletHasSufficientPID"
	ReasonInsufficientPID    = "MqletHasInsufficientPID"
	// ReasonStatsUnavailable comes with status Unknown when a measurement is missing.
	ReasonStatsUnavailable = "MqletHasNoStats"
)

const (
	containerRuntimeVersionSeparator = "://"
	defaultOperatingSystem           = "linux"
	readyMessage                     = "mqlet is posting ready status"
	sufficientMemoryMessage          = "mqlet has sufficient memory available"
	noDiskPressureMessage            = "mqlet has no disk pressure"
	sufficientPIDMessage             = "mqlet has sufficient PID available"
	statsUnavailableMessage          = "mqlet could not measure %s"
)

// Thresholds say when a pressure condition turns True.
type Thresholds struct {
	// MemoryAvailable: MemoryPressure when less memory is available
	// (zero means DefaultMemoryAvailable).
	MemoryAvailable resource.Quantity
	// DiskAvailablePercent: DiskPressure when less of the state directory's
	// filesystem is free (0 means the default, negative disables).
	DiskAvailablePercent float64
	// PIDAvailablePercent: PIDPressure when fewer PIDs are free (0 means the
	// default, negative disables).
	PIDAvailablePercent float64
	// ReservedMemory and ReservedStorage are mqlet's own reserve: left out
	// of allocatable memory and ephemeral-storage.
	ReservedMemory, ReservedStorage int64
}

// PressureState is one pressure condition as the eviction manager sees it.
type PressureState struct {
	Type    v1.NodeConditionType
	Known   bool // a signal of it was measured
	Under   bool
	Message string
}

// Options are the fixed parts of the node.
type Options struct {
	NodeName string
	// Version is mqlet's version, published as nodeInfo.kubeletVersion.
	Version string
	// Labels are added to the well-known ones (which win on conflict).
	Labels map[string]string
	// LiveLabels, when set, gives more labels at every build: those that
	// change while mqlet runs (its groups', which a live config changes).
	// They win over Labels; the well-known ones win over both.
	LiveLabels func() map[string]string
	Thresholds Thresholds
}

// RuntimeInfo is what the container runtime says about itself.
type RuntimeInfo struct {
	Name    string // e.g. "containerd"
	Version string // e.g. "1.6.20"
	Ready   bool
	Reason  string // why it is not ready
	Message string
}

// HostInfo is the node's identity as read from the host.
type HostInfo struct {
	KernelVersion   string
	OSImage         string
	OperatingSystem string // "linux" when empty
	Architecture    string
	Hostname        string
	InternalIPs     []string
}

// DiskUsage is the filesystem holding mqlet's state directory.
type DiskUsage struct {
	CapacityBytes  uint64
	AvailableBytes uint64
}

// PIDUsage counts process IDs in use against the limit.
type PIDUsage struct {
	Running uint64
	Max     uint64
}

// Inputs is everything a Build needs. A nil measurement makes its condition
// Unknown.
type Inputs struct {
	Machine *cadvisorapi.MachineInfo
	Host    HostInfo
	Runtime RuntimeInfo
	// MaxPods is the pods capacity (0 means DefaultMaxPods).
	MaxPods int
	// MemoryAvailableBytes is the node's available memory as eviction sees it
	// (metrics Summary node.memory.availableBytes: capacity − working set).
	MemoryAvailableBytes *uint64
	Disk                 *DiskUsage
	PIDs                 *PIDUsage
	// Images present on the node (status.images), largest first.
	Images []v1.ContainerImage
	// Pressure, when set, gives the MemoryPressure, DiskPressure and
	// PIDPressure conditions (the eviction manager's, which acts on them)
	// instead of the thresholds of Options.
	Pressure []PressureState
}

// Builder turns Inputs into a v1.Node.
type Builder struct {
	opts Options
}

// NewBuilder checks the options and fills in defaults.
func NewBuilder(opts Options) (*Builder, error) {
	if opts.NodeName == "" {
		return nil, errors.New("building node status: node name is empty")
	}
	if opts.Thresholds.MemoryAvailable.IsZero() {
		opts.Thresholds.MemoryAvailable = DefaultMemoryAvailable.DeepCopy()
	}
	if opts.Thresholds.DiskAvailablePercent == 0 {
		opts.Thresholds.DiskAvailablePercent = DefaultDiskAvailablePercent
	}
	if opts.Thresholds.PIDAvailablePercent == 0 {
		opts.Thresholds.PIDAvailablePercent = DefaultPIDAvailablePercent
	}
	if opts.Thresholds.DiskAvailablePercent > 100 || opts.Thresholds.PIDAvailablePercent > 100 {
		return nil, fmt.Errorf("building node status: threshold percentages must be at most 100 (disk %v, pid %v)",
			opts.Thresholds.DiskAvailablePercent, opts.Thresholds.PIDAvailablePercent)
	}
	return &Builder{opts: opts}, nil
}

// Build returns the node for in at time now. Conditions keep prev's
// LastTransitionTime while their status is unchanged; LastHeartbeatTime is
// always now.
func (b *Builder) Build(in Inputs, prev *v1.Node, now time.Time) *v1.Node {
	stamp := metav1.NewTime(now.UTC().Truncate(time.Second)) // what JSON keeps
	node := &v1.Node{
		TypeMeta: metav1.TypeMeta{Kind: "Node", APIVersion: "v1"},
		ObjectMeta: metav1.ObjectMeta{
			Name:              b.opts.NodeName,
			Labels:            b.labels(in.Host),
			CreationTimestamp: stamp,
		},
	}
	if prev != nil && !prev.CreationTimestamp.IsZero() {
		node.CreationTimestamp = prev.CreationTimestamp
	}
	node.Status.Capacity, node.Status.Allocatable = b.resources(in)
	node.Status.Conditions = b.conditions(in, prev, stamp)
	node.Status.NodeInfo = nodeInfo(in, b.opts.Version)
	node.Status.Addresses = addresses(in.Host)
	node.Status.Images = in.Images
	return node
}

func (b *Builder) labels(host HostInfo) map[string]string {
	if b.opts.LiveLabels == nil {
		return Labels(b.opts.NodeName, b.opts.Labels, host)
	}
	live := b.opts.LiveLabels()
	merged := make(map[string]string, len(b.opts.Labels)+len(live))
	for k, v := range b.opts.Labels {
		merged[k] = v
	}
	for k, v := range live {
		merged[k] = v
	}
	return Labels(b.opts.NodeName, merged, host)
}

// Labels are the node's labels: the configured ones plus the kubelet's
// well-known kubernetes.io/hostname, kubernetes.io/os and
// kubernetes.io/arch, which win on conflict. Pod admission matches
// nodeSelector and node affinity against the same set.
func Labels(nodeName string, configured map[string]string, host HostInfo) map[string]string {
	labels := make(map[string]string, len(configured)+3)
	for k, v := range configured {
		labels[k] = v
	}
	labels[v1.LabelHostname] = nodeName
	labels[v1.LabelOSStable] = operatingSystem(host)
	if host.Architecture != "" {
		labels[v1.LabelArchStable] = host.Architecture
	}
	return labels
}

// Allocatable is the cpu and memory pods may request of a machine with
// cores CPUs and memoryBytes of memory: all cores, and the memory less the
// memory.available eviction threshold (zero: DefaultMemoryAvailable), as
// the kubelet computes it with no reservations and as Build publishes it.
func Allocatable(cores int, memoryBytes uint64, memoryAvailable resource.Quantity) v1.ResourceList {
	if memoryAvailable.IsZero() {
		memoryAvailable = DefaultMemoryAvailable
	}
	return v1.ResourceList{
		v1.ResourceCPU:    *resource.NewQuantity(int64(cores), resource.DecimalSI),
		v1.ResourceMemory: *resource.NewQuantity(max(int64(memoryBytes)-memoryAvailable.Value(), 0), resource.BinarySI),
	}
}

func operatingSystem(host HostInfo) string {
	if host.OperatingSystem == "" {
		return defaultOperatingSystem
	}
	return host.OperatingSystem
}

// resources: allocatable is capacity minus the eviction thresholds, as
// kubelet computes it with no reservations configured.
func (b *Builder) resources(in Inputs) (capacity, allocatable v1.ResourceList) {
	maxPods := in.MaxPods
	if maxPods <= 0 {
		maxPods = DefaultMaxPods
	}
	capacity = v1.ResourceList{v1.ResourcePods: *resource.NewQuantity(int64(maxPods), resource.DecimalSI)}
	allocatable = v1.ResourceList{v1.ResourcePods: *resource.NewQuantity(int64(maxPods), resource.DecimalSI)}
	if in.Machine != nil {
		capacity[v1.ResourceCPU] = *resource.NewQuantity(int64(in.Machine.NumCores), resource.DecimalSI)
		capacity[v1.ResourceMemory] = *resource.NewQuantity(int64(in.Machine.MemoryCapacity), resource.BinarySI)
		for name, q := range Allocatable(in.Machine.NumCores, in.Machine.MemoryCapacity, b.opts.Thresholds.MemoryAvailable) {
			if name == v1.ResourceMemory && b.opts.Thresholds.ReservedMemory > 0 {
				q = *resource.NewQuantity(max(q.Value()-b.opts.Thresholds.ReservedMemory, 0), resource.BinarySI)
			}
			allocatable[name] = q
		}
	}
	if in.Disk != nil {
		disk := int64(in.Disk.CapacityBytes)
		capacity[v1.ResourceEphemeralStorage] = *resource.NewQuantity(disk, resource.BinarySI)
		reserved := int64(0)
		if pct := b.opts.Thresholds.DiskAvailablePercent; pct > 0 {
			reserved = int64(float64(disk) * pct / 100)
		}
		reserved += max(b.opts.Thresholds.ReservedStorage, 0)
		allocatable[v1.ResourceEphemeralStorage] = *resource.NewQuantity(max(disk-reserved, 0), resource.BinarySI)
	}
	return capacity, allocatable
}

func (b *Builder) conditions(in Inputs, prev *v1.Node, now metav1.Time) []v1.NodeCondition {
	var prevConds []v1.NodeCondition
	if prev != nil {
		prevConds = prev.Status.Conditions
	}
	conds := []v1.NodeCondition{
		readyCondition(in.Runtime),
		b.memoryCondition(in.MemoryAvailableBytes),
		b.diskCondition(in.Disk),
		b.pidCondition(in.PIDs),
	}
	if in.Pressure != nil {
		conds = append(conds[:1], pressureConditions(in.Pressure)...)
	}
	for i := range conds {
		conds[i].LastHeartbeatTime = now
		conds[i].LastTransitionTime = now
		if old := findCondition(prevConds, conds[i].Type); old != nil && old.Status == conds[i].Status && !old.LastTransitionTime.IsZero() {
			conds[i].LastTransitionTime = old.LastTransitionTime
		}
	}
	return conds
}

func findCondition(conds []v1.NodeCondition, t v1.NodeConditionType) *v1.NodeCondition {
	for i := range conds {
		if conds[i].Type == t {
			return &conds[i]
		}
	}
	return nil
}

func readyCondition(rt RuntimeInfo) v1.NodeCondition {
	if rt.Ready {
		return v1.NodeCondition{Type: v1.NodeReady, Status: v1.ConditionTrue, Reason: ReasonReady, Message: readyMessage}
	}
	name := rt.Name
	if name == "" {
		name = "container runtime"
	}
	msg := name + " is not ready"
	if rt.Reason != "" {
		msg += ": " + rt.Reason
	}
	if rt.Message != "" {
		msg += ": " + rt.Message
	}
	return v1.NodeCondition{Type: v1.NodeReady, Status: v1.ConditionFalse, Reason: ReasonRuntimeUnreachable, Message: msg}
}

func unknownCondition(t v1.NodeConditionType, what string) v1.NodeCondition {
	return v1.NodeCondition{Type: t, Status: v1.ConditionUnknown, Reason: ReasonStatsUnavailable, Message: fmt.Sprintf(statsUnavailableMessage, what)}
}

// pressureConditions are the eviction manager's MemoryPressure,
// DiskPressure and PIDPressure, in that order.
func pressureConditions(states []PressureState) []v1.NodeCondition {
	type words struct{ what, under, fine, fineMsg string }
	byType := map[v1.NodeConditionType]words{
		v1.NodeMemoryPressure: {"available memory", ReasonInsufficientMemory, ReasonSufficientMemory, sufficientMemoryMessage},
		v1.NodeDiskPressure:   {"the node's filesystems", ReasonDiskPressure, ReasonNoDiskPressure, noDiskPressureMessage},
		v1.NodePIDPressure:    {"process IDs", ReasonInsufficientPID, ReasonSufficientPID, sufficientPIDMessage},
	}
	out := make([]v1.NodeCondition, 0, 3)
	for _, t := range []v1.NodeConditionType{v1.NodeMemoryPressure, v1.NodeDiskPressure, v1.NodePIDPressure} {
		w := byType[t]
		var st PressureState
		for _, s := range states {
			if s.Type == t {
				st = s
			}
		}
		switch {
		case st.Under:
			out = append(out, v1.NodeCondition{Type: t, Status: v1.ConditionTrue, Reason: w.under, Message: st.Message})
		case st.Known:
			out = append(out, v1.NodeCondition{Type: t, Status: v1.ConditionFalse, Reason: w.fine, Message: w.fineMsg})
		default:
			out = append(out, unknownCondition(t, w.what))
		}
	}
	return out
}

func (b *Builder) memoryCondition(available *uint64) v1.NodeCondition {
	if available == nil {
		return unknownCondition(v1.NodeMemoryPressure, "available memory")
	}
	threshold := b.opts.Thresholds.MemoryAvailable
	if *available < uint64(threshold.Value()) {
		return v1.NodeCondition{Type: v1.NodeMemoryPressure, Status: v1.ConditionTrue, Reason: ReasonInsufficientMemory,
			Message: fmt.Sprintf("available memory %s is below the threshold %s", resource.NewQuantity(int64(*available), resource.BinarySI), threshold.String())}
	}
	return v1.NodeCondition{Type: v1.NodeMemoryPressure, Status: v1.ConditionFalse, Reason: ReasonSufficientMemory, Message: sufficientMemoryMessage}
}

func (b *Builder) diskCondition(disk *DiskUsage) v1.NodeCondition {
	if disk == nil || disk.CapacityBytes == 0 {
		return unknownCondition(v1.NodeDiskPressure, "the state directory's filesystem")
	}
	pct := b.opts.Thresholds.DiskAvailablePercent
	free := 100 * float64(disk.AvailableBytes) / float64(disk.CapacityBytes)
	if pct > 0 && free < pct {
		return v1.NodeCondition{Type: v1.NodeDiskPressure, Status: v1.ConditionTrue, Reason: ReasonDiskPressure,
			Message: fmt.Sprintf("%.1f%% of the state filesystem is available, below the threshold %g%%", free, pct)}
	}
	return v1.NodeCondition{Type: v1.NodeDiskPressure, Status: v1.ConditionFalse, Reason: ReasonNoDiskPressure, Message: noDiskPressureMessage}
}

func (b *Builder) pidCondition(pids *PIDUsage) v1.NodeCondition {
	if pids == nil || pids.Max == 0 {
		return unknownCondition(v1.NodePIDPressure, "process IDs")
	}
	pct := b.opts.Thresholds.PIDAvailablePercent
	var available uint64
	if pids.Max > pids.Running {
		available = pids.Max - pids.Running
	}
	free := 100 * float64(available) / float64(pids.Max)
	if pct > 0 && free < pct {
		return v1.NodeCondition{Type: v1.NodePIDPressure, Status: v1.ConditionTrue, Reason: ReasonInsufficientPID,
			Message: fmt.Sprintf("%d of %d process IDs in use, %.1f%% available is below the threshold %g%%", pids.Running, pids.Max, free, pct)}
	}
	return v1.NodeCondition{Type: v1.NodePIDPressure, Status: v1.ConditionFalse, Reason: ReasonSufficientPID, Message: sufficientPIDMessage}
}

func nodeInfo(in Inputs, version string) v1.NodeSystemInfo {
	info := v1.NodeSystemInfo{
		KernelVersion:   in.Host.KernelVersion,
		OSImage:         in.Host.OSImage,
		KubeletVersion:  version,
		OperatingSystem: operatingSystem(in.Host),
		Architecture:    in.Host.Architecture,
	}
	if in.Machine != nil {
		info.MachineID = in.Machine.MachineID
		info.SystemUUID = in.Machine.SystemUUID
		info.BootID = in.Machine.BootID
	}
	if in.Runtime.Name != "" {
		info.ContainerRuntimeVersion = in.Runtime.Name + containerRuntimeVersionSeparator + in.Runtime.Version
	}
	return info
}

func addresses(host HostInfo) []v1.NodeAddress {
	// The order is kept: the first InternalIP is the node's primary address.
	var out []v1.NodeAddress
	for _, ip := range host.InternalIPs {
		out = append(out, v1.NodeAddress{Type: v1.NodeInternalIP, Address: ip})
	}
	if host.Hostname != "" {
		out = append(out, v1.NodeAddress{Type: v1.NodeHostName, Address: host.Hostname})
	}
	return out
}

// Changed reports whether next differs from prev other than in heartbeat
// times, i.e. whether it is worth publishing before the next periodic one.
func Changed(prev, next *v1.Node) bool {
	if prev == nil || next == nil {
		return prev != next
	}
	return !apiequality.Semantic.DeepEqual(withoutHeartbeats(prev), withoutHeartbeats(next))
}

func withoutHeartbeats(node *v1.Node) *v1.Node {
	out := node.DeepCopy()
	for i := range out.Status.Conditions {
		out.Status.Conditions[i].LastHeartbeatTime = metav1.Time{}
	}
	return out
}
