package cri

import (
	v1 "k8s.io/api/core/v1"
)

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
	// NextInit is the index of the init container to start, or -1.
	NextInit int
	// ContainersToStart are indexes into pod.Spec.Containers.
	ContainersToStart []int
	// ContainersToKill maps container IDs to the reason.
	ContainersToKill map[string]killReason
	// Reason says why the sandbox (re)starts or the pod is killed.
	Reason string
}

type killReason struct {
	Name    string
	Message string
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

// computePodActions is a lean version of the kubelet's computePodActions.
func computePodActions(pod *v1.Pod, status *PodStatus) podActions {
	if status == nil {
		status = &PodStatus{}
	}
	act := podActions{NextInit: -1, ContainersToKill: map[string]killReason{}}
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
		act.CreateSandbox, act.Reason = true, "no sandbox"
	case !status.Sandboxes[0].Ready:
		act.CreateSandbox, act.Reason = true, "sandbox is not ready"
		act.SandboxAttempt = status.Sandboxes[0].Attempt + 1
	case readySandboxes > 1:
		act.CreateSandbox, act.Reason = true, "more than one ready sandbox"
		act.SandboxAttempt = status.Sandboxes[0].Attempt + 1
	case status.Sandboxes[0].SpecHash != wantHash:
		act.CreateSandbox, act.Reason = true, "sandbox spec changed"
		act.SandboxAttempt = status.Sandboxes[0].Attempt + 1
	default:
		act.SandboxID = status.Sandboxes[0].ID
	}

	if act.CreateSandbox {
		act.KillPod = len(status.Sandboxes) > 0 || len(status.Containers) > 0
		// A finished pod that must not restart gets no new sandbox.
		if pod.Spec.RestartPolicy == v1.RestartPolicyNever && act.SandboxAttempt != 0 &&
			len(status.Containers) > 0 && act.Reason == "sandbox is not ready" {
			act.CreateSandbox = false
			return act
		}
		if len(pod.Spec.InitContainers) > 0 {
			act.NextInit = 0
			return act
		}
		for i := range pod.Spec.Containers {
			c := apps[pod.Spec.Containers[i].Name]
			if pod.Spec.RestartPolicy == v1.RestartPolicyOnFailure && c != nil &&
				c.State == ContainerExited && c.ExitCode == 0 {
				continue
			}
			act.ContainersToStart = append(act.ContainersToStart, i)
		}
		if len(act.ContainersToStart) == 0 {
			act.CreateSandbox = false
		}
		return act
	}

	// Init containers run one at a time, in order, to success.
	for i := range pod.Spec.InitContainers {
		ic := &pod.Spec.InitContainers[i]
		s := inits[ic.Name]
		switch {
		case s == nil:
			act.NextInit = i
			return act
		case s.State == ContainerRunning:
			return act // wait for it
		case s.State == ContainerExited && s.ExitCode == 0:
			continue
		case s.State == ContainerExited:
			if pod.Spec.RestartPolicy == v1.RestartPolicyNever {
				act.PodFailed, act.KillPod = true, true
				act.Reason = "init container " + ic.Name + " failed"
				return act
			}
			act.NextInit = i
			return act
		default: // created but never started, or unknown: start over
			act.ContainersToKill[s.ID] = killReason{ic.Name, "init container is in state " + string(s.State)}
			act.NextInit = i
			return act
		}
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
				act.ContainersToKill[s.ID] = killReason{c.Name, "container spec changed, will be restarted"}
				act.ContainersToStart = append(act.ContainersToStart, i)
				continue
			}
			keep++
		case s.State == ContainerExited:
			if shouldRestart(pod.Spec.RestartPolicy, s) {
				act.ContainersToStart = append(act.ContainersToStart, i)
			}
		default:
			act.ContainersToKill[s.ID] = killReason{c.Name, "container is in state " + string(s.State) + ", will be restarted"}
			act.ContainersToStart = append(act.ContainersToStart, i)
		}
	}
	// Nothing left to run: stop the sandbox too.
	if keep == 0 && len(act.ContainersToStart) == 0 {
		act.KillPod = true
		act.Reason = "all containers have terminated"
	}
	return act
}
