package cri

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	utilexec "k8s.io/utils/exec"
)

// The CRI client: cri-api's generated gRPC clients for the runtime and the
// image service over one connection, with what the kubelet's client
// (k8s.io/cri-client) adds around each call that mqlet relies on: a
// deadline per call, the checks of the required fields of an answer, an
// ExecSync whose timeout is ErrCommandTimedOut and whose non-zero exit is
// a utilexec.CodeExitError. k8s.io/cri-client itself is not linked: its
// package imports OpenTelemetry and otelgrpc (tracing mqlet never sets up),
// about 0.4 MiB of the binary and their inits at every start.

// maxCRIMessage bounds one answer from the runtime (the kubelet's 16 MiB;
// gRPC's default of 4 MiB is too small for a list of many containers).
const maxCRIMessage = 16 << 20

// errCommandTimedOut is what ExecSync returns (wrapped) when the runtime
// answers DeadlineExceeded: the command outlived its timeout.
var errCommandTimedOut = errors.New("command timed out")

// criConn is one gRPC connection shared by the runtime and image clients;
// closing either closes it once.
type criConn struct {
	conn      *grpc.ClientConn
	timeout   time.Duration
	closeOnce sync.Once
	closeErr  error
}

func (c *criConn) Close(context.Context) error {
	c.closeOnce.Do(func() { c.closeErr = c.conn.Close() })
	return c.closeErr
}

// criSocket is the unix socket path of endpoint: unix:///path or a bare
// path (taken as unix, as the kubelet does). Other schemes are refused:
// CRI runtimes listen on unix sockets.
func criSocket(endpoint string) (string, error) {
	u, err := url.Parse(endpoint)
	if err == nil && u.Scheme == "" {
		u, err = url.Parse("unix://" + endpoint)
	}
	if err != nil {
		return "", fmt.Errorf("CRI endpoint %q: %w", endpoint, err)
	}
	if u.Scheme != "unix" || u.Path == "" {
		return "", fmt.Errorf("CRI endpoint %q: only a unix socket endpoint is supported", endpoint)
	}
	return u.Path, nil
}

// dialRemote connects to the runtime at endpoint and checks that both the
// runtime service (Version) and the image service (ImageFsInfo) answer
// CRI v1 within ctx. timeout is the deadline of each later call. On any
// failure the connection is closed: nothing outlives a failed dial.
func dialRemote(ctx context.Context, endpoint string, timeout time.Duration) (*remoteRuntime, *remoteImage, error) {
	if timeout <= 0 {
		return nil, nil, errors.New("CRI request timeout must be positive")
	}
	path, err := criSocket(endpoint)
	if err != nil {
		return nil, nil, err
	}
	bo := backoff.DefaultConfig
	bo.BaseDelay = 100 * time.Millisecond
	bo.MaxDelay = 3 * time.Second
	conn, err := grpc.NewClient("passthrough:///"+path,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithAuthority("localhost"),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", addr)
		}),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxCRIMessage)),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: bo, MinConnectTimeout: 5 * time.Second}),
	)
	if err != nil {
		return nil, nil, fmt.Errorf("CRI endpoint %s: %w", endpoint, err)
	}
	cc := &criConn{conn: conn, timeout: timeout}
	rt := &remoteRuntime{criConn: cc, c: runtimeapi.NewRuntimeServiceClient(conn)}
	img := &remoteImage{criConn: cc, c: runtimeapi.NewImageServiceClient(conn)}
	if _, err := rt.c.Version(ctx, &runtimeapi.VersionRequest{}); err != nil {
		_ = cc.Close(ctx)
		return nil, nil, fmt.Errorf("validate CRI v1 runtime API for endpoint %q: %w", endpoint, err)
	}
	if _, err := img.c.ImageFsInfo(ctx, &runtimeapi.ImageFsInfoRequest{}); err != nil {
		_ = cc.Close(ctx)
		return nil, nil, fmt.Errorf("validate CRI v1 image API for endpoint %q: %w", endpoint, err)
	}
	return rt, img, nil
}

// remoteRuntime is the runtime service (runtimeClient).
type remoteRuntime struct {
	*criConn
	c runtimeapi.RuntimeServiceClient
}

func (r *remoteRuntime) call(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, r.timeout)
}

func (r *remoteRuntime) Version(ctx context.Context, apiVersion string) (*runtimeapi.VersionResponse, error) {
	ctx, cancel := r.call(ctx)
	defer cancel()
	v, err := r.c.Version(ctx, &runtimeapi.VersionRequest{Version: apiVersion})
	if err != nil {
		return nil, err
	}
	var missing []string
	for _, f := range []struct{ name, v string }{
		{"Version", v.Version}, {"RuntimeName", v.RuntimeName},
		{"RuntimeApiVersion", v.RuntimeApiVersion}, {"RuntimeVersion", v.RuntimeVersion},
	} {
		if f.v == "" {
			missing = append(missing, f.name)
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("not all fields are set in VersionResponse (missing %s)", strings.Join(missing, ", "))
	}
	return v, nil
}

func (r *remoteRuntime) Status(ctx context.Context, verbose bool) (*runtimeapi.StatusResponse, error) {
	ctx, cancel := r.call(ctx)
	defer cancel()
	resp, err := r.c.Status(ctx, &runtimeapi.StatusRequest{Verbose: verbose})
	if err != nil {
		return nil, err
	}
	if resp.Status == nil || len(resp.Status.Conditions) < 2 {
		return nil, errors.New("RuntimeReady or NetworkReady condition are not set")
	}
	return resp, nil
}

func (r *remoteRuntime) RunPodSandbox(ctx context.Context, config *runtimeapi.PodSandboxConfig, runtimeHandler string) (string, error) {
	// A sandbox gets twice the deadline (network setup), as the kubelet gives it.
	ctx, cancel := context.WithTimeout(ctx, 2*r.timeout)
	defer cancel()
	resp, err := r.c.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: config, RuntimeHandler: runtimeHandler})
	if err != nil {
		return "", err
	}
	if resp.PodSandboxId == "" {
		return "", fmt.Errorf("PodSandboxId is not set for sandbox %q", config.GetMetadata())
	}
	return resp.PodSandboxId, nil
}

func (r *remoteRuntime) StopPodSandbox(ctx context.Context, id string) error {
	ctx, cancel := r.call(ctx)
	defer cancel()
	_, err := r.c.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: id})
	return err
}

func (r *remoteRuntime) RemovePodSandbox(ctx context.Context, id string) error {
	ctx, cancel := r.call(ctx)
	defer cancel()
	_, err := r.c.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: id})
	return err
}

func (r *remoteRuntime) PodSandboxStatus(ctx context.Context, id string, verbose bool) (*runtimeapi.PodSandboxStatusResponse, error) {
	ctx, cancel := r.call(ctx)
	defer cancel()
	resp, err := r.c.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: id, Verbose: verbose})
	if err != nil {
		return nil, err
	}
	if s := resp.Status; s != nil {
		switch {
		case s.Id == "":
			return nil, errors.New("status.Id is not set")
		case s.Metadata == nil:
			return nil, errors.New("status.Metadata is not set")
		case s.Metadata.Name == "" || s.Metadata.Namespace == "" || s.Metadata.Uid == "":
			return nil, fmt.Errorf("metadata.Name, metadata.Namespace or metadata.Uid is not in metadata %q", s.Metadata)
		case s.CreatedAt == 0:
			return nil, errors.New("status.CreatedAt is not set")
		}
	}
	return resp, nil
}

func (r *remoteRuntime) ListPodSandbox(ctx context.Context, filter *runtimeapi.PodSandboxFilter) ([]*runtimeapi.PodSandbox, error) {
	ctx, cancel := r.call(ctx)
	defer cancel()
	resp, err := r.c.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{Filter: filter})
	if err != nil {
		return nil, err
	}
	return resp.Items, nil
}

func (r *remoteRuntime) CreateContainer(ctx context.Context, sandboxID string, config *runtimeapi.ContainerConfig, sandboxConfig *runtimeapi.PodSandboxConfig) (string, error) {
	ctx, cancel := r.call(ctx)
	defer cancel()
	resp, err := r.c.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: sandboxID, Config: config, SandboxConfig: sandboxConfig})
	if err != nil {
		return "", err
	}
	if resp.ContainerId == "" {
		return "", fmt.Errorf("ContainerId is not set for container %q", config.GetMetadata())
	}
	return resp.ContainerId, nil
}

func (r *remoteRuntime) StartContainer(ctx context.Context, id string) error {
	ctx, cancel := r.call(ctx)
	defer cancel()
	_, err := r.c.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: id})
	return err
}

func (r *remoteRuntime) StopContainer(ctx context.Context, id string, timeout int64) error {
	// The grace period plus the call's own deadline, for the kill after it.
	ctx, cancel := context.WithTimeout(ctx, r.timeout+time.Duration(timeout)*time.Second)
	defer cancel()
	_, err := r.c.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: id, Timeout: timeout})
	return err
}

func (r *remoteRuntime) RemoveContainer(ctx context.Context, id string) error {
	ctx, cancel := r.call(ctx)
	defer cancel()
	_, err := r.c.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: id})
	return err
}

func (r *remoteRuntime) ListContainers(ctx context.Context, filter *runtimeapi.ContainerFilter) ([]*runtimeapi.Container, error) {
	ctx, cancel := r.call(ctx)
	defer cancel()
	resp, err := r.c.ListContainers(ctx, &runtimeapi.ListContainersRequest{Filter: filter})
	if err != nil {
		return nil, err
	}
	return resp.Containers, nil
}

func (r *remoteRuntime) ContainerStatus(ctx context.Context, id string, verbose bool) (*runtimeapi.ContainerStatusResponse, error) {
	ctx, cancel := r.call(ctx)
	defer cancel()
	resp, err := r.c.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id, Verbose: verbose})
	if err != nil {
		return nil, err
	}
	if s := resp.Status; s != nil {
		switch {
		case s.Id == "":
			return nil, errors.New("status.Id is not set")
		case s.Metadata == nil:
			return nil, errors.New("status.Metadata is not set")
		case s.Metadata.Name == "":
			return nil, fmt.Errorf("metadata.Name is not in metadata %q", s.Metadata)
		case s.CreatedAt == 0:
			return nil, errors.New("status.CreatedAt is not set")
		case s.Image == nil || s.Image.Image == "":
			return nil, errors.New("status.Image is not set")
		case s.ImageRef == "":
			return nil, errors.New("status.ImageRef is not set")
		}
	}
	return resp, nil
}

// ExecSync runs cmd and waits for it: the runtime enforces timeout (0: none),
// the call's deadline is timeout plus the request timeout. A command that
// exits non-zero is a utilexec.CodeExitError; one the runtime timed out
// wraps errCommandTimedOut.
func (r *remoteRuntime) ExecSync(ctx context.Context, id string, cmd []string, timeout time.Duration) ([]byte, []byte, error) {
	var cancel context.CancelFunc
	if timeout != 0 {
		ctx, cancel = context.WithTimeout(ctx, r.timeout+timeout)
	} else {
		ctx, cancel = context.WithCancel(ctx)
	}
	defer cancel()
	resp, err := r.c.ExecSync(ctx, &runtimeapi.ExecSyncRequest{ContainerId: id, Cmd: cmd, Timeout: int64(timeout.Seconds())})
	if err != nil {
		if status.Code(err) == codes.DeadlineExceeded {
			return nil, nil, fmt.Errorf("%w: %q timed out after %s", errCommandTimedOut, strings.Join(cmd, " "), timeout)
		}
		return nil, nil, err
	}
	if resp.ExitCode != 0 {
		return resp.Stdout, resp.Stderr, utilexec.CodeExitError{
			Err:  fmt.Errorf("command '%s' exited with %d: %s", strings.Join(cmd, " "), resp.ExitCode, resp.Stderr),
			Code: int(resp.ExitCode),
		}
	}
	return resp.Stdout, resp.Stderr, nil
}

// Exec asks the runtime for a streaming URL for an interactive exec.
func (r *remoteRuntime) Exec(ctx context.Context, req *runtimeapi.ExecRequest) (*runtimeapi.ExecResponse, error) {
	ctx, cancel := r.call(ctx)
	defer cancel()
	resp, err := r.c.Exec(ctx, req)
	if err != nil {
		return nil, err
	}
	if resp.Url == "" {
		return nil, errors.New("URL is not set")
	}
	return resp, nil
}

func (r *remoteRuntime) ReopenContainerLog(ctx context.Context, id string) error {
	ctx, cancel := r.call(ctx)
	defer cancel()
	_, err := r.c.ReopenContainerLog(ctx, &runtimeapi.ReopenContainerLogRequest{ContainerId: id})
	return err
}

func (r *remoteRuntime) ListContainerStats(ctx context.Context, filter *runtimeapi.ContainerStatsFilter) ([]*runtimeapi.ContainerStats, error) {
	ctx, cancel := r.call(ctx)
	defer cancel()
	resp, err := r.c.ListContainerStats(ctx, &runtimeapi.ListContainerStatsRequest{Filter: filter})
	if err != nil {
		return nil, err
	}
	return resp.GetStats(), nil
}

// GetContainerEvents streams the runtime's container events into ch until
// the stream or ctx ends (no deadline: it is meant to last). established
// is called once the stream is open.
func (r *remoteRuntime) GetContainerEvents(ctx context.Context, ch chan *runtimeapi.ContainerEventResponse, established func(runtimeapi.RuntimeService_GetContainerEventsClient)) error {
	stream, err := r.c.GetContainerEvents(ctx, &runtimeapi.GetEventsRequest{})
	if err != nil {
		return err
	}
	if established != nil {
		established(stream)
	}
	for {
		ev, err := stream.Recv()
		if err != nil {
			return err
		}
		if ev != nil {
			ch <- ev
		}
	}
}

// remoteImage is the image service (imageClient).
type remoteImage struct {
	*criConn
	c runtimeapi.ImageServiceClient
}

func (r *remoteImage) ListImages(ctx context.Context, filter *runtimeapi.ImageFilter) ([]*runtimeapi.Image, error) {
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	resp, err := r.c.ListImages(ctx, &runtimeapi.ListImagesRequest{Filter: filter})
	if err != nil {
		return nil, err
	}
	return resp.Images, nil
}

func (r *remoteImage) ImageStatus(ctx context.Context, image *runtimeapi.ImageSpec, verbose bool) (*runtimeapi.ImageStatusResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	resp, err := r.c.ImageStatus(ctx, &runtimeapi.ImageStatusRequest{Image: image, Verbose: verbose})
	if err != nil {
		return nil, err
	}
	if resp.Image != nil && (resp.Image.Id == "" || resp.Image.Size == 0) {
		return nil, fmt.Errorf("Id or size of image %q is not set", image.GetImage())
	}
	return resp, nil
}

// PullImage has no deadline of its own: a pull takes what it takes, and
// the caller's context bounds it.
func (r *remoteImage) PullImage(ctx context.Context, image *runtimeapi.ImageSpec, auth *runtimeapi.AuthConfig, sandbox *runtimeapi.PodSandboxConfig) (string, error) {
	resp, err := r.c.PullImage(ctx, &runtimeapi.PullImageRequest{Image: image, Auth: auth, SandboxConfig: sandbox})
	if err != nil {
		// An Unknown status carries the runtime's message and nothing more:
		// the message alone reads better in events.
		if st, ok := status.FromError(err); ok && st.Code() == codes.Unknown {
			return "", errors.New(st.Message())
		}
		return "", err
	}
	if resp.ImageRef == "" {
		return "", fmt.Errorf("imageRef of image %q is not set", image.GetImage())
	}
	return resp.ImageRef, nil
}

func (r *remoteImage) RemoveImage(ctx context.Context, image *runtimeapi.ImageSpec) error {
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	_, err := r.c.RemoveImage(ctx, &runtimeapi.RemoveImageRequest{Image: image})
	return err
}

func (r *remoteImage) ImageFsInfo(ctx context.Context) (*runtimeapi.ImageFsInfoResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	return r.c.ImageFsInfo(ctx, &runtimeapi.ImageFsInfoRequest{})
}
