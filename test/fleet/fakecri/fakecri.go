// Package fakecri is a CRI runtime that runs pods instantly, for the fleet
// simulator only (test/fleet): it answers the CRI RuntimeService and
// ImageService over gRPC on a unix socket, keeps sandboxes and containers
// in memory and starts nothing. Every image is present, a sandbox is ready
// (with an IP) as soon as it is asked for, a started container runs until
// it is stopped, unless its command ends in `exit <code>`, then it exits
// at once with that code. Stats are made up from the container's age.
//
// It lets the real cri.Manager and agent do a pod's whole lifecycle at no
// cost, so a thousand agents fit in one process. It proves nothing about
// a real runtime: no test may use it to claim that a capability works.
package fakecri

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Server is one fake runtime: its own sandboxes and containers.
type Server struct {
	runtimeapi.UnimplementedRuntimeServiceServer
	runtimeapi.UnimplementedImageServiceServer

	mu         sync.Mutex
	seq        uint64
	sandboxes  map[string]*sandbox
	containers map[string]*container
	started    uint64 // containers started, ever
	grpc       *grpc.Server
	socket     string
	accepted   atomic.Int64 // connections accepted, ever
	open       atomic.Int64 // connections open now
}

type sandbox struct {
	id      string
	config  *runtimeapi.PodSandboxConfig
	handler string
	state   runtimeapi.PodSandboxState
	created time.Time
	ip      string
}

type container struct {
	id        string
	sandboxID string
	config    *runtimeapi.ContainerConfig
	logPath   string
	state     runtimeapi.ContainerState
	created   time.Time
	started   time.Time
	finished  time.Time
	exitCode  int32
	reason    string
}

// maxObjects bounds what one fake keeps (a runaway agent must not eat
// the simulator's memory).
const maxObjects = 10000

// New returns an empty fake runtime, not serving yet.
func New() *Server {
	return &Server{sandboxes: map[string]*sandbox{}, containers: map[string]*container{}}
}

// Serve listens on the unix socket path and answers CRI until Stop.
func (s *Server) Serve(socket string) error {
	_ = os.Remove(socket)
	lis, err := net.Listen("unix", socket)
	if err != nil {
		return fmt.Errorf("fake CRI: listen on %s: %w", socket, err)
	}
	srv := grpc.NewServer()
	runtimeapi.RegisterRuntimeServiceServer(srv, s)
	runtimeapi.RegisterImageServiceServer(srv, s)
	s.mu.Lock()
	s.grpc, s.socket = srv, socket
	s.mu.Unlock()
	go func() { _ = srv.Serve(&countingListener{Listener: lis, s: s}) }()
	return nil
}

// Conns says how many connections the fake accepted, ever, and how many
// are open now.
func (s *Server) Conns() (accepted, open int64) { return s.accepted.Load(), s.open.Load() }

type countingListener struct {
	net.Listener
	s *Server
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.s.accepted.Add(1)
	l.s.open.Add(1)
	return &countedConn{Conn: c, s: l.s}, nil
}

type countedConn struct {
	net.Conn
	s    *Server
	once sync.Once
}

func (c *countedConn) Close() error {
	c.once.Do(func() { c.s.open.Add(-1) })
	return c.Conn.Close()
}

// Endpoint is the CRI endpoint of the socket Serve listens on.
func (s *Server) Endpoint() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return "unix://" + s.socket
}

// Stop ends serving at once.
func (s *Server) Stop() {
	s.mu.Lock()
	srv := s.grpc
	s.mu.Unlock()
	if srv != nil {
		srv.Stop()
	}
}

// Counts says how many sandboxes are ready and containers running now,
// and how many containers were ever started.
func (s *Server) Counts() (readySandboxes, running int, started uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, sb := range s.sandboxes {
		if sb.state == runtimeapi.PodSandboxState_SANDBOX_READY {
			readySandboxes++
		}
	}
	for _, c := range s.containers {
		if c.state == runtimeapi.ContainerState_CONTAINER_RUNNING {
			running++
		}
	}
	return readySandboxes, running, s.started
}

func (s *Server) newID() string {
	s.seq++
	return fmt.Sprintf("%064x", s.seq)
}

func notFound(kind, id string) error {
	return status.Errorf(codes.NotFound, "%s %q not found", kind, id)
}

func (s *Server) full() error {
	if len(s.sandboxes)+len(s.containers) >= maxObjects {
		return status.Errorf(codes.ResourceExhausted, "fake CRI holds %d objects already", maxObjects)
	}
	return nil
}

func matchLabels(have, want map[string]string) bool {
	for k, v := range want {
		if have[k] != v {
			return false
		}
	}
	return true
}

// exitCode reads `exit <code>` at the end of a container's command line.
func exitCode(cfg *runtimeapi.ContainerConfig) (int32, bool) {
	words := strings.Fields(strings.Join(append(append([]string{}, cfg.GetCommand()...), cfg.GetArgs()...), " "))
	if len(words) < 2 || words[len(words)-2] != "exit" {
		return 0, false
	}
	n, err := strconv.ParseInt(words[len(words)-1], 10, 32)
	if err != nil || n < 0 || n > 255 {
		return 0, false
	}
	return int32(n), true
}

func (s *Server) exitLocked(c *container, code int32, at time.Time) {
	c.state = runtimeapi.ContainerState_CONTAINER_EXITED
	c.exitCode = code
	c.finished = at
	c.reason = "Completed"
	if code != 0 {
		c.reason = "Error"
	}
}

// Version answers the handshake.
func (s *Server) Version(context.Context, *runtimeapi.VersionRequest) (*runtimeapi.VersionResponse, error) {
	return &runtimeapi.VersionResponse{Version: "0.1.0", RuntimeName: "fakecri", RuntimeVersion: "0.0.1", RuntimeApiVersion: "v1"}, nil
}

// Status says the runtime and its network are ready.
func (s *Server) Status(context.Context, *runtimeapi.StatusRequest) (*runtimeapi.StatusResponse, error) {
	return &runtimeapi.StatusResponse{Status: &runtimeapi.RuntimeStatus{Conditions: []*runtimeapi.RuntimeCondition{
		{Type: runtimeapi.RuntimeReady, Status: true},
		{Type: runtimeapi.NetworkReady, Status: true},
	}}}, nil
}

// RunPodSandbox makes a ready sandbox at once.
func (s *Server) RunPodSandbox(_ context.Context, r *runtimeapi.RunPodSandboxRequest) (*runtimeapi.RunPodSandboxResponse, error) {
	if r.GetConfig().GetMetadata() == nil {
		return nil, status.Error(codes.InvalidArgument, "sandbox config without metadata")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.full(); err != nil {
		return nil, err
	}
	id := s.newID()
	s.sandboxes[id] = &sandbox{id: id, config: r.Config, handler: r.RuntimeHandler, state: runtimeapi.PodSandboxState_SANDBOX_READY,
		created: time.Now(), ip: fmt.Sprintf("10.%d.%d.%d", (s.seq>>16)&0xff, (s.seq>>8)&0xff, s.seq&0xff)}
	return &runtimeapi.RunPodSandboxResponse{PodSandboxId: id}, nil
}

// StopPodSandbox stops the sandbox and every container in it.
func (s *Server) StopPodSandbox(_ context.Context, r *runtimeapi.StopPodSandboxRequest) (*runtimeapi.StopPodSandboxResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sb, ok := s.sandboxes[r.PodSandboxId]
	if !ok {
		return &runtimeapi.StopPodSandboxResponse{}, nil // as containerd: stopping a gone sandbox is fine
	}
	now := time.Now()
	for _, c := range s.containers {
		if c.sandboxID == sb.id && c.state == runtimeapi.ContainerState_CONTAINER_RUNNING {
			s.exitLocked(c, 137, now)
		}
	}
	sb.state = runtimeapi.PodSandboxState_SANDBOX_NOTREADY
	return &runtimeapi.StopPodSandboxResponse{}, nil
}

// RemovePodSandbox forgets the sandbox and its containers.
func (s *Server) RemovePodSandbox(_ context.Context, r *runtimeapi.RemovePodSandboxRequest) (*runtimeapi.RemovePodSandboxResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for id, c := range s.containers {
		if c.sandboxID == r.PodSandboxId {
			delete(s.containers, id)
		}
	}
	delete(s.sandboxes, r.PodSandboxId)
	return &runtimeapi.RemovePodSandboxResponse{}, nil
}

func (sb *sandbox) status() *runtimeapi.PodSandboxStatus {
	return &runtimeapi.PodSandboxStatus{
		Id: sb.id, Metadata: sb.config.Metadata, State: sb.state, CreatedAt: sb.created.UnixNano(),
		Network: &runtimeapi.PodSandboxNetworkStatus{Ip: sb.ip},
		Linux:   &runtimeapi.LinuxPodSandboxStatus{Namespaces: &runtimeapi.Namespace{Options: sb.config.GetLinux().GetSecurityContext().GetNamespaceOptions()}},
		Labels:  sb.config.Labels, Annotations: sb.config.Annotations, RuntimeHandler: sb.handler,
	}
}

// PodSandboxStatus reports one sandbox.
func (s *Server) PodSandboxStatus(_ context.Context, r *runtimeapi.PodSandboxStatusRequest) (*runtimeapi.PodSandboxStatusResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sb, ok := s.sandboxes[r.PodSandboxId]
	if !ok {
		return nil, notFound("sandbox", r.PodSandboxId)
	}
	return &runtimeapi.PodSandboxStatusResponse{Status: sb.status()}, nil
}

// ListPodSandbox lists the sandboxes the filter selects.
func (s *Server) ListPodSandbox(_ context.Context, r *runtimeapi.ListPodSandboxRequest) (*runtimeapi.ListPodSandboxResponse, error) {
	f := r.GetFilter()
	s.mu.Lock()
	defer s.mu.Unlock()
	out := []*runtimeapi.PodSandbox{}
	for _, sb := range s.sandboxes {
		if f.GetId() != "" && f.GetId() != sb.id || f.GetState() != nil && f.GetState().State != sb.state || !matchLabels(sb.config.Labels, f.GetLabelSelector()) {
			continue
		}
		out = append(out, &runtimeapi.PodSandbox{Id: sb.id, Metadata: sb.config.Metadata, State: sb.state, CreatedAt: sb.created.UnixNano(),
			Labels: sb.config.Labels, Annotations: sb.config.Annotations, RuntimeHandler: sb.handler})
	}
	return &runtimeapi.ListPodSandboxResponse{Items: out}, nil
}

// CreateContainer records a created container in a ready sandbox.
func (s *Server) CreateContainer(_ context.Context, r *runtimeapi.CreateContainerRequest) (*runtimeapi.CreateContainerResponse, error) {
	if r.GetConfig().GetMetadata() == nil {
		return nil, status.Error(codes.InvalidArgument, "container config without metadata")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	sb, ok := s.sandboxes[r.PodSandboxId]
	if !ok {
		return nil, notFound("sandbox", r.PodSandboxId)
	}
	if sb.state != runtimeapi.PodSandboxState_SANDBOX_READY {
		return nil, status.Errorf(codes.FailedPrecondition, "sandbox %q is not ready", sb.id)
	}
	if err := s.full(); err != nil {
		return nil, err
	}
	id := s.newID()
	logPath := ""
	if dir, p := sb.config.GetLogDirectory(), r.Config.GetLogPath(); dir != "" && p != "" {
		logPath = filepath.Join(dir, p)
	}
	s.containers[id] = &container{id: id, sandboxID: sb.id, config: r.Config, logPath: logPath,
		state: runtimeapi.ContainerState_CONTAINER_CREATED, created: time.Now()}
	return &runtimeapi.CreateContainerResponse{ContainerId: id}, nil
}

// StartContainer runs a created container: it is running, or exited at
// once when its command ends in `exit <code>`. Its log file is made empty.
func (s *Server) StartContainer(_ context.Context, r *runtimeapi.StartContainerRequest) (*runtimeapi.StartContainerResponse, error) {
	s.mu.Lock()
	c, ok := s.containers[r.ContainerId]
	if !ok {
		s.mu.Unlock()
		return nil, notFound("container", r.ContainerId)
	}
	if c.state != runtimeapi.ContainerState_CONTAINER_CREATED {
		s.mu.Unlock()
		return nil, status.Errorf(codes.FailedPrecondition, "container %q is not created", c.id)
	}
	now := time.Now()
	c.started = now
	c.state = runtimeapi.ContainerState_CONTAINER_RUNNING
	if code, ok := exitCode(c.config); ok {
		s.exitLocked(c, code, now)
	}
	s.started++
	logPath := c.logPath
	s.mu.Unlock()
	if logPath != "" {
		if err := os.MkdirAll(filepath.Dir(logPath), 0o755); err == nil {
			if f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY, 0o640); err == nil {
				_ = f.Close()
			}
		}
	}
	return &runtimeapi.StartContainerResponse{}, nil
}

// StopContainer stops a running container (exit 143, as SIGTERM).
func (s *Server) StopContainer(_ context.Context, r *runtimeapi.StopContainerRequest) (*runtimeapi.StopContainerResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.containers[r.ContainerId]
	if !ok {
		return nil, notFound("container", r.ContainerId)
	}
	if c.state == runtimeapi.ContainerState_CONTAINER_RUNNING || c.state == runtimeapi.ContainerState_CONTAINER_CREATED {
		s.exitLocked(c, 143, time.Now())
	}
	return &runtimeapi.StopContainerResponse{}, nil
}

// RemoveContainer forgets a container.
func (s *Server) RemoveContainer(_ context.Context, r *runtimeapi.RemoveContainerRequest) (*runtimeapi.RemoveContainerResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.containers, r.ContainerId)
	return &runtimeapi.RemoveContainerResponse{}, nil
}

func (c *container) listed() *runtimeapi.Container {
	return &runtimeapi.Container{Id: c.id, PodSandboxId: c.sandboxID, Metadata: c.config.Metadata, Image: c.config.Image,
		ImageRef: "sha256:" + strings.Repeat("0", 64), State: c.state, CreatedAt: c.created.UnixNano(),
		Labels: c.config.Labels, Annotations: c.config.Annotations}
}

// ListContainers lists the containers the filter selects.
func (s *Server) ListContainers(_ context.Context, r *runtimeapi.ListContainersRequest) (*runtimeapi.ListContainersResponse, error) {
	f := r.GetFilter()
	s.mu.Lock()
	defer s.mu.Unlock()
	out := []*runtimeapi.Container{}
	for _, c := range s.containers {
		if f.GetId() != "" && f.GetId() != c.id || f.GetPodSandboxId() != "" && f.GetPodSandboxId() != c.sandboxID ||
			f.GetState() != nil && f.GetState().State != c.state || !matchLabels(c.config.Labels, f.GetLabelSelector()) {
			continue
		}
		out = append(out, c.listed())
	}
	return &runtimeapi.ListContainersResponse{Containers: out}, nil
}

func nanos(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

// ContainerStatus reports one container.
func (s *Server) ContainerStatus(_ context.Context, r *runtimeapi.ContainerStatusRequest) (*runtimeapi.ContainerStatusResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.containers[r.ContainerId]
	if !ok {
		return nil, notFound("container", r.ContainerId)
	}
	return &runtimeapi.ContainerStatusResponse{Status: &runtimeapi.ContainerStatus{
		Id: c.id, Metadata: c.config.Metadata, State: c.state, CreatedAt: nanos(c.created), StartedAt: nanos(c.started),
		FinishedAt: nanos(c.finished), ExitCode: c.exitCode, Reason: c.reason, Image: c.config.Image,
		ImageRef: "sha256:" + strings.Repeat("0", 64), Labels: c.config.Labels, Annotations: c.config.Annotations, LogPath: c.logPath,
	}}, nil
}

// ListContainerStats makes up figures from each container's age: CPU
// grows by 1 ms per second running, memory is 4 MiB, the writable layer
// 64 KiB.
func (s *Server) ListContainerStats(_ context.Context, r *runtimeapi.ListContainerStatsRequest) (*runtimeapi.ListContainerStatsResponse, error) {
	f := r.GetFilter()
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	out := []*runtimeapi.ContainerStats{}
	for _, c := range s.containers {
		if f.GetId() != "" && f.GetId() != c.id || f.GetPodSandboxId() != "" && f.GetPodSandboxId() != c.sandboxID || !matchLabels(c.config.Labels, f.GetLabelSelector()) {
			continue
		}
		var cpu uint64
		if !c.started.IsZero() {
			end := now
			if !c.finished.IsZero() {
				end = c.finished
			}
			cpu = uint64(end.Sub(c.started) / 1000) // 1 ms per second
		}
		out = append(out, &runtimeapi.ContainerStats{
			Attributes:    &runtimeapi.ContainerAttributes{Id: c.id, Metadata: c.config.Metadata, Labels: c.config.Labels, Annotations: c.config.Annotations},
			Cpu:           &runtimeapi.CpuUsage{Timestamp: now.UnixNano(), UsageCoreNanoSeconds: &runtimeapi.UInt64Value{Value: cpu}},
			Memory:        &runtimeapi.MemoryUsage{Timestamp: now.UnixNano(), WorkingSetBytes: &runtimeapi.UInt64Value{Value: 4 << 20}},
			WritableLayer: &runtimeapi.FilesystemUsage{Timestamp: now.UnixNano(), FsId: &runtimeapi.FilesystemIdentifier{Mountpoint: "/fake"}, UsedBytes: &runtimeapi.UInt64Value{Value: 64 << 10}},
		})
	}
	return &runtimeapi.ListContainerStatsResponse{Stats: out}, nil
}

// ExecSync runs nothing and says it exited 0.
func (s *Server) ExecSync(_ context.Context, r *runtimeapi.ExecSyncRequest) (*runtimeapi.ExecSyncResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.containers[r.ContainerId]
	if !ok {
		return nil, notFound("container", r.ContainerId)
	}
	if c.state != runtimeapi.ContainerState_CONTAINER_RUNNING {
		return nil, status.Errorf(codes.FailedPrecondition, "container %q is not running", c.id)
	}
	return &runtimeapi.ExecSyncResponse{}, nil
}

// ReopenContainerLog does nothing (the log file is never written).
func (s *Server) ReopenContainerLog(context.Context, *runtimeapi.ReopenContainerLogRequest) (*runtimeapi.ReopenContainerLogResponse, error) {
	return &runtimeapi.ReopenContainerLogResponse{}, nil
}

const fakeImageID = "sha256:0000000000000000000000000000000000000000000000000000000000000000"

func image(ref string) *runtimeapi.Image {
	return &runtimeapi.Image{Id: fakeImageID, RepoTags: []string{ref}, Size: 1 << 20, Spec: &runtimeapi.ImageSpec{Image: ref}}
}

// ImageStatus says every image is present.
func (s *Server) ImageStatus(_ context.Context, r *runtimeapi.ImageStatusRequest) (*runtimeapi.ImageStatusResponse, error) {
	ref := r.GetImage().GetImage()
	if ref == "" {
		return nil, status.Error(codes.InvalidArgument, "no image")
	}
	return &runtimeapi.ImageStatusResponse{Image: image(ref)}, nil
}

// PullImage pulls nothing.
func (s *Server) PullImage(_ context.Context, r *runtimeapi.PullImageRequest) (*runtimeapi.PullImageResponse, error) {
	if r.GetImage().GetImage() == "" {
		return nil, status.Error(codes.InvalidArgument, "no image")
	}
	return &runtimeapi.PullImageResponse{ImageRef: fakeImageID}, nil
}

// ListImages lists the one image every container uses.
func (s *Server) ListImages(context.Context, *runtimeapi.ListImagesRequest) (*runtimeapi.ListImagesResponse, error) {
	return &runtimeapi.ListImagesResponse{Images: []*runtimeapi.Image{image("fake/image:1")}}, nil
}

// RemoveImage removes nothing.
func (s *Server) RemoveImage(context.Context, *runtimeapi.RemoveImageRequest) (*runtimeapi.RemoveImageResponse, error) {
	return &runtimeapi.RemoveImageResponse{}, nil
}

// ImageFsInfo reports a small, mostly empty image filesystem.
func (s *Server) ImageFsInfo(context.Context, *runtimeapi.ImageFsInfoRequest) (*runtimeapi.ImageFsInfoResponse, error) {
	now := time.Now().UnixNano()
	return &runtimeapi.ImageFsInfoResponse{ImageFilesystems: []*runtimeapi.FilesystemUsage{{
		Timestamp: now, FsId: &runtimeapi.FilesystemIdentifier{Mountpoint: "/fake"},
		UsedBytes: &runtimeapi.UInt64Value{Value: 1 << 20}, InodesUsed: &runtimeapi.UInt64Value{Value: 10},
	}}}, nil
}
