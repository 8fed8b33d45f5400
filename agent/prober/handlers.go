package prober

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/kubernetes/pkg/probe"
	grpcprobe "k8s.io/kubernetes/pkg/probe/grpc"
	httpprobe "k8s.io/kubernetes/pkg/probe/http"
	tcpprobe "k8s.io/kubernetes/pkg/probe/tcp"
	"k8s.io/kubernetes/third_party/forked/golang/expansion"

	"github.com/mqlet/mqlet/cri"
)

// checkFunc runs one check of a worker's probe (swapped in unit tests).
type checkFunc func(ctx context.Context, w *worker) (probe.Result, string, error)

// The kubelet's probers; each holds no state of one probe. Redirects are
// followed only to the same host, as in the kubelet.
var (
	httpProber = httpprobe.New(false)
	tcpProber  = tcpprobe.New()
	grpcProber = grpcprobe.New()
)

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
		req, err := httpprobe.NewRequestForHTTPGetAction(h.HTTPGet, w.container, w.podIP, "probe")
		if err != nil {
			return probe.Unknown, "", fmt.Errorf("building the HTTP request: %w", err)
		}
		req = req.WithContext(ctx)
		if pr := h.HTTPGet.Protocol; pr != nil && *pr == v1.HTTPProtocolHTTP2 {
			return httpProber.ProbeH2C(req, timeout) // cleartext HTTP/2 with prior knowledge
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
		return tcpProber.Probe(host, port, timeout)
	case h.GRPC != nil:
		if w.podIP == "" {
			return probe.Unknown, "", errors.New("the pod has no IP address yet")
		}
		service := ""
		if h.GRPC.Service != nil {
			service = *h.GRPC.Service
		}
		tls := h.GRPC.Mode != nil && *h.GRPC.Mode == v1.GRPCProbeModeTLS // unverified, as in the kubelet
		return grpcProber.Probe(w.podIP, service, int(h.GRPC.Port), timeout, grpcprobe.ProbeOptions{UseTLS: tls})
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
	env := map[string]string{}
	for _, v := range w.container.Env {
		if v.ValueFrom == nil {
			env[v.Name] = v.Value
		}
	}
	mapping := expansion.MappingFuncFor(env)
	cmd := make([]string, len(e.Command))
	for i, arg := range e.Command {
		cmd[i] = expansion.Expand(arg, mapping)
	}
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
