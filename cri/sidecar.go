package cri

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
)

// Sidecars (init containers with restartPolicy Always) are stopped after
// the pod's other containers, the later sidecars first, as the kubelet's
// termination ordering does: each gets SIGTERM once every app container
// and every sidecar after it in the spec has exited, with what is left of
// its grace period (at least minStopGrace). Their preStop hooks run at
// once, beside the app containers' termination. The order is recorded on
// each sidecar (AnnotationSidecar), so a pod killed without its spec (a
// delete) is stopped in the same order.

// AnnotationSidecar marks a sidecar with 1 + its index among the pod's init
// containers.
const AnnotationSidecar = "io.mqlet.container.sidecar"

// maxSidecarOrder bounds the recorded order (validation allows far fewer
// init containers); anything else read back is not a sidecar.
const maxSidecarOrder = 1 << 16

// sidecarOrder is what AnnotationSidecar records for c: 1 + its index
// among the init containers if it is a sidecar, else 0.
func sidecarOrder(pod *v1.Pod, c *v1.Container, init bool) int {
	if !init || !IsSidecar(c) {
		return 0
	}
	for i := range pod.Spec.InitContainers {
		if pod.Spec.InitContainers[i].Name == c.Name {
			return i + 1
		}
	}
	return 0
}

func parseSidecar(v string) int {
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 || n > maxSidecarOrder {
		return 0
	}
	return n
}

// stopOrdered stops the containers cs: the others in parallel at once,
// each sidecar when its turn has come (see above). The turns are waited
// for within ctx.
func (m *Manager) stopOrdered(ctx context.Context, svc *services, pod *v1.Pod, cs []ContainerStatus, podIP string, override *int64, events EventRecorder) error {
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	done := make([]chan struct{}, len(cs))
	for i := range cs {
		done[i] = make(chan struct{})
	}
	// waitFor are the containers whose exit c's stop waits for.
	waitFor := func(c ContainerStatus) []chan struct{} {
		if c.Sidecar == 0 {
			return nil
		}
		var out []chan struct{}
		for j, o := range cs {
			if o.Sidecar == 0 || o.Sidecar > c.Sidecar {
				out = append(out, done[j])
			}
		}
		return out
	}
	begin := time.Now()
	for i, c := range cs {
		grace := containerGrace(pod, c, override)
		after := waitFor(c)
		wg.Add(1)
		go func(i int, c ContainerStatus) {
			defer wg.Done()
			defer close(done[i])
			spec := specOf(pod, c)
			left := m.preStop(ctx, svc, pod, c, podIP, grace, spec, events)
			if len(after) > 0 {
				for _, ch := range after {
					select {
					case <-ch:
					case <-ctx.Done():
					}
				}
				// The wait used up part of the grace period (in whole seconds, as the kubelet counts).
				left = max(grace-int64(time.Since(begin).Seconds()), minStopGrace)
			}
			if err := m.stopContainer(ctx, svc, c.ID, left); err != nil {
				mu.Lock()
				errs = append(errs, fmt.Errorf("stop container %s: %w", c.Name, err))
				mu.Unlock()
			}
		}(i, c)
	}
	wg.Wait()
	return errors.Join(errs...)
}
