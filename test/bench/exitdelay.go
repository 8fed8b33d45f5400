package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	v1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

type exitResult struct {
	Pods int `json:"pods"`
	// Container FinishedAt (CRI, ns) → arrival of the status with phase Succeeded.
	Delay latencies `json:"finishedToSucceededStatus"`
	// The same, from the published terminated.finishedAt (1 s resolution).
	DelayFromStatus latencies `json:"publishedFinishedToSucceededStatus"`
}

// exitDelay applies pods whose only container exits 0 after 1–3 s
// (restartPolicy Never) and measures how long after the container ended
// the status with phase Succeeded reached a subscriber.
func (e *env) exitDelay(ctx context.Context) (*exitResult, error) {
	var names, items []string
	for i := range e.opts.exitPods {
		n := fmt.Sprintf("exit-%d", i)
		names = append(names, n)
		secs := 1 + rand.Float64()*2
		items = append(items, e.podJSON(n, "Never", fmt.Sprintf("sleep %.1f; exit 0", secs)))
	}
	got, applyErr := e.applyPods(ctx, listOf(items), names, v1.PodSucceeded, false)
	// Delete whatever was created, also when the measurement failed.
	defer func() {
		if err := e.deletePods(ctx, names); err != nil {
			e.log.Error().Err(err).Msg("exit: deleting pods")
		}
	}()
	if applyErr != nil {
		return nil, applyErr
	}
	res := &exitResult{Pods: len(names)}
	var delays, fromStatus []time.Duration
	for _, n := range names {
		finished, err := e.containerFinishedAt(ctx, n, "main")
		if err != nil {
			return nil, err
		}
		delays = append(delays, got.arrived[n].Sub(finished))
		e.log.Debug().Str("pod", n).Str("finished", finished.Format("15:04:05.000")).Str("arrived", got.arrived[n].Format("15:04:05.000")).Msg("exit: one pod")
		if cs := got.status[n].Status.ContainerStatuses; len(cs) == 1 && cs[0].State.Terminated != nil {
			fromStatus = append(fromStatus, got.arrived[n].Sub(cs[0].State.Terminated.FinishedAt.Time))
		}
	}
	res.Delay = summarise(delays)
	res.DelayFromStatus = summarise(fromStatus)
	e.log.Info().Float64("p50ms", res.Delay.P50Ms).Float64("p99ms", res.Delay.P99Ms).Msg("exit: statuses in")
	return res, nil
}

// containerFinishedAt asks CRI when container c of pod name last finished.
func (e *env) containerFinishedAt(ctx context.Context, name, c string) (time.Time, error) {
	ctx, cancel := context.WithTimeout(quietCtx(ctx), 10*time.Second)
	defer cancel()
	list, err := e.cri.ListContainers(ctx, &runtimeapi.ContainerFilter{LabelSelector: map[string]string{
		"io.kubernetes.pod.namespace": e.ns, "io.kubernetes.pod.name": name, "io.kubernetes.container.name": c}})
	if err != nil {
		return time.Time{}, fmt.Errorf("list containers of %s: %w", name, err)
	}
	var latest time.Time
	for _, ct := range list {
		st, err := e.cri.ContainerStatus(ctx, ct.Id, false)
		if err != nil {
			return time.Time{}, fmt.Errorf("status of container %s of %s: %w", ct.Id, name, err)
		}
		if at := st.GetStatus().GetFinishedAt(); at > 0 && time.Unix(0, at).After(latest) {
			latest = time.Unix(0, at)
		}
	}
	if latest.IsZero() {
		return time.Time{}, fmt.Errorf("containerd has no finished container %s in pod %s (%d containers)", c, name, len(list))
	}
	return latest, nil
}
