// Package telemetry publishes mqlet's periodic node telemetry: the retained
// v1.Node on `<prefix>/<node>/node` (NodeReporter) and the stats Summary on
// `<prefix>/<node>/metrics` (MetricsReporter). Each reporter owns its loop
// and stops with the context handed to Run.
package telemetry

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	cadvisorapi "github.com/google/cadvisor/lib/model"
	"github.com/rs/zerolog"
	v1 "k8s.io/api/core/v1"

	"github.com/mqlet/mqlet/agent/nodestatus"
	apiv1 "github.com/mqlet/mqlet/api/v1"
	"github.com/mqlet/mqlet/internal/liveperiod"
	"github.com/mqlet/mqlet/mqtt/outbox"
)

// Defaults for NodeOptions.
const (
	DefaultNodeStatusInterval = time.Minute
	// DefaultNodeCheckInterval is how often conditions are re-evaluated
	// between heartbeats (kubelet's nodeStatusUpdateFrequency).
	DefaultNodeCheckInterval = 10 * time.Second
	// DefaultStartupGrace covers the runtime's first connection attempt.
	DefaultStartupGrace = 5 * time.Second
)

// Publisher queues a message for the broker (the outbox).
type Publisher interface {
	Put(m outbox.Message) error
}

// Retained is where the node is published: the node's registry of retained
// topics (agent/retained), which owns how.
type Retained interface {
	Set(topic string, payload []byte) error
}

// RuntimeState is what the node reporter needs of the container runtime.
type RuntimeState interface {
	Ready() bool
	RuntimeInfo() (name, version string)
	// Changes is closed the next time readiness or version changes.
	Changes() <-chan struct{}
}

// MachineSource describes the machine (cAdvisor's MachineInfo).
type MachineSource interface {
	MachineInfo() (*cadvisorapi.MachineInfo, error)
}

// NodeEventRecorder records events about the node.
type NodeEventRecorder interface {
	NodeEvent(eventType, reason, message string)
}

// HostReader reads the host-side inputs (nodestatus.ReadHostInputs).
type HostReader func() (nodestatus.HostInputs, error)

// MemoryAvailableReader returns the node's available memory in bytes.
type MemoryAvailableReader func() (uint64, error)

// NodeOptions configure a NodeReporter.
type NodeOptions struct {
	Topics apiv1.Scheme
	// Interval is the heartbeat: the node is published at least this often
	// (0 means DefaultNodeStatusInterval).
	Interval time.Duration
	// CheckInterval is how often the node is rebuilt and published if it
	// changed (0 means DefaultNodeCheckInterval; never more than Interval).
	CheckInterval time.Duration
	// MaxPods is the pods capacity (0 means nodestatus.DefaultMaxPods).
	MaxPods int
	// RuntimeEndpoint names the CRI endpoint in the not-ready message.
	RuntimeEndpoint string
	// StartupGrace is how long the first publication waits for a runtime
	// that is not ready yet (0 means DefaultStartupGrace).
	StartupGrace time.Duration
	// Live, when set, gives Interval from then on (the config verb changes
	// it without a restart); CheckInterval stays, never more than it.
	Live liveperiod.Source
	// LabelsChanged, when set, returns a channel closed when the builder's
	// live labels may have changed: the node is rebuilt at once.
	LabelsChanged func() <-chan struct{}
}

func (o NodeOptions) withDefaults() NodeOptions {
	if o.Interval <= 0 {
		o.Interval = DefaultNodeStatusInterval
	}
	if o.CheckInterval <= 0 {
		o.CheckInterval = DefaultNodeCheckInterval
	}
	o.CheckInterval = min(o.CheckInterval, o.Interval)
	if o.StartupGrace <= 0 {
		o.StartupGrace = DefaultStartupGrace
	}
	if o.Live.IsZero() {
		o.Live = liveperiod.Fixed(o.Interval)
	}
	return o
}

// NodeSources are where a NodeReporter reads its inputs.
type NodeSources struct {
	Machine MachineSource
	Runtime RuntimeState
	// Host defaults to nodestatus.ReadHostInputs with an empty HostConfig.
	Host HostReader
	// MemoryAvailable defaults to MemAvailable from /proc/meminfo.
	MemoryAvailable MemoryAvailableReader
	// Images lists the images present (status.images); nil: none listed.
	Images ImageLister
	// Pressure, when set, gives the pressure conditions.
	Pressure PressureSource
}

// ImageLister lists the images on the node, as the node status shows them.
type ImageLister interface {
	NodeImages(ctx context.Context) ([]v1.ContainerImage, error)
}

// NodeReporter publishes the node (retained, QoS 1) when it changes and on
// every heartbeat, and records an event when a condition changes.
type NodeReporter struct {
	opts    NodeOptions
	builder *nodestatus.Builder
	src     NodeSources
	out     Retained
	events  NodeEventRecorder
	log     zerolog.Logger
	now     func() time.Time

	mu     sync.Mutex
	latest *v1.Node // last queued for publication, for Node (under mu)

	// Owned by the Run goroutine.
	last      *v1.Node // last built, for transition times and events
	published *v1.Node // last queued for publication
	hostErr   string   // last host-input error logged, to log each once
}

// NewNodeReporter returns a reporter; Run starts it.
func NewNodeReporter(opts NodeOptions, builder *nodestatus.Builder, src NodeSources, out Retained, events NodeEventRecorder, log zerolog.Logger) *NodeReporter {
	if src.Host == nil {
		src.Host = func() (nodestatus.HostInputs, error) { return nodestatus.ReadHostInputs(nodestatus.HostConfig{}) }
	}
	if src.MemoryAvailable == nil {
		src.MemoryAvailable = func() (uint64, error) { return ReadMemAvailable("/proc/meminfo") }
	}
	return &NodeReporter{opts: opts.withDefaults(), builder: builder, src: src, out: out, events: events, log: log, now: time.Now}
}

// Run publishes the node at once, then on every heartbeat, every check
// that finds a change, and every runtime readiness change, until ctx ends.
func (r *NodeReporter) Run(ctx context.Context) error {
	heartbeat := r.opts.Live.NewTimer()
	defer heartbeat.Stop()
	check := r.opts.Live.Min(r.opts.CheckInterval).NewTimer()
	defer check.Stop()
	// The change channel is taken before each read of readiness, so a change
	// that lands during a report closes the channel being waited on.
	runtimeChanged := r.src.Runtime.Changes()
	var labelsChanged <-chan struct{} // nil: never
	if r.opts.LabelsChanged != nil {
		labelsChanged = r.opts.LabelsChanged()
	}
	if !r.src.Runtime.Ready() {
		// The runtime manager starts with the agent: give its first
		// handshake a moment so a start does not flap NotReady → Ready.
		grace := time.NewTimer(r.opts.StartupGrace)
		select {
		case <-ctx.Done():
			grace.Stop()
			return nil
		case <-runtimeChanged:
			runtimeChanged = r.src.Runtime.Changes()
		case <-grace.C:
		}
		grace.Stop()
	}
	r.report(true)
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-heartbeat.C():
			r.report(true)
			heartbeat.Reset()
		case <-heartbeat.Changed():
			heartbeat.Update()
		case <-check.C():
			r.report(false)
			check.Reset()
		case <-check.Changed():
			check.Update()
		case <-runtimeChanged:
			runtimeChanged = r.src.Runtime.Changes()
			r.report(false)
		case <-labelsChanged:
			labelsChanged = r.opts.LabelsChanged()
			r.report(false)
		}
	}
}

// Node is the node last queued for publication on the node topic (a copy);
// nil before the first.
func (r *NodeReporter) Node() *v1.Node {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.latest == nil {
		return nil
	}
	return r.latest.DeepCopy()
}

// report builds the node and queues it when forced or changed.
func (r *NodeReporter) report(force bool) {
	node := r.builder.Build(r.inputs(), r.last, r.now())
	r.recordConditionEvents(r.last, node)
	r.last = node
	if !force && !nodestatus.Changed(r.published, node) {
		return
	}
	payload, err := json.Marshal(node)
	if err != nil {
		r.log.Error().Err(err).Msg("encoding node status")
		return
	}
	if err := r.out.Set(r.opts.Topics.NodeTopic(), payload); err != nil {
		// published stays as it was, so the next check retries.
		r.log.Warn().Err(err).Msg("queueing node status")
		return
	}
	r.published = node
	r.mu.Lock()
	r.latest = node
	r.mu.Unlock()
	r.log.Debug().Bool("heartbeat", force).Int("bytes", len(payload)).Msg("node status queued")
}

func (r *NodeReporter) inputs() nodestatus.Inputs {
	in := nodestatus.Inputs{MaxPods: r.opts.MaxPods, Runtime: r.runtimeInfo()}
	if mi, err := r.src.Machine.MachineInfo(); err != nil {
		r.log.Warn().Err(err).Msg("no machine info for node status")
	} else {
		in.Machine = mi
	}
	host, err := r.src.Host()
	if err != nil {
		if msg := err.Error(); msg != r.hostErr {
			r.log.Warn().Err(err).Msg("some host inputs of node status are missing")
			r.hostErr = msg
		}
	} else {
		r.hostErr = ""
	}
	in.Host, in.Disk, in.PIDs = host.Host, host.Disk, host.PIDs
	if r.src.Images != nil && r.src.Runtime.Ready() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if images, err := r.src.Images.NodeImages(ctx); err != nil {
			r.log.Debug().Err(err).Msg("no image list for node status")
		} else {
			in.Images = images
		}
		cancel()
	}
	if avail, err := r.src.MemoryAvailable(); err != nil {
		r.log.Warn().Err(err).Msg("no available memory for node status")
	} else {
		in.MemoryAvailableBytes = &avail
	}
	if r.src.Pressure != nil {
		in.Pressure = r.src.Pressure()
	}
	return in
}

func (r *NodeReporter) runtimeInfo() nodestatus.RuntimeInfo {
	name, version := r.src.Runtime.RuntimeInfo()
	info := nodestatus.RuntimeInfo{Name: name, Version: version, Ready: r.src.Runtime.Ready()}
	if !info.Ready {
		info.Reason = "CRI endpoint unreachable"
		if r.opts.RuntimeEndpoint != "" {
			info.Message = r.opts.RuntimeEndpoint + " does not answer; mqlet keeps retrying"
		}
	}
	return info
}

// conditionEvents maps a condition type and status to the kubelet's event reason.
var conditionEvents = map[v1.NodeConditionType]map[v1.ConditionStatus]struct {
	eventType, reason string
}{
	v1.NodeReady: {
		v1.ConditionTrue:  {v1.EventTypeNormal, "NodeReady"},
		v1.ConditionFalse: {v1.EventTypeWarning, "NodeNotReady"},
	},
	v1.NodeMemoryPressure: {
		v1.ConditionTrue:  {v1.EventTypeWarning, "NodeHasInsufficientMemory"},
		v1.ConditionFalse: {v1.EventTypeNormal, "NodeHasSufficientMemory"},
	},
	v1.NodeDiskPressure: {
		v1.ConditionTrue:  {v1.EventTypeWarning, "NodeHasDiskPressure"},
		v1.ConditionFalse: {v1.EventTypeNormal, "NodeHasNoDiskPressure"},
	},
	v1.NodePIDPressure: {
		v1.ConditionTrue:  {v1.EventTypeWarning, "NodeHasInsufficientPID"},
		v1.ConditionFalse: {v1.EventTypeNormal, "NodeHasSufficientPID"},
	},
}

// recordConditionEvents emits one event per condition whose status changed.
// On the first build only Ready and the conditions that are not healthy
// are reported, so a start says where the node stands without noise.
// A change to Unknown (a measurement missing) is logged, not evented.
func (r *NodeReporter) recordConditionEvents(prev, next *v1.Node) {
	if r.events == nil {
		return
	}
	for _, cond := range next.Status.Conditions {
		var old *v1.NodeCondition
		if prev != nil {
			old = findCondition(prev.Status.Conditions, cond.Type)
			if old != nil && old.Status == cond.Status {
				continue
			}
		}
		ev, ok := conditionEvents[cond.Type][cond.Status]
		if !ok {
			r.log.Debug().Str("condition", string(cond.Type)).Str("status", string(cond.Status)).Str("reason", cond.Reason).Msg("node condition not known")
			continue
		}
		if prev == nil && cond.Type != v1.NodeReady && ev.eventType == v1.EventTypeNormal {
			continue
		}
		r.events.NodeEvent(ev.eventType, ev.reason, fmt.Sprintf("Node %s status is now: %s (%s)", next.Name, ev.reason, cond.Message))
	}
}

func findCondition(conds []v1.NodeCondition, t v1.NodeConditionType) *v1.NodeCondition {
	for i := range conds {
		if conds[i].Type == t {
			return &conds[i]
		}
	}
	return nil
}
