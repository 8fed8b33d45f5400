package cri

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/rs/zerolog"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// runtimeClient is every CRI runtime call mqlet makes. A new call is added
// here and to instrumentedRuntime, so it gets the deadline, the error
// classification, the log line and the counts of every other call.
type runtimeClient interface {
	Version(ctx context.Context, apiVersion string) (*runtimeapi.VersionResponse, error)
	Status(ctx context.Context, verbose bool) (*runtimeapi.StatusResponse, error)
	RunPodSandbox(ctx context.Context, config *runtimeapi.PodSandboxConfig, runtimeHandler string) (string, error)
	StopPodSandbox(ctx context.Context, podSandboxID string) error
	RemovePodSandbox(ctx context.Context, podSandboxID string) error
	PodSandboxStatus(ctx context.Context, podSandboxID string, verbose bool) (*runtimeapi.PodSandboxStatusResponse, error)
	ListPodSandbox(ctx context.Context, filter *runtimeapi.PodSandboxFilter) ([]*runtimeapi.PodSandbox, error)
	CreateContainer(ctx context.Context, podSandboxID string, config *runtimeapi.ContainerConfig, sandboxConfig *runtimeapi.PodSandboxConfig) (string, error)
	StartContainer(ctx context.Context, containerID string) error
	StopContainer(ctx context.Context, containerID string, timeout int64) error
	RemoveContainer(ctx context.Context, containerID string) error
	ListContainers(ctx context.Context, filter *runtimeapi.ContainerFilter) ([]*runtimeapi.Container, error)
	ContainerStatus(ctx context.Context, containerID string, verbose bool) (*runtimeapi.ContainerStatusResponse, error)
	ExecSync(ctx context.Context, containerID string, cmd []string, timeout time.Duration) (stdout, stderr []byte, err error)
	Exec(ctx context.Context, req *runtimeapi.ExecRequest) (*runtimeapi.ExecResponse, error)
	ReopenContainerLog(ctx context.Context, containerID string) error
	ListContainerStats(ctx context.Context, filter *runtimeapi.ContainerStatsFilter) ([]*runtimeapi.ContainerStats, error)
	GetContainerEvents(ctx context.Context, ch chan *runtimeapi.ContainerEventResponse, connectionEstablishedCallback func(runtimeapi.RuntimeService_GetContainerEventsClient)) error
	Close(ctx context.Context) error
}

// imageClient is every CRI image call mqlet makes (see runtimeClient).
type imageClient interface {
	ListImages(ctx context.Context, filter *runtimeapi.ImageFilter) ([]*runtimeapi.Image, error)
	ImageStatus(ctx context.Context, image *runtimeapi.ImageSpec, verbose bool) (*runtimeapi.ImageStatusResponse, error)
	PullImage(ctx context.Context, image *runtimeapi.ImageSpec, auth *runtimeapi.AuthConfig, podSandboxConfig *runtimeapi.PodSandboxConfig) (string, error)
	RemoveImage(ctx context.Context, image *runtimeapi.ImageSpec) error
	ImageFsInfo(ctx context.Context) (*runtimeapi.ImageFsInfoResponse, error)
	Close(ctx context.Context) error
}

// CallStat counts the calls of one CRI method and how many failed.
type CallStat struct {
	Calls  uint64
	Errors uint64
}

// instrumentation is what every CRI call goes through (the shape of
// containerd's instrumented CRI service): a deadline, a classified error,
// a debug line and a count per method.
type instrumentation struct {
	requestTimeout time.Duration
	pullTimeout    time.Duration
	log            zerolog.Logger
	// unavailable is told when a call finds the runtime gone, so the
	// connection re-checks at once instead of at its next health tick.
	unavailable func()

	mu    sync.Mutex
	stats map[string]*CallStat
}

func newInstrumentation(cfg Config, log zerolog.Logger, unavailable func()) *instrumentation {
	return &instrumentation{
		requestTimeout: cfg.RequestTimeout,
		pullTimeout:    cfg.PullTimeout,
		log:            log,
		unavailable:    unavailable,
		stats:          map[string]*CallStat{},
	}
}

// wrap returns svc with every call instrumented.
func (in *instrumentation) wrap(svc *services) *services {
	return &services{
		runtime: &instrumentedRuntime{next: svc.runtime, in: in},
		image:   &instrumentedImage{next: svc.image, in: in},
	}
}

// snapshot copies the counts, by method.
func (in *instrumentation) snapshot() map[string]CallStat {
	in.mu.Lock()
	defer in.mu.Unlock()
	out := make(map[string]CallStat, len(in.stats))
	for k, v := range in.stats {
		out[k] = *v
	}
	return out
}

// begin gives one call its context: quiet (cri-client's klog lines stay
// out; we log ourselves) and bounded by timeout (0: only by ctx, for
// streams). The returned func ends the call with its error and returns
// the error as callers should see it.
func (in *instrumentation) begin(ctx context.Context, method string, timeout time.Duration) (context.Context, func(err error) error) {
	ctx = quietContext(ctx)
	cancel := context.CancelFunc(func() {})
	if timeout > 0 {
		ctx, cancel = context.WithTimeout(ctx, timeout)
	}
	start := time.Now()
	return ctx, func(err error) error {
		cancel()
		err = in.classify(err)
		in.mu.Lock()
		st := in.stats[method]
		if st == nil {
			st = &CallStat{}
			in.stats[method] = st
		}
		st.Calls++
		if err != nil && !isNotFound(err) {
			st.Errors++
		}
		in.mu.Unlock()
		if e := in.log.Debug(); e.Enabled() {
			e.Str("call", method).Dur("took", time.Since(start)).Str("code", status.Code(err).String()).Msg("CRI call")
		}
		return err
	}
}

// classify marks errors that mean the runtime went away (gRPC Unavailable)
// as ErrUnavailable and asks for a re-check.
func (in *instrumentation) classify(err error) error {
	if err == nil {
		return nil
	}
	if status.Code(err) == codes.Unavailable {
		if in.unavailable != nil {
			in.unavailable()
		}
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	return err
}

// CallStats returns the CRI calls made since start and how many failed,
// by method name (NotFound answers are not counted as failures: they are
// how mqlet learns an object is already gone).
func (m *Manager) CallStats() map[string]CallStat { return m.conn.instr.snapshot() }

// CallMethods returns the method names of stats, sorted.
func CallMethods(stats map[string]CallStat) []string {
	out := make([]string, 0, len(stats))
	for k := range stats {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

type instrumentedRuntime struct {
	next runtimeClient
	in   *instrumentation
}

func (r *instrumentedRuntime) Version(ctx context.Context, apiVersion string) (*runtimeapi.VersionResponse, error) {
	ctx, done := r.in.begin(ctx, "Version", r.in.requestTimeout)
	resp, err := r.next.Version(ctx, apiVersion)
	return resp, done(err)
}

func (r *instrumentedRuntime) Status(ctx context.Context, verbose bool) (*runtimeapi.StatusResponse, error) {
	ctx, done := r.in.begin(ctx, "Status", r.in.requestTimeout)
	resp, err := r.next.Status(ctx, verbose)
	return resp, done(err)
}

func (r *instrumentedRuntime) RunPodSandbox(ctx context.Context, config *runtimeapi.PodSandboxConfig, runtimeHandler string) (string, error) {
	ctx, done := r.in.begin(ctx, "RunPodSandbox", r.in.requestTimeout)
	id, err := r.next.RunPodSandbox(ctx, config, runtimeHandler)
	return id, done(err)
}

func (r *instrumentedRuntime) StopPodSandbox(ctx context.Context, podSandboxID string) error {
	ctx, done := r.in.begin(ctx, "StopPodSandbox", r.in.requestTimeout)
	return done(r.next.StopPodSandbox(ctx, podSandboxID))
}

func (r *instrumentedRuntime) RemovePodSandbox(ctx context.Context, podSandboxID string) error {
	ctx, done := r.in.begin(ctx, "RemovePodSandbox", r.in.requestTimeout)
	return done(r.next.RemovePodSandbox(ctx, podSandboxID))
}

func (r *instrumentedRuntime) PodSandboxStatus(ctx context.Context, podSandboxID string, verbose bool) (*runtimeapi.PodSandboxStatusResponse, error) {
	ctx, done := r.in.begin(ctx, "PodSandboxStatus", r.in.requestTimeout)
	resp, err := r.next.PodSandboxStatus(ctx, podSandboxID, verbose)
	return resp, done(err)
}

func (r *instrumentedRuntime) ListPodSandbox(ctx context.Context, filter *runtimeapi.PodSandboxFilter) ([]*runtimeapi.PodSandbox, error) {
	ctx, done := r.in.begin(ctx, "ListPodSandbox", r.in.requestTimeout)
	list, err := r.next.ListPodSandbox(ctx, filter)
	return list, done(err)
}

func (r *instrumentedRuntime) CreateContainer(ctx context.Context, podSandboxID string, config *runtimeapi.ContainerConfig, sandboxConfig *runtimeapi.PodSandboxConfig) (string, error) {
	ctx, done := r.in.begin(ctx, "CreateContainer", r.in.requestTimeout)
	id, err := r.next.CreateContainer(ctx, podSandboxID, config, sandboxConfig)
	return id, done(err)
}

func (r *instrumentedRuntime) StartContainer(ctx context.Context, containerID string) error {
	ctx, done := r.in.begin(ctx, "StartContainer", r.in.requestTimeout)
	return done(r.next.StartContainer(ctx, containerID))
}

// StopContainer may take the grace period before the runtime kills.
func (r *instrumentedRuntime) StopContainer(ctx context.Context, containerID string, timeout int64) error {
	ctx, done := r.in.begin(ctx, "StopContainer", r.in.requestTimeout+time.Duration(max(timeout, 0))*time.Second)
	return done(r.next.StopContainer(ctx, containerID, timeout))
}

func (r *instrumentedRuntime) RemoveContainer(ctx context.Context, containerID string) error {
	ctx, done := r.in.begin(ctx, "RemoveContainer", r.in.requestTimeout)
	return done(r.next.RemoveContainer(ctx, containerID))
}

func (r *instrumentedRuntime) ListContainers(ctx context.Context, filter *runtimeapi.ContainerFilter) ([]*runtimeapi.Container, error) {
	ctx, done := r.in.begin(ctx, "ListContainers", r.in.requestTimeout)
	list, err := r.next.ListContainers(ctx, filter)
	return list, done(err)
}

func (r *instrumentedRuntime) ContainerStatus(ctx context.Context, containerID string, verbose bool) (*runtimeapi.ContainerStatusResponse, error) {
	ctx, done := r.in.begin(ctx, "ContainerStatus", r.in.requestTimeout)
	resp, err := r.next.ContainerStatus(ctx, containerID, verbose)
	return resp, done(err)
}

// ExecSync may take the command's own timeout.
func (r *instrumentedRuntime) ExecSync(ctx context.Context, containerID string, cmd []string, timeout time.Duration) ([]byte, []byte, error) {
	ctx, done := r.in.begin(ctx, "ExecSync", r.in.requestTimeout+max(timeout, 0))
	stdout, stderr, err := r.next.ExecSync(ctx, containerID, cmd, timeout)
	return stdout, stderr, done(err)
}

// Exec only asks the runtime for a streaming URL; the stream is not a
// CRI call.
func (r *instrumentedRuntime) Exec(ctx context.Context, req *runtimeapi.ExecRequest) (*runtimeapi.ExecResponse, error) {
	ctx, done := r.in.begin(ctx, "Exec", r.in.requestTimeout)
	resp, err := r.next.Exec(ctx, req)
	return resp, done(err)
}

func (r *instrumentedRuntime) ReopenContainerLog(ctx context.Context, containerID string) error {
	ctx, done := r.in.begin(ctx, "ReopenContainerLog", r.in.requestTimeout)
	return done(r.next.ReopenContainerLog(ctx, containerID))
}

func (r *instrumentedRuntime) ListContainerStats(ctx context.Context, filter *runtimeapi.ContainerStatsFilter) ([]*runtimeapi.ContainerStats, error) {
	ctx, done := r.in.begin(ctx, "ListContainerStats", r.in.requestTimeout)
	list, err := r.next.ListContainerStats(ctx, filter)
	return list, done(err)
}

// GetContainerEvents is a stream: it lasts as long as ctx, and counts once.
func (r *instrumentedRuntime) GetContainerEvents(ctx context.Context, ch chan *runtimeapi.ContainerEventResponse, cb func(runtimeapi.RuntimeService_GetContainerEventsClient)) error {
	ctx, done := r.in.begin(ctx, "GetContainerEvents", 0)
	return done(r.next.GetContainerEvents(ctx, ch, cb))
}

// Close ends the client's connection; it is no CRI call.
func (r *instrumentedRuntime) Close(ctx context.Context) error {
	return r.next.Close(quietContext(ctx))
}

type instrumentedImage struct {
	next imageClient
	in   *instrumentation
}

func (i *instrumentedImage) ListImages(ctx context.Context, filter *runtimeapi.ImageFilter) ([]*runtimeapi.Image, error) {
	ctx, done := i.in.begin(ctx, "ListImages", i.in.requestTimeout)
	list, err := i.next.ListImages(ctx, filter)
	return list, done(err)
}

func (i *instrumentedImage) ImageStatus(ctx context.Context, image *runtimeapi.ImageSpec, verbose bool) (*runtimeapi.ImageStatusResponse, error) {
	ctx, done := i.in.begin(ctx, "ImageStatus", i.in.requestTimeout)
	resp, err := i.next.ImageStatus(ctx, image, verbose)
	return resp, done(err)
}

// PullImage is bounded by the pull timeout, not the request timeout.
func (i *instrumentedImage) PullImage(ctx context.Context, image *runtimeapi.ImageSpec, auth *runtimeapi.AuthConfig, sandbox *runtimeapi.PodSandboxConfig) (string, error) {
	ctx, done := i.in.begin(ctx, "PullImage", i.in.pullTimeout)
	ref, err := i.next.PullImage(ctx, image, auth, sandbox)
	return ref, done(err)
}

func (i *instrumentedImage) RemoveImage(ctx context.Context, image *runtimeapi.ImageSpec) error {
	ctx, done := i.in.begin(ctx, "RemoveImage", i.in.requestTimeout)
	return done(i.next.RemoveImage(ctx, image))
}

func (i *instrumentedImage) ImageFsInfo(ctx context.Context) (*runtimeapi.ImageFsInfoResponse, error) {
	ctx, done := i.in.begin(ctx, "ImageFsInfo", i.in.requestTimeout)
	resp, err := i.next.ImageFsInfo(ctx)
	return resp, done(err)
}

func (i *instrumentedImage) Close(ctx context.Context) error { return i.next.Close(quietContext(ctx)) }
