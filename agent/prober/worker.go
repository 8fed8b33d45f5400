package prober

import (
	"context"
	"fmt"
	"net/http"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/kubernetes/pkg/probe"
	"k8s.io/utils/clock"
)

// Kubernetes' defaults, for a probe that reached here undefaulted.
const (
	defaultPeriod           = 10
	defaultTimeout          = 1
	defaultSuccessThreshold = 1
	defaultFailureThreshold = 3
)

// maxEventOutput bounds the probe output quoted in an event.
const maxEventOutput = 1024

// worker runs one probe of one container attempt until cancelled.
type worker struct {
	m           *Manager
	pod         *v1.Pod
	container   *v1.Container
	containerID string
	init        bool // a restartable init (sidecar) container
	podIP       string
	startedAt   time.Time
	kind        Kind
	spec        *v1.Probe

	ctx    context.Context
	cancel context.CancelFunc

	// Owned by the worker's goroutine.
	last   Result // last check's verdict
	streak int    // how many checks in a row gave last
	onHold bool   // a liveness/startup failure was reported: the container is being killed
	// Built at the first check, reused by the next ones.
	httpReq *http.Request // an httpGet probe's request, without a context
	execCmd []string      // an exec probe's command, $(VAR) expanded
}

func newWorker(m *Manager, pod *v1.Pod, c *v1.Container, id, podIP string, startedAt time.Time, kind Kind, spec *v1.Probe) *worker {
	ctx, cancel := context.WithCancel(m.ctx)
	return &worker{m: m, pod: pod, container: c, containerID: id, podIP: podIP, startedAt: startedAt,
		kind: kind, spec: spec, ctx: ctx, cancel: cancel}
}

// initial is the result before the first verdict, as in the kubelet: a
// container is not ready until its readiness probe succeeds, alive until
// its liveness probe fails, and not started until its startup probe says so.
func (w *worker) initial() Result {
	switch w.kind {
	case Readiness:
		return Failure
	case Liveness:
		return Success
	default:
		return Unknown
	}
}

func seconds(v, def int32) time.Duration {
	if v <= 0 {
		v = def
	}
	return time.Duration(v) * time.Second
}

// run checks at startedAt + initialDelaySeconds (at once if that has
// passed, e.g. for a container adopted after a restart) and then every
// periodSeconds on that schedule; a check that overran its period skips
// the ticks it missed rather than bunching them.
func (w *worker) run() {
	defer w.m.wg.Done()
	defer w.cancel()
	clk := w.m.clock
	period := seconds(w.spec.PeriodSeconds, defaultPeriod)
	next := w.startedAt.Add(time.Duration(w.spec.InitialDelaySeconds) * time.Second)
	var t clock.Timer
	defer func() {
		if t != nil {
			t.Stop()
		}
	}()
	for {
		if d := next.Sub(clk.Now()); d > 0 {
			if t == nil {
				t = clk.NewTimer(d)
			} else {
				t.Reset(d)
			}
			select {
			case <-w.ctx.Done():
				return
			case <-t.C():
			}
		} else if w.ctx.Err() != nil {
			return
		}
		w.probe()
		now := clk.Now()
		if next.Before(now.Add(-period)) {
			next = now // first check late (adopted container): the schedule starts now
		}
		for !next.After(now) {
			next = next.Add(period)
		}
	}
}

// probe runs one check and, once the threshold is reached, stores the result.
func (w *worker) probe() {
	if w.onHold {
		return // the container is being killed; its next attempt gets new workers
	}
	if w.kind == Startup {
		if r, _ := w.m.Result(w.containerID, Startup); r == Success {
			return // started: startup probes end there
		}
	} else if !w.m.startupPassed(w.containerID) {
		return // held back until the startup probe succeeds
	}
	res, out, err := w.m.check(w.ctx, w)
	if w.ctx.Err() != nil {
		return
	}
	pod := w.pod
	if err != nil {
		// A check that could not run says nothing of the container (the
		// runtime is unreachable, say): the result stays as it was.
		w.m.opts.Log.Debug().Err(err).Str("pod", pod.Namespace+"/"+pod.Name).Str("container", w.container.Name).Str("probe", title(w.kind)).Msg("probe errored")
		w.event(v1.EventTypeWarning, ReasonUnhealthy, fmt.Sprintf("%s probe errored: %v", title(w.kind), err))
		return
	}
	var r Result
	switch res {
	case probe.Success:
		r = Success
	case probe.Warning:
		w.event(v1.EventTypeWarning, ReasonProbeWarning, fmt.Sprintf("%s probe warning: %s", title(w.kind), clip(out)))
		r = Success
	case probe.Failure:
		w.event(v1.EventTypeWarning, ReasonUnhealthy, fmt.Sprintf("%s probe failed: %s", title(w.kind), clip(out)))
		r = Failure
	default:
		return
	}
	if r == w.last {
		w.streak++
	} else {
		w.last, w.streak = r, 1
	}
	if r == Failure && w.streak < threshold(w.spec.FailureThreshold, defaultFailureThreshold) ||
		r == Success && w.streak < threshold(w.spec.SuccessThreshold, defaultSuccessThreshold) {
		w.m.ran(w)
		return
	}
	w.m.set(w, r) // marks it run too, before a sync hears of the change
	if r == Failure && (w.kind == Liveness || w.kind == Startup) {
		w.onHold, w.streak = true, 0
	}
}

func threshold(v, def int32) int {
	if v <= 0 {
		return int(def)
	}
	return int(v)
}

func (w *worker) event(eventType, reason, msg string) {
	if w.m.opts.Events == nil {
		return
	}
	path := "spec.containers{" + w.container.Name + "}"
	if w.init {
		path = "spec.initContainers{" + w.container.Name + "}"
	}
	w.m.opts.Events.ObjectEvent(v1.ObjectReference{Kind: "Pod", Namespace: w.pod.Namespace, Name: w.pod.Name,
		UID: w.pod.UID, ResourceVersion: w.pod.ResourceVersion, FieldPath: path}, eventType, reason, msg)
}

func clip(s string) string {
	if len(s) > maxEventOutput {
		return s[:maxEventOutput] + "…"
	}
	return s
}
