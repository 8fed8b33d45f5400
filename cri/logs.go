package cri

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strconv"
	"time"

	"github.com/mqlet/mqlet/cri/crilog"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// ErrNoContainer is returned (wrapped) when a pod has no such container, or
// no attempt of it in the state asked for (no running one for exec, no
// terminated one for previous logs).
var ErrNoContainer = errors.New("container not found")

// PodKey names a pod in the runtime by its identity.
type PodKey struct {
	UID, Name, Namespace string
}

// LogRequest selects what of one container's log is read.
type LogRequest struct {
	Pod       PodKey
	Container string
	// Previous reads the last terminated attempt instead of the newest.
	Previous   bool
	TailLines  *int64 // nil: all lines
	LimitBytes *int64 // nil: no limit
	Since      time.Time
	Timestamps bool
	// Follow keeps reading new lines until ctx ends or the container stops.
	Follow bool
}

// ContainerLogs writes the lines of one container's log (stdout and stderr
// alike, in file order) to out. The file is found from the container's
// checked labels (<podLogDir>/<container>/<restartCount>.log), never from a
// path in the request.
func (m *Manager) ContainerLogs(ctx context.Context, r LogRequest, out io.Writer) error {
	if err := checkLabelName("container", r.Container); err != nil {
		return fmt.Errorf("logs of pod %s/%s: %w", r.Pod.Namespace, r.Pod.Name, err)
	}
	svc, err := m.conn.await(ctx, m.cfg.ConnectTimeout)
	if err != nil {
		return err
	}
	c, err := m.attempt(ctx, r.Pod, r.Container, r.Previous)
	if err != nil {
		return err
	}
	dir, err := m.podLogDir(r.Pod.Namespace, r.Pod.Name, r.Pod.UID)
	if err != nil {
		return fmt.Errorf("logs of pod %s/%s: %w", r.Pod.Namespace, r.Pod.Name, err)
	}
	path := filepath.Join(dir, r.Container, strconv.Itoa(c.RestartCount)+".log")
	opts := crilog.Options{TailLines: r.TailLines, LimitBytes: r.LimitBytes, Since: r.Since, Timestamps: r.Timestamps,
		Follow: r.Follow && c.State == ContainerRunning}
	if err := crilog.Read(quietContext(ctx), path, opts, stillRunning(svc.runtime, c.ID), out, out); err != nil {
		// The runtime may answer DeadlineExceeded for a status call a few
		// milliseconds before ctx's own timer marks ctx done (the deadline
		// travels with the call): that is the end of the follow, not a
		// failure, once ctx says so.
		if dl, ok := ctx.Deadline(); ok && ctx.Err() == nil && status.Code(err) == codes.DeadlineExceeded && time.Until(dl) < time.Second {
			wait := time.NewTimer(time.Until(dl) + time.Second)
			select {
			case <-ctx.Done():
			case <-wait.C:
			}
			wait.Stop()
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("read log of container %s of pod %s/%s: %w", r.Container, r.Pod.Namespace, r.Pod.Name, err)
	}
	return nil
}

// attempt is the newest attempt of the named container (init or app), or
// with previous the newest one that has terminated before the newest.
func (m *Manager) attempt(ctx context.Context, pod PodKey, container string, previous bool) (*ContainerStatus, error) {
	status, err := m.GetPodStatus(ctx, pod.UID, pod.Name, pod.Namespace)
	if err != nil {
		return nil, err
	}
	var seen []*ContainerStatus
	for i := range status.Containers { // newest first
		if status.Containers[i].Name == container {
			seen = append(seen, &status.Containers[i])
		}
	}
	switch {
	case len(seen) == 0:
		return nil, fmt.Errorf("%w: container %q in pod %s/%s has not been created", ErrNoContainer, container, pod.Namespace, pod.Name)
	case !previous:
		return seen[0], nil
	}
	for _, c := range seen[1:] {
		if c.State == ContainerExited {
			return c, nil
		}
	}
	return nil, fmt.Errorf("%w: previous terminated container %q in pod %s/%s not found", ErrNoContainer, container, pod.Namespace, pod.Name)
}

// stillRunning asks the runtime, through the instrumented client, whether
// the followed container still runs. A runtime that is unavailable for a
// moment is taken to still run it (containers outlive their runtime's
// restarts); any other error ends the follow.
func stillRunning(rt runtimeClient, id string) crilog.Running {
	return func(ctx context.Context) (bool, error) {
		resp, err := rt.ContainerStatus(ctx, id, false)
		switch {
		case status.Code(err) == codes.Unavailable:
			return true, nil
		case err != nil:
			return false, err
		case resp.GetStatus() == nil:
			return false, fmt.Errorf("container %s: the runtime returned no status", id)
		}
		return resp.GetStatus().State == runtimeapi.ContainerState_CONTAINER_RUNNING, nil
	}
}
