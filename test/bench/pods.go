package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/mqlet/mqlet/cri/rawcri"
)

// podJSON is a busybox pod running sh -c script.
func (e *env) podJSON(name, restartPolicy, script string) string {
	return fmt.Sprintf(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":%q,"namespace":%q},`+
		`"spec":{"restartPolicy":%q,"terminationGracePeriodSeconds":2,"containers":[{"name":"main",`+
		`"image":%q,"imagePullPolicy":"Never","command":["sh","-c",%q]}]}}`,
		name, e.ns, restartPolicy, busyboxImage, script)
}

func listOf(items []string) []byte {
	return []byte(`{"apiVersion":"v1","kind":"List","items":[` + strings.Join(items, ",") + `]}`)
}

// podApply is what one apply of pods showed: when the reply succeeded and
// when each pod's status first reached the wanted phase, from the publish.
type podApply struct {
	sent    time.Time
	reply   time.Duration
	reached map[string]time.Duration
	status  map[string]*v1.Pod // the status that reached the phase
	arrived map[string]time.Time
}

// applyPods publishes payload as one apply and waits until every named pod's
// status shows phase and, when waitReply, the reply succeeded.
func (e *env) applyPods(ctx context.Context, payload []byte, names []string, phase v1.PodPhase, waitReply bool) (*podApply, error) {
	if err := e.checkAgent(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, podTimeout)
	defer cancel()
	id := e.nextID("pods")
	pending := make(map[string]string, len(names)) // topic → pod name
	for _, n := range names {
		pending[e.t.pod(e.ns, n)] = n
	}
	res := &podApply{reached: map[string]time.Duration{}, status: map[string]*v1.Pod{}, arrived: map[string]time.Time{}}
	from := e.mq.mark()
	res.sent = time.Now()
	if err := e.mq.publish(ctx, e.t.cmd("apply", id), payload); err != nil {
		return nil, err
	}
	replied := !waitReply
	err := e.mq.scan(ctx, from, fmt.Sprintf("%d pods %s and reply %s", len(names), phase, id), func(m msg) (bool, error) {
		if rep, ok := e.t.parseReply(m); ok && rep.RequestID == id {
			switch rep.Phase {
			case "succeeded":
				if !replied {
					res.reply, replied = m.At.Sub(res.sent), true
				}
			case "failed":
				if waitReply {
					return false, fmt.Errorf("apply %s failed: %s %v", id, rep.Message, rep.Errors)
				}
			}
		}
		if name, ok := pending[m.Topic]; ok && len(m.Payload) > 0 {
			var p v1.Pod
			if err := json.Unmarshal(m.Payload, &p); err != nil {
				return false, fmt.Errorf("status of %s is not a v1.Pod: %w", name, err)
			}
			switch {
			case p.Status.Phase == phase:
				res.reached[name] = m.At.Sub(res.sent)
				res.status[name], res.arrived[name] = &p, m.At
				delete(pending, m.Topic)
			case p.Status.Phase == v1.PodFailed:
				return false, fmt.Errorf("pod %s failed: %s %s", name, p.Status.Reason, p.Status.Message)
			}
		}
		return replied && len(pending) == 0, nil
	})
	if err != nil {
		return res, fmt.Errorf("%w (%d of %d pods reached %s)", err, len(names)-len(pending), len(names), phase)
	}
	return res, nil
}

// deletePods deletes the named pods (one command each, pipelined) and waits
// for the succeeded replies, the cleared retained statuses and containerd
// holding none of their sandboxes.
func (e *env) deletePods(ctx context.Context, names []string) error {
	_, err := e.deletePodsTimed(ctx, names, false)
	return err
}

// deletePodsTimed is deletePods; with timed it also returns how long after
// the first delete command was published CRI first listed none of this
// run's sandboxes as ready (polled every 10 ms).
func (e *env) deletePodsTimed(ctx context.Context, names []string, timed bool) (time.Duration, error) {
	if err := e.checkAgent(); err != nil {
		return 0, err
	}
	ctx, cancel := context.WithTimeout(ctx, podTimeout)
	defer cancel()
	from := e.mq.mark()
	ids := make([]string, len(names))
	cleared := make(map[string]bool, len(names))
	for i, n := range names {
		ids[i] = e.nextID("delete")
		cleared[e.t.pod(e.ns, n)] = false
	}
	var notReady chan notReadyResult
	start := time.Now()
	if timed {
		notReady = make(chan notReadyResult, 1)
		go func() { notReady <- e.waitNoneReady(ctx, start) }()
	}
	for i, n := range names {
		if err := e.mq.publish(ctx, e.t.cmd("delete", ids[i]), fmt.Appendf(nil, `{"kind":"Pod","namespace":%q,"name":%q}`, e.ns, n)); err != nil {
			cancel()
			if notReady != nil {
				<-notReady
			}
			return 0, err
		}
	}
	var took time.Duration
	if notReady != nil {
		r := <-notReady
		if r.err != nil {
			return 0, fmt.Errorf("waiting for no ready sandbox: %w", r.err)
		}
		took = r.took
	}
	return took, e.waitDeleted(ctx, from, ids, cleared)
}

type notReadyResult struct {
	took time.Duration
	err  error
}

// waitNoneReady polls CRI until none of this run's sandboxes is ready.
func (e *env) waitNoneReady(ctx context.Context, start time.Time) notReadyResult {
	for {
		lctx, cancel := context.WithTimeout(quietCtx(ctx), 10*time.Second)
		list, err := e.cri.ListPodSandbox(lctx, &runtimeapi.PodSandboxFilter{
			State:         &runtimeapi.PodSandboxStateValue{State: runtimeapi.PodSandboxState_SANDBOX_READY},
			LabelSelector: map[string]string{"io.kubernetes.pod.namespace": e.ns}})
		cancel()
		at := time.Now()
		if err != nil {
			return notReadyResult{err: fmt.Errorf("list ready sandboxes: %w", err)}
		}
		if len(list) == 0 {
			return notReadyResult{took: at.Sub(start)}
		}
		select {
		case <-time.After(10 * time.Millisecond):
		case <-ctx.Done():
			return notReadyResult{err: fmt.Errorf("%d sandboxes still ready: %w", len(list), context.Cause(ctx))}
		}
	}
}

// waitDeleted waits for the deletes' succeeded replies, the cleared
// retained statuses and containerd holding none of this run's sandboxes.
func (e *env) waitDeleted(ctx context.Context, from int, ids []string, cleared map[string]bool) error {
	if _, err := e.mq.finalReplies(ctx, e.t, from, ids); err != nil {
		return fmt.Errorf("delete pods: %w", err)
	}
	left := len(cleared)
	err := e.mq.scan(ctx, from, "cleared pod statuses", func(m msg) (bool, error) {
		if done, ok := cleared[m.Topic]; ok && !done && len(m.Payload) == 0 {
			cleared[m.Topic] = true
			left--
		}
		return left == 0, nil
	})
	if err != nil {
		return err
	}
	return e.waitNoSandboxes(ctx)
}

// waitNoSandboxes polls containerd until this run has no sandbox left.
func (e *env) waitNoSandboxes(ctx context.Context) error {
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		sbs, err := e.sandboxesOf(ctx, "")
		if err != nil {
			return err
		}
		if len(sbs) == 0 {
			return nil
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return fmt.Errorf("%d sandboxes still in containerd after delete: %w", len(sbs), context.Cause(ctx))
		}
	}
}

type podStartCase struct {
	Pods int `json:"pods"`
	// Per pod: publish of the apply → first retained status with phase Running.
	Running latencies `json:"applyToRunningStatus"`
	// Publish of the apply → reply succeeded (all containers of all pods run).
	Reply latencies `json:"applyToReplySucceeded"`
	// Per pod: RunPodSandbox+CreateContainer+StartContainer done one pod after another.
	Raw       latencies `json:"rawCri"`
	RawWallMs float64   `json:"rawCriWallMs,omitempty"`
	// mqlet's per-pod Running latency over raw CRI's per-pod latency.
	RatioP50 float64 `json:"ratioP50"`
	RatioP99 float64 `json:"ratioP99"`
	// Burst only: time until the last pod ran under mqlet (in parallel) over
	// raw CRI's time for all pods one after another.
	RatioAllPods float64 `json:"ratioAllRunningToRawWall,omitempty"`
	// Burst only: raw CRI with every pod's calls made at once, from the
	// first call until the last container started (the floor of one apply
	// of the List), per pod and all pods.
	RawParallel       latencies `json:"rawCriParallel"`
	RawParallelWallMs float64   `json:"rawCriParallelWallMs,omitempty"`
	// Burst only: time until the last pod ran under mqlet over RawParallelWallMs.
	RatioAllPodsParallel float64 `json:"ratioAllRunningToRawParallelWall,omitempty"`
	// Burst only: the same parallel calls with the confinement mqlet gives
	// every pod by default (seccomp RuntimeDefault, masked /proc paths).
	RawConfined          latencies `json:"rawCriParallelConfined"`
	RawConfinedWallMs    float64   `json:"rawCriParallelConfinedWallMs,omitempty"`
	RatioAllPodsConfined float64   `json:"ratioAllRunningToRawParallelConfinedWall,omitempty"`
}

type podStartResult struct {
	Single podStartCase `json:"single"`
	Burst  podStartCase `json:"burst"`
	// rawStop is the raw CRI floor of the delete step: StopPodSandbox of the
	// parallel raw pods, all at once.
	rawStop time.Duration
}

const sleeper = "trap 'exit 0' TERM; sleep 3600 & wait"

// podStart measures apply → running for one pod (repeated, deleted in
// between) and for a burst in one List, next to raw CRI for as many pods.
// The burst pods are left running for the idle step; their names are returned.
func (e *env) podStart(ctx context.Context) (*podStartResult, []string, error) {
	res := &podStartResult{}
	var raw, running, reply []time.Duration
	for i := range e.opts.singleRepeats {
		lat, err := rawcri.Run(quietCtx(ctx), e.opts.criEndpoint, 1)
		if err != nil {
			return nil, nil, fmt.Errorf("raw CRI single pod: %w", err)
		}
		raw = append(raw, lat...)
		name := fmt.Sprintf("single-%d", i)
		got, err := e.applyPods(ctx, []byte(e.podJSON(name, "Always", sleeper)), []string{name}, v1.PodRunning, true)
		if err != nil {
			return nil, nil, fmt.Errorf("single pod %d: %w", i+1, err)
		}
		running = append(running, got.reached[name])
		reply = append(reply, got.reply)
		e.log.Info().Int("repeat", i+1).Dur("running", got.reached[name]).Dur("reply", got.reply).Dur("raw", lat[0]).Msg("pods: single pod running")
		if err := e.deletePods(ctx, []string{name}); err != nil {
			return nil, nil, fmt.Errorf("delete single pod %d: %w", i+1, err)
		}
	}
	res.Single = podCase(1, running, reply, raw, 0)

	rawStart := time.Now()
	rawBurst, err := rawcri.Run(quietCtx(ctx), e.opts.criEndpoint, e.opts.burst)
	if err != nil {
		return nil, nil, fmt.Errorf("raw CRI %d pods: %w", e.opts.burst, err)
	}
	rawWall := time.Since(rawStart)
	rawPar, err := rawcri.RunParallel(quietCtx(ctx), e.opts.criEndpoint, e.opts.burst, rawcri.Bare)
	if err != nil {
		return nil, nil, fmt.Errorf("raw CRI %d pods in parallel: %w", e.opts.burst, err)
	}
	rawConfined, err := rawcri.RunParallel(quietCtx(ctx), e.opts.criEndpoint, e.opts.burst, rawcri.AsMqlet)
	if err != nil {
		return nil, nil, fmt.Errorf("raw CRI %d pods in parallel, confined as mqlet confines them: %w", e.opts.burst, err)
	}
	e.log.Info().Dur("sequential", rawWall).Dur("parallel", rawPar.StartWall).Dur("parallelConfined", rawConfined.StartWall).Dur("stopParallel", rawPar.StopWall).Msg("pods: raw CRI burst")
	names, items := e.burstPods()
	got, err := e.applyPods(ctx, listOf(items), names, v1.PodRunning, true)
	if err != nil {
		return nil, names, fmt.Errorf("burst of %d pods: %w", e.opts.burst, err)
	}
	running = running[:0]
	for _, n := range names {
		running = append(running, got.reached[n])
	}
	res.Burst = podCase(e.opts.burst, running, []time.Duration{got.reply}, rawBurst, rawWall)
	res.Burst.RatioAllPods = ratio(res.Burst.Running.MaxMs, res.Burst.RawWallMs)
	res.Burst.RawParallel, res.Burst.RawParallelWallMs = summarise(rawPar.Start), ms(rawPar.StartWall)
	res.Burst.RatioAllPodsParallel = ratio(res.Burst.Running.MaxMs, res.Burst.RawParallelWallMs)
	res.Burst.RawConfined, res.Burst.RawConfinedWallMs = summarise(rawConfined.Start), ms(rawConfined.StartWall)
	res.Burst.RatioAllPodsConfined = ratio(res.Burst.Running.MaxMs, res.Burst.RawConfinedWallMs)
	res.rawStop = rawPar.StopWall
	e.log.Info().Float64("p50ms", res.Burst.Running.P50Ms).Dur("reply", got.reply).Msg("pods: burst running")
	return res, names, nil
}

func (e *env) burstPods() (names, items []string) {
	for i := range e.opts.burst {
		n := fmt.Sprintf("burst-%d", i)
		names = append(names, n)
		if e.opts.probePods {
			items = append(items, e.probedPodJSON(n))
		} else {
			items = append(items, e.podJSON(n, "Always", sleeper))
		}
	}
	return names, items
}

// probedPodJSON is a sleeper that also serves HTTP on port 8080 (busybox
// httpd), with the probes of issue 9's cost figure: an exec liveness probe
// and an httpGet readiness probe on the pod IP, both every 10 s.
func (e *env) probedPodJSON(name string) string {
	return fmt.Sprintf(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":%q,"namespace":%q},`+
		`"spec":{"restartPolicy":"Always","terminationGracePeriodSeconds":2,"containers":[{"name":"main",`+
		`"image":%q,"imagePullPolicy":"Never","command":["sh","-c",%q],`+
		`"livenessProbe":{"exec":{"command":["true"]},"periodSeconds":10},`+
		`"readinessProbe":{"httpGet":{"path":"/passwd","port":8080},"periodSeconds":10}}]}}`,
		name, e.ns, busyboxImage, "httpd -p 8080 -h /etc; "+sleeper)
}

func podCase(pods int, running, reply, raw []time.Duration, rawWall time.Duration) podStartCase {
	c := podStartCase{Pods: pods, Running: summarise(running), Reply: summarise(reply), Raw: summarise(raw), RawWallMs: ms(rawWall)}
	c.RatioP50 = ratio(c.Running.P50Ms, c.Raw.P50Ms)
	c.RatioP99 = ratio(c.Running.P99Ms, c.Raw.P99Ms)
	return c
}

type deleteResult struct {
	Pods int `json:"pods"`
	// Publish of the first of the deletes (one command per pod, pipelined)
	// → CRI lists none of the pods' sandboxes as ready.
	NoneReadyMs float64 `json:"deleteToNoSandboxReadyMs"`
	// Raw CRI: StopPodSandbox of as many running pods, all at once.
	RawStopMs float64 `json:"rawCriParallelStopMs"`
	Ratio     float64 `json:"ratio"`
}

// deleteRunning deletes the running pods and times it against rawStop
// (measured when 0).
func (e *env) deleteRunning(ctx context.Context, names []string, rawStop time.Duration) (*deleteResult, error) {
	if rawStop == 0 {
		raw, err := rawcri.RunParallel(quietCtx(ctx), e.opts.criEndpoint, len(names), rawcri.Bare)
		if err != nil {
			return nil, fmt.Errorf("raw CRI %d pods in parallel: %w", len(names), err)
		}
		rawStop = raw.StopWall
	}
	took, err := e.deletePodsTimed(ctx, names, true)
	if err != nil {
		return nil, err
	}
	res := &deleteResult{Pods: len(names), NoneReadyMs: ms(took), RawStopMs: ms(rawStop)}
	res.Ratio = ratio(res.NoneReadyMs, res.RawStopMs)
	e.log.Info().Dur("noneReady", took).Dur("raw", rawStop).Msg("delete: no sandbox ready")
	return res, nil
}
