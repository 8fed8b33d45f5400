package prober

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	v1 "k8s.io/api/core/v1"
	"k8s.io/kubernetes/pkg/probe"
	httpprobe "k8s.io/kubernetes/pkg/probe/http"
	"k8s.io/kubernetes/third_party/forked/golang/expansion"

	"github.com/mqlet/mqlet/cri"
)

// checkFunc runs one check of a worker's probe (swapped in unit tests).
type checkFunc func(ctx context.Context, w *worker) (probe.Result, string, error)

// The kubelet's HTTP prober; it holds no state of one probe. Redirects
// are followed only to the same host, as in the kubelet.
var httpProber = httpprobe.New(false)

// tcpCheck is pkg/probe/tcp's check with a context: the library's takes
// none, and a dial to an address that never answers would hold the worker
// (and the agent's shutdown) for the whole timeout.
func tcpCheck(ctx context.Context, addr string, timeout time.Duration) (probe.Result, string, error) {
	d := probe.ProbeDialer()
	d.Timeout = timeout
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return probe.Failure, err.Error(), nil
	}
	if err := conn.Close(); err != nil {
		return probe.Failure, err.Error(), nil
	}
	return probe.Success, "", nil
}

// grpcCheck asks the standard health service (grpc.health.v1.Health/Check)
// as pkg/probe/grpc does, within ctx (the library's takes none): SERVING
// passes, any other answer or error fails.
func grpcCheck(ctx context.Context, addr, service string, useTLS bool, timeout time.Duration) (probe.Result, string, error) {
	creds := insecure.NewCredentials()
	if useTLS {
		creds = credentials.NewTLS(&tls.Config{InsecureSkipVerify: true})
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(creds),
		grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) {
			return probe.ProbeDialer().DialContext(ctx, "tcp", a)
		}))
	if err != nil {
		return probe.Failure, fmt.Sprintf("error: failed to connect service at %q: %v", addr, err), nil
	}
	defer func() { _ = conn.Close() }()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: service})
	if err != nil {
		if status.Code(err) == codes.Unimplemented {
			return probe.Failure, "error: this server does not implement the grpc health protocol (grpc.health.v1.Health)", nil
		}
		return probe.Failure, fmt.Sprintf("error: health rpc to %q failed: %v", addr, err), nil
	}
	if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		return probe.Failure, fmt.Sprintf("service unhealthy (responded with %q)", resp.GetStatus()), nil
	}
	return probe.Success, "", nil
}

// runHandler runs the probe's handler against the worker's container.
func (m *Manager) runHandler(ctx context.Context, w *worker) (probe.Result, string, error) {
	timeout := seconds(w.spec.TimeoutSeconds, defaultTimeout)
	h := &w.spec.ProbeHandler
	switch {
	case h.Exec != nil:
		return m.execCheck(ctx, w, h.Exec, timeout)
	case h.HTTPGet != nil:
		if h.HTTPGet.Host == "" && w.podIP == "" {
			return probe.Unknown, "", errors.New("the pod has no IP address yet")
		}
		// The request (URL, headers, user agent) depends only on the
		// worker's container and pod IP: it is built once, each check
		// sends it with its own context.
		if w.httpReq == nil {
			req, err := httpprobe.NewRequestForHTTPGetAction(h.HTTPGet, w.container, w.podIP, "probe")
			if err != nil {
				return probe.Unknown, "", fmt.Errorf("building the HTTP request: %w", err)
			}
			w.httpReq = req
		}
		req := w.httpReq.WithContext(ctx)
		if pr := h.HTTPGet.Protocol; pr != nil && *pr == v1.HTTPProtocolHTTP2 {
			return httpProber.ProbeH2C(req, timeout) // cleartext HTTP/2 with prior knowledge
		}
		if req.URL.Scheme == "http" {
			return httpCheck(req, timeout)
		}
		return httpProber.Probe(req, timeout)
	case h.TCPSocket != nil:
		host := h.TCPSocket.Host
		if host == "" {
			host = w.podIP
		}
		if host == "" {
			return probe.Unknown, "", errors.New("the pod has no IP address yet")
		}
		port, err := probe.ResolveContainerPort(h.TCPSocket.Port, w.container)
		if err != nil {
			return probe.Unknown, "", err
		}
		return tcpCheck(ctx, net.JoinHostPort(host, strconv.Itoa(port)), timeout)
	case h.GRPC != nil:
		if w.podIP == "" {
			return probe.Unknown, "", errors.New("the pod has no IP address yet")
		}
		service := ""
		if h.GRPC.Service != nil {
			service = *h.GRPC.Service
		}
		tls := h.GRPC.Mode != nil && *h.GRPC.Mode == v1.GRPCProbeModeTLS // unverified, as in the kubelet
		return grpcCheck(ctx, net.JoinHostPort(w.podIP, strconv.Itoa(int(h.GRPC.Port))), service, tls, timeout)
	default:
		return probe.Unknown, "", errors.New("the probe has no handler")
	}
}

// execCheck runs the command in the container through the runtime: exit 0
// passes, any other code fails, and so does a command that outlives the
// timeout. Like the kubelet, $(VAR) expands the container's literal env.
func (m *Manager) execCheck(ctx context.Context, w *worker, e *v1.ExecAction, timeout time.Duration) (probe.Result, string, error) {
	if m.opts.Exec == nil {
		return probe.Unknown, "", errors.New("exec probes are not available")
	}
	if w.execCmd == nil {
		w.execCmd = expandCommand(e.Command, w.container.Env)
	}
	cmd := w.execCmd
	begin := m.clock.Now()
	stdout, stderr, code, err := m.opts.Exec.ExecSync(ctx, w.containerID, cmd, timeout)
	if err != nil {
		// containerd reports a timed-out exec as a plain error; what
		// outlived the timeout timed out.
		if errors.Is(err, cri.ErrExecTimedOut) || m.clock.Since(begin) >= timeout {
			return probe.Failure, fmt.Sprintf("command %q timed out after %s", strings.Join(cmd, " "), timeout), nil
		}
		return probe.Unknown, "", err
	}
	out := string(stdout) + string(stderr)
	if code != 0 {
		if out == "" {
			out = fmt.Sprintf("command %q exited with %d", strings.Join(cmd, " "), code)
		}
		return probe.Failure, out, nil
	}
	return probe.Success, out, nil
}

// expandCommand expands $(VAR) in each argument with the container's
// literal env, as the kubelet does for exec probes (once per worker: the
// spec and env of a worker's container do not change).
func expandCommand(command []string, envVars []v1.EnvVar) []string {
	env := map[string]string{}
	for _, v := range envVars {
		if v.ValueFrom == nil {
			env[v.Name] = v.Value
		}
	}
	mapping := expansion.MappingFuncFor(env)
	cmd := make([]string, len(command))
	for i, arg := range command {
		cmd[i] = expansion.Expand(arg, mapping)
	}
	return cmd
}
