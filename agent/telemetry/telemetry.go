package telemetry

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	cadvisorapi "github.com/google/cadvisor/lib/model"
	"github.com/rs/zerolog"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/mqlet/mqlet/agent/nodestatus"
	apiv1 "github.com/mqlet/mqlet/api/v1"
	"github.com/mqlet/mqlet/metrics"
)

// Config is what Telemetry needs from mqlet's configuration.
type Config struct {
	// LiveMetrics, when set, gives MetricsInterval from then on.
	LiveMetrics LiveInterval
	// LiveNodeStatus, when set, gives NodeStatusInterval from then on.
	LiveNodeStatus  LiveInterval
	Topics          apiv1.Scheme
	Version         string
	StateDir        string
	CgroupRoot      string
	RuntimeEndpoint string
	// MetricsInterval 0 turns metrics off: no collector is created.
	MetricsInterval    time.Duration
	NodeStatusInterval time.Duration
	// MemoryAvailable ("100Mi"), DiskAvailablePct and PIDAvailablePct are
	// the pressure thresholds, as in the configuration file.
	MemoryAvailable  string
	DiskAvailablePct int
	PIDAvailablePct  int
	// ReservedMemory and ReservedStorage are mqlet's own reserve, left
	// out of allocatable.
	ReservedMemory, ReservedStorage int64
	MaxPods                         int
	// NodeLabels are published beside the well-known labels.
	NodeLabels map[string]string
	// LiveLabels, when set, gives labels read at every build of the node
	// (its groups'); LabelsChanged, when set, returns a channel closed
	// when they may have changed, and the node is rebuilt then (published
	// if it changed) instead of at the next check.
	LiveLabels    func() map[string]string
	LabelsChanged func() <-chan struct{}
}

// Runtime is what telemetry needs of the runtime manager.
type Runtime interface {
	RuntimeState
	PodSource
}

// Collector is the metrics collector as telemetry uses it.
type Collector interface {
	SummarySource
	MachineSource
	Close() error
}

// NewCollectorFunc creates the metrics collector.
type NewCollectorFunc func(ctx context.Context, opts metrics.Options, log zerolog.Logger) (Collector, error)

// Deps are the parts telemetry reads from and publishes to.
type Deps struct {
	Runtime  Runtime
	Out      Publisher         // metrics
	Retained Retained          // the node
	Events   NodeEventRecorder // may be nil
	Counters CounterSource     // may be nil
	// NewCollector defaults to metrics.New; it is only called when metrics are on.
	NewCollector NewCollectorFunc
	// Host and MemoryAvailable override the node's host readers (tests).
	Host            HostReader
	MemoryAvailable MemoryAvailableReader
	// Pressure, when set, gives the pressure conditions (the eviction
	// manager's) instead of the thresholds of Config.
	Pressure PressureSource
}

// PressureSource gives the node's pressure conditions.
type PressureSource func() []nodestatus.PressureState

// Telemetry runs the node reporter and, when metrics are on, the metrics
// reporter; it owns the collector.
type Telemetry struct {
	node      *NodeReporter
	metrics   *MetricsReporter // nil when metrics are off
	collector Collector        // nil when metrics are off
	log       zerolog.Logger
}

func newMetricsCollector(ctx context.Context, opts metrics.Options, log zerolog.Logger) (Collector, error) {
	return metrics.New(ctx, opts, log)
}

// New builds the reporters. The collector is created only when
// cfg.MetricsInterval > 0; otherwise, or when it cannot be created (logged,
// not fatal), metrics are off and MachineInfo is read without it.
func New(ctx context.Context, cfg Config, deps Deps, log zerolog.Logger) (*Telemetry, error) {
	if deps.Out == nil || deps.Retained == nil {
		return nil, errors.New("telemetry: no publisher or no retained registry")
	}
	thresholds, err := thresholdsFrom(cfg)
	if err != nil {
		return nil, err
	}
	builder, err := nodestatus.NewBuilder(nodestatus.Options{NodeName: cfg.Topics.Node, Version: cfg.Version, Labels: cfg.NodeLabels, LiveLabels: cfg.LiveLabels, Thresholds: thresholds})
	if err != nil {
		return nil, fmt.Errorf("setting up node telemetry: %w", err)
	}
	t := &Telemetry{log: log}
	var machine MachineSource
	if cfg.MetricsInterval > 0 {
		newCollector := deps.NewCollector
		if newCollector == nil {
			newCollector = newMetricsCollector
		}
		collector, err := newCollector(ctx, metrics.Options{
			NodeName:     cfg.Topics.Node,
			CgroupRoot:   cfg.CgroupRoot,
			StateDir:     cfg.StateDir,
			GaugeMetrics: GaugeCounters(),
		}, log.With().Str("component", "metrics").Logger())
		if err != nil {
			// Pods matter more than metrics: run on without them, loudly.
			log.Error().Err(err).Msg("metrics collector unavailable; metrics are off")
		} else {
			t.collector, machine = collector, collector
			t.metrics = NewMetricsReporter(MetricsOptions{Topics: cfg.Topics, Interval: cfg.MetricsInterval, Live: cfg.LiveMetrics},
				collector, deps.Runtime, deps.Counters, deps.Out, log.With().Str("component", "metrics").Logger())
		}
	}
	if machine == nil {
		hm, err := NewHostMachine()
		if err != nil {
			log.Error().Err(err).Msg("no machine info; the node is published without cpu and memory capacity")
			machine = missingMachine{err: err}
		} else {
			machine = hm
		}
	}
	host := deps.Host
	if host == nil {
		host = func() (nodestatus.HostInputs, error) {
			return nodestatus.ReadHostInputs(nodestatus.HostConfig{StateDir: cfg.StateDir})
		}
	}
	t.node = NewNodeReporter(NodeOptions{Topics: cfg.Topics, Interval: cfg.NodeStatusInterval, Live: cfg.LiveNodeStatus, MaxPods: cfg.MaxPods, RuntimeEndpoint: cfg.RuntimeEndpoint, LabelsChanged: cfg.LabelsChanged},
		builder, nodeSources(machine, deps, host),
		deps.Retained, deps.Events, log.With().Str("component", "nodestatus").Logger())
	return t, nil
}

func nodeSources(machine MachineSource, deps Deps, host HostReader) NodeSources {
	src := NodeSources{Machine: machine, Runtime: deps.Runtime, Host: host, MemoryAvailable: deps.MemoryAvailable, Pressure: deps.Pressure}
	if images, ok := deps.Runtime.(ImageLister); ok {
		src.Images = images
	}
	return src
}

// missingMachine stands in when MachineInfo cannot be read at all.
type missingMachine struct{ err error }

func (m missingMachine) MachineInfo() (*cadvisorapi.MachineInfo, error) { return nil, m.err }

// Node is the node last published on the node topic; nil before the first.
func (t *Telemetry) Node() *v1.Node { return t.node.Node() }

// MetricsEnabled reports whether a collector was created.
func (t *Telemetry) MetricsEnabled() bool { return t.metrics != nil }

// Run runs the reporters until ctx ends, then closes the collector.
func (t *Telemetry) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	run := func(name string, f func(context.Context) error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(ctx); err != nil {
				t.log.Error().Err(err).Str("reporter", name).Msg("telemetry reporter stopped")
			}
		}()
	}
	run("node", t.node.Run)
	if t.metrics != nil {
		run("metrics", t.metrics.Run)
	}
	wg.Wait()
	if t.collector != nil {
		if err := t.collector.Close(); err != nil {
			return fmt.Errorf("closing the metrics collector: %w", err)
		}
	}
	return nil
}

func thresholdsFrom(cfg Config) (nodestatus.Thresholds, error) {
	th := nodestatus.Thresholds{
		DiskAvailablePercent: float64(cfg.DiskAvailablePct),
		PIDAvailablePercent:  float64(cfg.PIDAvailablePct),
		ReservedMemory:       cfg.ReservedMemory,
		ReservedStorage:      cfg.ReservedStorage,
	}
	if cfg.MemoryAvailable != "" {
		q, err := resource.ParseQuantity(cfg.MemoryAvailable)
		if err != nil {
			return th, fmt.Errorf("parsing the memory-available threshold %q: %w", cfg.MemoryAvailable, err)
		}
		th.MemoryAvailable = q
	}
	return th, nil
}
