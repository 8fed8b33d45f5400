// Package prober runs the containers' liveness, readiness and startup
// probes the kubelet's way: one worker goroutine per probe of each running
// container, started when the container is first seen running and stopped
// when it is gone, each keeping its result in the manager. The pod workers
// read the results (Ready/Started for the status, the containers to kill
// for a failed liveness or startup probe) and are told when one changes.
package prober

import (
	"context"
	"sync"
	"time"

	"github.com/rs/zerolog"
	v1 "k8s.io/api/core/v1"
	"k8s.io/utils/clock"

	"github.com/mqlet/mqlet/agent/podstatus"
	"github.com/mqlet/mqlet/cri"
)

// Kind is which of a container's probes: the runtime's planner's own
// vocabulary, so results pass to it unmapped.
type Kind = cri.ProbeType

const (
	Liveness  = cri.ProbeLiveness
	Readiness = cri.ProbeReadiness
	Startup   = cri.ProbeStartup
)

// Result is a probe's last verdict, once its threshold was reached.
type Result = cri.ProbeResult

const (
	Unknown = cri.ProbeUnknown
	Success = cri.ProbeSuccess
	Failure = cri.ProbeFailure
)

// title is the probe's name as the kubelet's events and logs spell it.
func title(k Kind) string {
	switch k {
	case Liveness:
		return "Liveness"
	case Readiness:
		return "Readiness"
	case Startup:
		return "Startup"
	}
	return k.String()
}

// Execer runs a command in a container (the runtime's CRI ExecSync).
type Execer interface {
	ExecSync(ctx context.Context, containerID string, cmd []string, timeout time.Duration) (stdout, stderr []byte, exitCode int, err error)
}

// EventRecorder receives the probes' events (Unhealthy, ProbeWarning),
// each about one container of a pod (FieldPath spec.containers{name}).
type EventRecorder interface {
	ObjectEvent(ref v1.ObjectReference, eventType, reason, message string)
}

// Options wire a Manager.
type Options struct {
	Exec   Execer
	Events EventRecorder
	// OnChange is called (from a worker) with the runtime pod UID whenever a
	// probe's result changes, so the pod is synced and its status published.
	OnChange func(podUID string)
	Clock    clock.WithTicker // nil: the real clock
	Log      zerolog.Logger
}

// Event reasons, as the kubelet spells them.
const (
	ReasonUnhealthy    = "Unhealthy"
	ReasonProbeWarning = "ProbeWarning"
)

type key struct {
	containerID string
	kind        Kind
}

// Manager owns every probe worker and their results.
type Manager struct {
	opts  Options
	clock clock.WithTicker
	check checkFunc

	ctx    context.Context // the workers'; cancelled when Run returns
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	stopped bool
	workers map[key]*worker
	results map[key]Result
	checked map[key]bool               // probes that have run at least once
	pods    map[string]map[string]bool // pod UID → container IDs with workers
}

// New returns a Manager; workers run once Track is called and until Run's
// context ends.
func New(opts Options) *Manager {
	c := opts.Clock
	if c == nil {
		c = clock.RealClock{}
	}
	ctx, cancel := context.WithCancel(context.Background())
	m := &Manager{opts: opts, clock: c, ctx: ctx, cancel: cancel,
		workers: map[key]*worker{}, results: map[key]Result{}, checked: map[key]bool{}, pods: map[string]map[string]bool{}}
	m.check = m.runHandler
	return m
}

// Run blocks until ctx ends, then stops every worker and waits for them.
func (m *Manager) Run(ctx context.Context) {
	<-ctx.Done()
	m.mu.Lock()
	m.stopped = true
	m.mu.Unlock()
	m.cancel()
	m.wg.Wait()
}

// Track starts a worker for each probe of each running container of pod
// that has none yet, and stops the workers of the pod's containers that no
// longer run. rs is the runtime's view of the pod (from GetPodStatus).
func (m *Manager) Track(pod *v1.Pod, rs *cri.PodStatus) {
	uid := string(pod.UID)
	if rs == nil || len(probedContainers(pod)) == 0 {
		m.Forget(uid)
		return
	}
	podIP := podAddress(pod, rs)
	running := map[string]bool{}
	type start struct {
		c       *v1.Container
		init    bool
		id      string
		started time.Time
	}
	var starts []start
	for _, c := range probedContainers(pod) {
		st := newestOf(rs, c.c.Name, c.init)
		if st == nil || st.State != cri.ContainerRunning {
			continue
		}
		running[st.ID] = true
		starts = append(starts, start{c.c, c.init, st.ID, st.StartedAt})
	}

	m.mu.Lock()
	defer m.mu.Unlock()
	if m.stopped {
		return
	}
	for id := range m.pods[uid] {
		if !running[id] {
			m.removeLocked(uid, id)
		}
	}
	// Most syncs start no worker: the pod is copied only when one starts.
	// The workers keep the pod as it was then (a new spec means new
	// containers, so new workers), each pointing into the one copy.
	var copied *v1.Pod
	for _, s := range starts {
		for _, p := range []struct {
			kind Kind
			spec *v1.Probe
		}{{Liveness, s.c.LivenessProbe}, {Readiness, s.c.ReadinessProbe}, {Startup, s.c.StartupProbe}} {
			if p.spec == nil {
				continue
			}
			k := key{s.id, p.kind}
			if _, ok := m.workers[k]; ok {
				continue
			}
			if copied == nil {
				copied = pod.DeepCopy()
			}
			c := containerIn(copied, s.c.Name, s.init)
			w := newWorker(m, copied, c, s.id, podIP, s.started, p.kind, probeOf(c, p.kind))
			w.init = s.init
			m.workers[k] = w
			m.results[k] = w.initial()
			if m.pods[uid] == nil {
				m.pods[uid] = map[string]bool{}
			}
			m.pods[uid][s.id] = true
			m.wg.Add(1)
			go w.run()
		}
	}
}

// Forget stops every worker of the pod with this runtime UID.
func (m *Manager) Forget(podUID string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for id := range m.pods[podUID] {
		m.removeLocked(podUID, id)
	}
}

func (m *Manager) removeLocked(uid, id string) {
	for _, kind := range []Kind{Liveness, Readiness, Startup} {
		k := key{id, kind}
		if w, ok := m.workers[k]; ok {
			w.cancel()
			delete(m.workers, k)
		}
		delete(m.results, k)
		delete(m.checked, k)
	}
	delete(m.pods[uid], id)
	if len(m.pods[uid]) == 0 {
		delete(m.pods, uid)
	}
}

// Result returns the result of one probe of one container attempt.
func (m *Manager) Result(containerID string, kind Kind) (Result, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r, ok := m.results[key{containerID, kind}]
	return r, ok
}

// States returns, for each probed container of the pod by runtime ID,
// whether it counts as started and ready: started once its startup probe
// succeeded (at once without one), ready once started and its readiness
// probe succeeded (at once without one).
func (m *Manager) States(podUID string) map[string]podstatus.Probed {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[string]podstatus.Probed{}
	for id := range m.pods[podUID] {
		started := m.passedLocked(id, Startup)
		ready := started && m.passedLocked(id, Readiness)
		out[id] = podstatus.Probed{Started: started, Ready: ready}
	}
	return out
}

// passedLocked: the probe succeeded, or the container has no such probe.
func (m *Manager) passedLocked(id string, kind Kind) bool {
	r, ok := m.results[key{id, kind}]
	return !ok || r == Success
}

// Get returns a probe's result for SyncPod's planner (cri.ProbeResults):
// a failed liveness (once started) or startup result kills the container.
func (m *Manager) Get(containerID string, probe cri.ProbeType) cri.ProbeResult {
	r, _ := m.Result(containerID, probe)
	return r
}

// Unchecked reports whether a readiness or startup probe of one of the
// pod's running containers has not run yet: its result is then the
// initial one (not ready, not started), not a verdict on the container.
func (m *Manager) Unchecked(podUID string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	for id := range m.pods[podUID] {
		for _, kind := range []Kind{Readiness, Startup} {
			k := key{id, kind}
			if _, ok := m.workers[k]; ok && !m.checked[k] {
				return true
			}
		}
	}
	return false
}

// ran records that a worker's probe ran (whatever its result).
func (m *Manager) ran(w *worker) {
	k := key{w.containerID, w.kind}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.workers[k] == w {
		m.checked[k] = true
	}
}

// set stores a worker's result; a change is reported to OnChange.
func (m *Manager) set(w *worker, r Result) {
	k := key{w.containerID, w.kind}
	m.mu.Lock()
	if m.workers[k] != w {
		m.mu.Unlock()
		return // removed meanwhile
	}
	changed := m.results[k] != r
	m.results[k] = r
	m.checked[k] = true
	m.mu.Unlock()
	if changed {
		m.opts.Log.Debug().Str("pod", w.pod.Namespace+"/"+w.pod.Name).Str("container", w.container.Name).
			Str("probe", title(w.kind)).Str("result", r.String()).Msg("probe result changed")
		if m.opts.OnChange != nil {
			m.opts.OnChange(string(w.pod.UID))
		}
	}
}

// startupPassed reports whether the container's startup probe (if any)
// has succeeded; until then its liveness and readiness probes wait.
func (m *Manager) startupPassed(containerID string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.passedLocked(containerID, Startup)
}

type probed struct {
	c    *v1.Container
	init bool
}

// probedContainers are the containers whose probes run: the app
// containers and the restartable init (sidecar) containers.
func probedContainers(pod *v1.Pod) []probed {
	var out []probed
	for i := range pod.Spec.InitContainers {
		c := &pod.Spec.InitContainers[i]
		if c.RestartPolicy != nil && *c.RestartPolicy == v1.ContainerRestartPolicyAlways && hasProbe(c) {
			out = append(out, probed{c, true})
		}
	}
	for i := range pod.Spec.Containers {
		if c := &pod.Spec.Containers[i]; hasProbe(c) {
			out = append(out, probed{c, false})
		}
	}
	return out
}

func hasProbe(c *v1.Container) bool {
	return c.LivenessProbe != nil || c.ReadinessProbe != nil || c.StartupProbe != nil
}

// newestOf is the newest attempt of a container (statuses are newest first).
func newestOf(rs *cri.PodStatus, name string, init bool) *cri.ContainerStatus {
	for i := range rs.Containers {
		if c := &rs.Containers[i]; c.Name == name && c.Init == init {
			return c
		}
	}
	return nil
}

// podAddress is where httpGet, tcpSocket and grpc probes connect: the pod's
// IP, or the loopback address for a pod in the host's network namespace.
func podAddress(pod *v1.Pod, rs *cri.PodStatus) string {
	if pod.Spec.HostNetwork {
		return "127.0.0.1"
	}
	if len(rs.Sandboxes) > 0 && rs.Sandboxes[0].Ready {
		if ip := rs.Sandboxes[0].IP; ip != "" {
			return ip
		}
		if len(rs.Sandboxes[0].IPs) > 0 {
			return rs.Sandboxes[0].IPs[0]
		}
	}
	return ""
}

// containerIn is the (init) container of pod with this name.
func containerIn(pod *v1.Pod, name string, init bool) *v1.Container {
	list := pod.Spec.Containers
	if init {
		list = pod.Spec.InitContainers
	}
	for i := range list {
		if list[i].Name == name {
			return &list[i]
		}
	}
	return nil
}

func probeOf(c *v1.Container, kind Kind) *v1.Probe {
	switch kind {
	case Liveness:
		return c.LivenessProbe
	case Readiness:
		return c.ReadinessProbe
	default:
		return c.StartupProbe
	}
}
