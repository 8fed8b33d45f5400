package cri

import (
	"slices"

	v1 "k8s.io/api/core/v1"
)

// Reason says why the planner decided what it did. It is a value, so the
// sync acts on it without parsing text; String is the wording for events
// and logs.
type Reason int

const (
	ReasonNone Reason = iota
	// Sandbox (re)creation.
	ReasonNoSandbox
	ReasonSandboxNotReady
	ReasonMoreThanOneSandbox
	ReasonSandboxSpecChanged
	// Whole-pod stops.
	ReasonInitFailed
	ReasonAllTerminated
	// One container killed.
	ReasonContainerSpecChanged
	ReasonContainerNotRunning
	ReasonLivenessFailed
	ReasonStartupFailed
	// An operator's restart request (the restart verb).
	ReasonRestartRequested
)

var reasonText = map[Reason]string{
	ReasonNone:                 "",
	ReasonNoSandbox:            "no sandbox",
	ReasonSandboxNotReady:      "sandbox is not ready",
	ReasonMoreThanOneSandbox:   "more than one ready sandbox",
	ReasonSandboxSpecChanged:   "sandbox spec changed",
	ReasonInitFailed:           "init container failed",
	ReasonAllTerminated:        "all containers have terminated",
	ReasonContainerSpecChanged: "container spec changed",
	ReasonContainerNotRunning:  "container is not running",
	ReasonLivenessFailed:       "failed liveness probe",
	ReasonStartupFailed:        "failed startup probe",
	ReasonRestartRequested:     "restart requested",
}

func (r Reason) String() string {
	if s, ok := reasonText[r]; ok {
		return s
	}
	return "unknown reason"
}

// ProbeType names one of a container's probes.
type ProbeType int

const (
	ProbeLiveness ProbeType = iota
	ProbeReadiness
	ProbeStartup
)

func (p ProbeType) String() string {
	switch p {
	case ProbeLiveness:
		return "liveness"
	case ProbeReadiness:
		return "readiness"
	case ProbeStartup:
		return "startup"
	}
	return "unknown probe"
}

// ProbeResult is the latest outcome of one probe of one container.
type ProbeResult int

const (
	// ProbeUnknown: not probed yet (or no result kept).
	ProbeUnknown ProbeResult = iota
	ProbeSuccess
	ProbeFailure
)

func (r ProbeResult) String() string {
	switch r {
	case ProbeSuccess:
		return "Success"
	case ProbeFailure:
		return "Failure"
	default:
		return "Unknown"
	}
}

// ProbeResults holds the latest probe outcomes by container ID (the
// runtime's ID of one attempt, so a restarted container starts unknown).
type ProbeResults interface {
	Get(containerID string, probe ProbeType) ProbeResult
}

// ProbeKey names one probe of one container attempt.
type ProbeKey struct {
	ContainerID string
	Probe       ProbeType
}

// ProbeResultMap is a ProbeResults held in a map; absent keys are unknown.
type ProbeResultMap map[ProbeKey]ProbeResult

func (m ProbeResultMap) Get(containerID string, probe ProbeType) ProbeResult {
	return m[ProbeKey{containerID, probe}]
}

type noProbes struct{}

func (noProbes) Get(string, ProbeType) ProbeResult { return ProbeUnknown }

// Started reports whether a container attempt counts as started: it runs,
// and its startup probe, if the spec has one, has succeeded. Until then its
// liveness result is not acted on (as in the kubelet, where liveness and
// readiness wait for startup).
func Started(c *v1.Container, s *ContainerStatus, probes ProbeResults) bool {
	if s == nil || s.State != ContainerRunning {
		return false
	}
	if c.StartupProbe == nil {
		return true
	}
	if probes == nil {
		return false
	}
	return probes.Get(s.ID, ProbeStartup) == ProbeSuccess
}

// podActions is what one sync must do to move a pod from its runtime status
// towards its spec. It is computed without side effects (see computePodActions).
type podActions struct {
	// KillPod stops every container and sandbox of the pod first.
	KillPod bool
	// CreateSandbox makes a new sandbox with SandboxAttempt.
	CreateSandbox  bool
	SandboxAttempt uint32
	// SandboxID is the live sandbox to use when no new one is created.
	SandboxID string
	// PodFailed: an init container failed under restartPolicy Never.
	PodFailed bool
	// InitToStart are indexes into pod.Spec.InitContainers, in spec
	// order (the kubelet's InitContainersToStart): at most one regular
	// init container, last, and the sidecars (restartable init
	// containers) to start or restart.
	InitToStart []int
	// Initialized: every init container ran (the app containers may run).
	Initialized bool
	// ContainersToStart are indexes into pod.Spec.Containers.
	ContainersToStart []int
	// ContainersToKill maps container IDs to the reason.
	ContainersToKill map[string]killReason
	// Reason says why the sandbox (re)starts or the pod is killed.
	Reason Reason
	// FailedInit names the init container behind ReasonInitFailed.
	FailedInit string
}

// reasonText is Reason's wording with the container it concerns, if any.
func (a podActions) reasonText() string {
	if a.Reason == ReasonInitFailed && a.FailedInit != "" {
		return "init container " + a.FailedInit + " failed"
	}
	return a.Reason.String()
}

type killReason struct {
	Name   string
	Reason Reason
	// State is the state found, for ReasonContainerNotRunning.
	State ContainerState
	// Restart: the container is started again in the same sync.
	Restart bool
	Init    bool
}

// Message is the wording of a Killing event.
func (k killReason) Message() string {
	var msg string
	switch k.Reason {
	case ReasonContainerNotRunning:
		msg = "container is in state " + string(k.State)
		if k.Init {
			msg = "init " + msg
		}
	case ReasonLivenessFailed, ReasonStartupFailed:
		msg = "container " + k.Name + " " + k.Reason.String()
	default:
		msg = k.Reason.String()
	}
	if k.Restart {
		msg += ", will be restarted"
	}
	return msg
}

// latestByName returns the newest status of each container name (statuses
// are newest first).
func latestByName(status *PodStatus, init bool) map[string]*ContainerStatus {
	latest := map[string]*ContainerStatus{}
	if status == nil {
		return latest
	}
	for i := range status.Containers {
		c := &status.Containers[i]
		if c.Init != init {
			continue
		}
		if _, ok := latest[c.Name]; !ok {
			latest[c.Name] = c
		}
	}
	return latest
}

func shouldRestart(policy v1.RestartPolicy, c *ContainerStatus) bool {
	switch policy {
	case v1.RestartPolicyNever:
		return false
	case v1.RestartPolicyOnFailure:
		return c.ExitCode != 0
	default:
		return true
	}
}

// replacing reports whether an app container's newest attempt is of an
// older spec: its replacement has not run yet.
func replacing(pod *v1.Pod, apps map[string]*ContainerStatus) bool {
	for i := range pod.Spec.Containers {
		if OfOlderSpec(&pod.Spec.Containers[i], apps[pod.Spec.Containers[i].Name]) {
			return true
		}
	}
	return false
}

// ranCurrentSpec reports whether a container of the pod's current spec
// has run. Attempts of an older spec and attempts created but never
// started do not count; one in an unknown state does (it may have run).
func ranCurrentSpec(pod *v1.Pod, status *PodStatus) bool {
	for i := range status.Containers {
		s := &status.Containers[i]
		if s.State == ContainerCreated {
			continue
		}
		list := pod.Spec.Containers
		if s.Init {
			list = pod.Spec.InitContainers
		}
		for j := range list {
			if list[j].Name == s.Name && !OfOlderSpec(&list[j], s) {
				return true
			}
		}
	}
	return false
}

// probeFailure is why a running container must be killed for its probes,
// or ReasonNone: a failed liveness probe of a started container, or a
// failed startup probe (results of probes the spec lacks are ignored).
func probeFailure(c *v1.Container, s *ContainerStatus, probes ProbeResults) Reason {
	if c.LivenessProbe != nil && Started(c, s, probes) && probes.Get(s.ID, ProbeLiveness) == ProbeFailure {
		return ReasonLivenessFailed
	}
	if c.StartupProbe != nil && probes.Get(s.ID, ProbeStartup) == ProbeFailure {
		return ReasonStartupFailed
	}
	return ReasonNone
}

// computePodActions is a lean version of the kubelet's computePodActions.
// finished says the pod's current spec has finished (see SyncInput): like
// the kubelet's terminal pods, it is never given a new sandbox.
func computePodActions(pod *v1.Pod, status *PodStatus, probes ProbeResults, finished bool) podActions {
	if status == nil {
		status = &PodStatus{}
	}
	if probes == nil {
		probes = noProbes{}
	}
	act := podActions{ContainersToKill: map[string]killReason{}}
	apps := latestByName(status, false)
	inits := latestByName(status, true)

	readySandboxes := 0
	for _, sb := range status.Sandboxes {
		if sb.Ready {
			readySandboxes++
		}
	}
	wantHash := HashSandbox(pod)
	switch {
	case len(status.Sandboxes) == 0:
		act.CreateSandbox, act.Reason = true, ReasonNoSandbox
	case !status.Sandboxes[0].Ready:
		act.CreateSandbox, act.Reason = true, ReasonSandboxNotReady
		act.SandboxAttempt = status.Sandboxes[0].Attempt + 1
	case readySandboxes > 1:
		act.CreateSandbox, act.Reason = true, ReasonMoreThanOneSandbox
		act.SandboxAttempt = status.Sandboxes[0].Attempt + 1
	case status.Sandboxes[0].SpecHash != wantHash:
		act.CreateSandbox, act.Reason = true, ReasonSandboxSpecChanged
		act.SandboxAttempt = status.Sandboxes[0].Attempt + 1
	default:
		act.SandboxID = status.Sandboxes[0].ID
	}

	if act.CreateSandbox {
		act.KillPod = len(status.Sandboxes) > 0 || len(status.Containers) > 0
		if finished {
			act.CreateSandbox = false
			return act
		}
		// A finished pod that must not restart gets no new sandbox: one
		// whose containers of the current spec have run. A container only
		// created (the agent died before starting it, and the sandbox with
		// it) has not, nor has one of an older spec.
		if pod.Spec.RestartPolicy == v1.RestartPolicyNever && act.SandboxAttempt != 0 &&
			act.Reason == ReasonSandboxNotReady && !replacing(pod, apps) && ranCurrentSpec(pod, status) {
			act.CreateSandbox = false
			return act
		}
		var toStart []int
		for i := range pod.Spec.Containers {
			c := apps[pod.Spec.Containers[i].Name]
			if pod.Spec.RestartPolicy == v1.RestartPolicyOnFailure && c != nil &&
				c.State == ContainerExited && c.ExitCode == 0 && !OfOlderSpec(&pod.Spec.Containers[i], c) {
				continue
			}
			toStart = append(toStart, i)
		}
		// Initialized (a regular container exists) with nothing to start:
		// the pod is done, and its sidecars do not bring it back.
		if len(toStart) == 0 && (len(pod.Spec.InitContainers) == 0 || len(apps) > 0) {
			act.CreateSandbox = false
			return act
		}
		if len(pod.Spec.InitContainers) > 0 {
			act.InitToStart = []int{0}
			return act
		}
		act.ContainersToStart, act.Initialized = toStart, true
		return act
	}

	act.Initialized = initActions(pod, status, apps, inits, probes, &act)
	if !act.Initialized || act.KillPod {
		return act
	}

	keep := 0
	for i := range pod.Spec.Containers {
		c := &pod.Spec.Containers[i]
		s := apps[c.Name]
		switch {
		case s == nil:
			act.ContainersToStart = append(act.ContainersToStart, i)
		case s.State == ContainerRunning:
			if s.SpecHash != HashContainer(c) {
				act.ContainersToKill[s.ID] = killReason{Name: c.Name, Reason: ReasonContainerSpecChanged, Restart: true}
				act.ContainersToStart = append(act.ContainersToStart, i)
				continue
			}
			if why := probeFailure(c, s, probes); why != ReasonNone {
				// As a failed run: restarted unless the policy is Never.
				restart := pod.Spec.RestartPolicy != v1.RestartPolicyNever
				act.ContainersToKill[s.ID] = killReason{Name: c.Name, Reason: why, Restart: restart}
				if restart {
					act.ContainersToStart = append(act.ContainersToStart, i)
				}
				continue
			}
			keep++
		case s.State == ContainerExited:
			// An exited attempt of an older spec is one stopped for its
			// replacement (the agent may have died before starting it):
			// the current spec has not run, whatever the policy.
			if OfOlderSpec(c, s) || shouldRestart(pod.Spec.RestartPolicy, s) {
				act.ContainersToStart = append(act.ContainersToStart, i)
			}
		default:
			act.ContainersToKill[s.ID] = killReason{Name: c.Name, Reason: ReasonContainerNotRunning, State: s.State, Restart: true}
			act.ContainersToStart = append(act.ContainersToStart, i)
		}
	}
	// Nothing left to run: stop the sandbox too. Sidecars do not keep a pod
	// alive: they are stopped with it and not restarted (as in the kubelet).
	if keep == 0 && len(act.ContainersToStart) == 0 {
		act.KillPod = true
		act.Reason = ReasonAllTerminated
		act.InitToStart = nil
		for id, k := range act.ContainersToKill {
			if k.Init {
				delete(act.ContainersToKill, id)
			}
		}
	}
	return act
}

// IsSidecar reports whether c is a restartable init container: started in
// order with the init containers, not waited for, restarted whenever it
// exits, and stopped after the app containers.
func IsSidecar(c *v1.Container) bool {
	return c.RestartPolicy != nil && *c.RestartPolicy == v1.ContainerRestartPolicyAlways
}

// initActions is the kubelet's computeInitContainerActions for a live
// sandbox: it fills act with the init containers to (re)start and kill, and
// reports whether the pod is initialized, so its app containers may run.
// The init containers are walked from the last, since a completed one may
// have been removed from the runtime; the newest one found tells how far
// initialization went.
func initActions(pod *v1.Pod, status *PodStatus, apps, inits map[string]*ContainerStatus, probes ProbeResults, act *podActions) bool {
	specs := pod.Spec.InitContainers
	if len(specs) == 0 {
		return true
	}
	// A regular container created or running, or one made in the current
	// sandbox (the kubelet counts only the former, and so restarts the
	// exited sidecars of a completed job once), means every init container
	// ran at some point, even if its record is gone.
	initialized := false
	for i := range pod.Spec.Containers {
		s := apps[pod.Spec.Containers[i].Name]
		if s != nil && (s.State == ContainerRunning || s.State == ContainerCreated ||
			(len(status.Sandboxes) > 0 && !s.CreatedAt.Before(status.Sandboxes[0].CreatedAt))) {
			initialized = true
			break
		}
	}
	previously := initialized // the init containers before the current one ran
	var start []int
	for i := len(specs) - 1; i >= 0; i-- {
		ic := &specs[i]
		sidecar := IsSidecar(ic)
		s := inits[ic.Name]
		if s == nil {
			if previously && sidecar {
				start = append(start, i) // its record is gone: start it again
			}
			continue
		}
		if previously && !sidecar {
			continue // after initialization only sidecars are kept running
		}
		switch {
		case s.State == ContainerRunning && !sidecar:
			// wait for it to complete
		case s.State == ContainerRunning:
			if s.SpecHash != "" && s.SpecHash != HashContainer(ic) {
				act.ContainersToKill[s.ID] = killReason{Name: ic.Name, Reason: ReasonContainerSpecChanged, Restart: true, Init: true}
				start = append(start, i)
				break
			}
			if why := probeFailure(ic, s, probes); why != ReasonNone {
				act.ContainersToKill[s.ID] = killReason{Name: ic.Name, Reason: why, Restart: true, Init: true}
				start = append(start, i)
				break
			}
			if !Started(ic, s, probes) {
				break // its startup probe has not passed yet: the rest wait
			}
			if i == len(specs)-1 {
				initialized = true
			} else if !previously {
				start = append(start, i+1) // started for the first time: the next one goes
			}
		case s.State == ContainerExited && sidecar:
			start = append(start, i)
		case s.State == ContainerExited && s.ExitCode != 0:
			if pod.Spec.RestartPolicy == v1.RestartPolicyNever {
				act.PodFailed, act.KillPod = true, true
				act.Reason, act.FailedInit = ReasonInitFailed, ic.Name
				act.InitToStart = nil
				return false
			}
			start = append(start, i)
		case s.State == ContainerExited:
			if i == len(specs)-1 {
				initialized = true
			} else {
				start = append(start, i+1)
			}
		default: // created but never started, or unknown: start over
			act.ContainersToKill[s.ID] = killReason{Name: ic.Name, Reason: ReasonContainerNotRunning, State: s.State, Init: true, Restart: sidecar}
			start = append(start, i)
		}
		previously = true
	}
	if !previously {
		start = append(start, 0) // nothing ran yet: the first one
	}
	slices.Reverse(start)
	act.InitToStart = slices.Compact(start)
	return initialized
}
