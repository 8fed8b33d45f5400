package cri

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// A container's stdout and stderr go to one log file that the runtime
// writes without bound: a pod printing as fast as it can (54 MB/s measured
// here) fills the node's disk in minutes, and with it mqlet's state. The
// kubelet rotates the files; so does mqlet: a file over the size limit is
// renamed and the runtime asked to reopen it, and only the newest rotated
// files are kept.

// LogRotation is how container log files are bounded.
type LogRotation struct {
	MaxBytes int64 // rotate a file larger than this; 0: never
	MaxFiles int   // files kept per container, the live one included (at least 2)
}

// RotateLogs rotates the log file of every running mqlet container that is
// over the limit.
func (m *Manager) RotateLogs(ctx context.Context, r LogRotation) error {
	if r.MaxBytes <= 0 {
		return nil
	}
	svc, err := m.conn.get()
	if err != nil {
		return err
	}
	qctx := quietContext(ctx)
	containers, err := svc.runtime.ListContainers(qctx, &runtimeapi.ContainerFilter{
		LabelSelector: managedSelector(),
		State:         &runtimeapi.ContainerStateValue{State: runtimeapi.ContainerState_CONTAINER_RUNNING},
	})
	if err != nil {
		return fmt.Errorf("list containers to rotate logs: %w", err)
	}
	var errs []error
	for _, c := range containers {
		path, ok := m.containerLogPath(c)
		if !ok {
			continue
		}
		info, err := os.Lstat(path)
		if err != nil || !info.Mode().IsRegular() || info.Size() <= r.MaxBytes {
			continue
		}
		if err := m.rotateLog(qctx, svc, c.Id, path, max(r.MaxFiles, 2)); err != nil {
			errs = append(errs, fmt.Errorf("rotate log of container %s: %w", c.GetMetadata().GetName(), err))
		}
	}
	return errors.Join(errs...)
}

// containerLogPath is where mqlet told the runtime to write c's log
// (<podLogDir>/<container>/<restartCount>.log), built from checked labels
// only, never from a path the runtime reports.
func (m *Manager) containerLogPath(c *runtimeapi.Container) (string, bool) {
	dir, err := m.podLogDir(c.Labels[LabelPodNamespace], c.Labels[LabelPodName], c.Labels[LabelPodUID])
	if err != nil || checkLabelName("container", c.Labels[LabelContainerName]) != nil {
		return "", false
	}
	restarts, err := strconv.Atoi(c.Annotations[AnnotationRestartCount])
	if err != nil || restarts < 0 {
		return "", false
	}
	return filepath.Join(dir, c.Labels[LabelContainerName], strconv.Itoa(restarts)+".log"), true
}

func (m *Manager) rotateLog(ctx context.Context, svc *services, id, path string, maxFiles int) error {
	rotated := path + "." + time.Now().UTC().Format("20060102-150405.000000000")
	if err := os.Rename(path, rotated); err != nil {
		return err
	}
	if err := svc.runtime.ReopenContainerLog(ctx, id); err != nil {
		// The runtime still writes the renamed file: put it back.
		_ = os.Rename(rotated, path)
		return fmt.Errorf("reopen: %w", err)
	}
	old, err := filepath.Glob(path + ".*")
	if err != nil {
		return err
	}
	slices.Sort(old) // timestamps sort oldest first
	var errs []error
	for len(old) > maxFiles-1 {
		if !strings.HasPrefix(filepath.Base(old[0]), filepath.Base(path)+".") {
			break
		}
		errs = append(errs, os.Remove(old[0]))
		old = old[1:]
	}
	return errors.Join(errs...)
}
