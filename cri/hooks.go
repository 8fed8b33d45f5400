package cri

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/kubernetes/pkg/probe"
	utilexec "k8s.io/utils/exec"
)

// AnnotationPreStop keeps a container's preStop handler (JSON, its named
// port resolved) on the container, so a pod killed without its spec (a
// delete, or after mqlet restarted) still runs it. The kubelet's key.
const AnnotationPreStop = "io.kubernetes.container.preStopHandler"

// maxPostStart bounds a postStart hook: the kubelet waits for it without
// end, but here it would hold a worker that every pod shares.
const maxPostStart = 2 * time.Minute

// minStopGrace is what a container is left after its preStop hook used
// the grace period up (the kubelet's minimumGracePeriodInSeconds).
const minStopGrace = 2

// preStopAnnotation is the handler to record, or "" when there is none.
func preStopAnnotation(c *v1.Container) (string, error) {
	if c.Lifecycle == nil || c.Lifecycle.PreStop == nil {
		return "", nil
	}
	h := c.Lifecycle.PreStop.DeepCopy()
	if h.HTTPGet != nil && h.HTTPGet.Port.Type == intstr.String {
		port, err := probe.ResolveContainerPort(h.HTTPGet.Port, c)
		if err != nil {
			return "", fmt.Errorf("preStop httpGet port: %w", err)
		}
		h.HTTPGet.Port = intstr.FromInt32(int32(port))
	}
	b, err := json.Marshal(h)
	if err != nil {
		return "", fmt.Errorf("encode preStop handler: %w", err)
	}
	return string(b), nil
}

func parsePreStop(s string) *v1.LifecycleHandler {
	if s == "" {
		return nil
	}
	var h v1.LifecycleHandler
	if err := json.Unmarshal([]byte(s), &h); err != nil {
		return nil
	}
	return &h
}

// runHook runs a lifecycle handler against one container until it ends or
// ctx does: exec through CRI ExecSync (a non-zero exit fails), httpGet to
// the pod IP (any answer passes, as in the kubelet), sleep.
func (m *Manager) runHook(ctx context.Context, svc *services, containerID, podIP string, h *v1.LifecycleHandler, c *v1.Container) error {
	switch {
	case h.Exec != nil:
		var timeout time.Duration
		if dl, ok := ctx.Deadline(); ok {
			timeout = max(time.Until(dl), time.Second)
		}
		_, stderr, err := svc.runtime.ExecSync(quietContext(ctx), containerID, h.Exec.Command, timeout)
		var exit utilexec.CodeExitError
		if errors.As(err, &exit) {
			return fmt.Errorf("command %q exited with %d: %s", strings.Join(h.Exec.Command, " "), exit.Code, capBytes(stderr))
		}
		if err != nil {
			return fmt.Errorf("command %q: %w", strings.Join(h.Exec.Command, " "), err)
		}
		return nil
	case h.HTTPGet != nil:
		return hookHTTPGet(ctx, h.HTTPGet, podIP, c)
	case h.Sleep != nil:
		t := time.NewTimer(time.Duration(h.Sleep.Seconds) * time.Second)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return fmt.Errorf("sleep of %ds cut short: %w", h.Sleep.Seconds, ctx.Err())
		case <-t.C:
			return nil
		}
	default:
		return errors.New("the hook has no handler mqlet runs")
	}
}

func hookHTTPGet(ctx context.Context, g *v1.HTTPGetAction, podIP string, c *v1.Container) error {
	host := g.Host
	if host == "" {
		host = podIP
	}
	if host == "" {
		return errors.New("the pod has no IP address")
	}
	var port int
	var err error
	if c != nil {
		port, err = probe.ResolveContainerPort(g.Port, c)
	} else if g.Port.Type == intstr.Int {
		port = g.Port.IntValue()
	} else {
		err = fmt.Errorf("named port %q without the container's spec", g.Port.StrVal)
	}
	if err != nil {
		return err
	}
	scheme := strings.ToLower(string(g.Scheme))
	if scheme == "" {
		scheme = "http"
	}
	u, err := url.Parse(g.Path)
	if err != nil {
		u = &url.URL{Path: g.Path}
	}
	u.Scheme, u.Host = scheme, net.JoinHostPort(host, strconv.Itoa(port))
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return fmt.Errorf("build the hook's request: %w", err)
	}
	for _, hd := range g.HTTPHeaders {
		req.Header.Add(hd.Name, hd.Value)
	}
	client := &http.Client{Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true, DialContext: probe.ProbeDialer().DialContext}}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("http GET %s: %w", u, err)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 10<<10))
	_ = resp.Body.Close()
	return nil
}

// stopWithPreStop stops one running container, running its preStop hook
// first within the grace period; the container then gets what is left of
// it (at least minStopGrace seconds) after SIGTERM. A failed hook is a
// FailedPreStopHook event, and the stop goes on.
func (m *Manager) stopWithPreStop(ctx context.Context, svc *services, pod *v1.Pod, c ContainerStatus, podIP string, grace int64, spec *v1.Container, events EventRecorder) error {
	grace = m.preStop(ctx, svc, pod, c, podIP, grace, spec, events)
	return m.stopContainer(ctx, svc, c.ID, grace)
}

// preStop runs the container's preStop hook, if it has one and runs, and
// returns what is left of grace for the stop (at least minStopGrace).
func (m *Manager) preStop(ctx context.Context, svc *services, pod *v1.Pod, c ContainerStatus, podIP string, grace int64, spec *v1.Container, events EventRecorder) int64 {
	if h := c.PreStop; h != nil && c.State == ContainerRunning {
		begin := time.Now()
		hctx, cancel := context.WithTimeout(ctx, time.Duration(grace)*time.Second)
		err := m.runHook(hctx, svc, c.ID, podIP, h, spec)
		cancel()
		if err != nil {
			msg := fmt.Sprintf("PreStopHook failed: %v", err)
			m.log.Warn().Str("pod", pod.Namespace+"/"+pod.Name).Str("container", c.Name).Msg(msg)
			events.Event(pod, v1.EventTypeWarning, "FailedPreStopHook", "container "+c.Name+": "+msg)
		}
		grace = max(grace-int64(time.Since(begin).Seconds()), minStopGrace)
	}
	return grace
}
