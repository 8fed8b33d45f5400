package telemetry

import (
	"context"
	"encoding/json"
	"fmt"
	goruntime "runtime"
	"syscall"
	"time"

	"github.com/rs/zerolog"
	statsv1alpha1 "k8s.io/kubelet/pkg/apis/stats/v1alpha1"

	apiv1 "github.com/mqlet/mqlet/api/v1"
	"github.com/mqlet/mqlet/cri"
	"github.com/mqlet/mqlet/internal/liveperiod"
	"github.com/mqlet/mqlet/metrics"
	"github.com/mqlet/mqlet/mqtt/outbox"
)

// DefaultMetricsInterval is the metrics period when none is configured.
const DefaultMetricsInterval = 30 * time.Second

// SummarySource samples usage (metrics.Collector).
type SummarySource interface {
	Summary(ctx context.Context, pods []metrics.PodInfo, extra map[string]uint64) (*statsv1alpha1.Summary, error)
}

// PodSource lists the pods the runtime runs and their containers.
type PodSource interface {
	Ready() bool
	ListPods(ctx context.Context) ([]cri.PodRef, error)
}

// CounterSource returns mqlet's own counters, published with the metrics.
type CounterSource func() map[string]uint64

// MetricsOptions configure a MetricsReporter.
type MetricsOptions struct {
	Topics apiv1.Scheme
	// Interval between collections; 0 or less turns metrics off.
	Interval time.Duration
	// Live, when set, gives the interval from then on (the config verb
	// changes it without a restart).
	Live LiveInterval
}

// LiveInterval is a period that may change while running.
type LiveInterval = liveperiod.Source

// MetricsReporter publishes the stats Summary (QoS 0, not retained,
// coalesced so only the latest waits while offline) every Interval.
type MetricsReporter struct {
	opts     MetricsOptions
	summary  SummarySource
	pods     PodSource
	counters CounterSource
	out      Publisher
	log      zerolog.Logger
}

// NewMetricsReporter returns a reporter; Run starts it. counters may be nil.
func NewMetricsReporter(opts MetricsOptions, summary SummarySource, pods PodSource, counters CounterSource, out Publisher, log zerolog.Logger) *MetricsReporter {
	return &MetricsReporter{opts: opts, summary: summary, pods: pods, counters: counters, out: out, log: log}
}

// Run collects and publishes every Interval until ctx ends. With metrics
// off it returns at once.
func (r *MetricsReporter) Run(ctx context.Context) error {
	if r.opts.Interval <= 0 {
		r.log.Info().Msg("metrics are off")
		return nil
	}
	period := liveperiod.Fixed(r.opts.Interval)
	if !r.opts.Live.IsZero() {
		period = r.opts.Live
	}
	period.Every(ctx, func() {
		if _, err := r.Tick(ctx); err != nil && ctx.Err() == nil {
			r.log.Warn().Err(err).Msg("publishing metrics")
		}
	})
	return nil
}

// TickStats describe one collection.
type TickStats struct {
	Pods         int
	PayloadBytes int
	CPU          time.Duration // CPU time this collection took on its thread
	Wall         time.Duration
}

// Tick collects once and queues the payload.
func (r *MetricsReporter) Tick(ctx context.Context) (TickStats, error) {
	// The collection runs on one locked thread so its CPU time can be read
	// from the thread's own rusage, undisturbed by other goroutines.
	goruntime.LockOSThread()
	defer goruntime.UnlockOSThread()
	cpuStart, cpuErr := threadCPU()
	start := time.Now()

	payload, pods, err := r.collect(ctx)
	st := TickStats{Pods: pods, PayloadBytes: len(payload), Wall: time.Since(start)}
	if cpuEnd, err := threadCPU(); err == nil && cpuErr == nil {
		st.CPU = cpuEnd - cpuStart
	}
	if err != nil {
		return st, err
	}
	msg := outbox.Message{Topic: r.opts.Topics.Metrics(), Payload: payload, QoS: 0, Coalesce: true}
	if err := r.out.Put(msg); err != nil {
		return st, fmt.Errorf("queueing metrics: %w", err)
	}
	r.log.Debug().Int("pods", st.Pods).Int("bytes", st.PayloadBytes).Dur("cpu", st.CPU).Dur("wall", st.Wall).Msg("metrics collected")
	return st, nil
}

func (r *MetricsReporter) collect(ctx context.Context) ([]byte, int, error) {
	pods := r.podInfos(ctx)
	var extra map[string]uint64
	if r.counters != nil {
		extra = r.counters()
	}
	summary, err := r.summary.Summary(ctx, pods, extra)
	if err != nil {
		return nil, len(pods), fmt.Errorf("collecting metrics: %w", err)
	}
	payload, err := json.Marshal(summary)
	if err != nil {
		return nil, len(pods), fmt.Errorf("encoding metrics: %w", err)
	}
	return payload, len(pods), nil
}

// podInfos names the runtime's pods and their running containers. With the
// runtime down the node is still reported, without pods.
func (r *MetricsReporter) podInfos(ctx context.Context) []metrics.PodInfo {
	if r.pods == nil || !r.pods.Ready() {
		return nil
	}
	refs, err := r.pods.ListPods(ctx)
	if err != nil {
		r.log.Warn().Err(err).Msg("listing pods for metrics")
		return nil
	}
	var disk map[string]cri.ContainerFs
	if fsSrc, ok := r.pods.(FilesystemSource); ok {
		if disk, err = fsSrc.ContainerFilesystems(ctx); err != nil {
			r.log.Debug().Err(err).Msg("no container disk usage for metrics")
		}
	}
	out := make([]metrics.PodInfo, 0, len(refs))
	for _, ref := range refs {
		info := metrics.PodInfo{UID: ref.UID, Name: ref.Name, Namespace: ref.Namespace, Containers: map[string]string{}, Filesystems: map[string]metrics.ContainerFilesystem{}}
		// Running containers only: exited attempts have no cgroup left to
		// measure. The listing names them; a full status of every pod
		// (four CRI calls each) was most of a collection's calls.
		for id, name := range ref.Running {
			info.Containers[id] = name
			if use, ok := disk[id]; ok {
				info.Filesystems[id] = metrics.ContainerFilesystem{
					RootfsUsedBytes: use.RootfsUsedBytes, RootfsDir: use.RootfsMount,
					LogsUsedBytes: use.LogsUsedBytes, LogsDir: use.LogsDir,
				}
			}
		}
		out = append(out, info)
	}
	return out
}

// FilesystemSource reports the disk use of containers; a PodSource that
// also implements it (the runtime manager does) adds rootfs and logs figures.
type FilesystemSource interface {
	ContainerFilesystems(ctx context.Context) (map[string]cri.ContainerFs, error)
}

// threadCPU is the user+system CPU time of the calling OS thread.
func threadCPU() (time.Duration, error) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_THREAD, &ru); err != nil {
		return 0, fmt.Errorf("reading thread CPU time: %w", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), nil
}
