package podstatus

import (
	v1 "k8s.io/api/core/v1"
)

func findStatus(statuses []v1.ContainerStatus, name string) (v1.ContainerStatus, bool) {
	for _, s := range statuses {
		if s.Name == name {
			return s, true
		}
	}
	return v1.ContainerStatus{}, false
}

// phase is kubelet's getPhase (with per-container restart policies, without
// restart rules): info holds regular and init container statuses, terminal
// says no container will be restarted, initialized says a regular container
// of the current sandbox exists. replaced names the app containers whose
// newest attempt is of an older spec: stopped for their replacement, they
// will be started again whatever the restart policy, and their exit never
// finishes the pod.
func phase(pod *v1.Pod, info []v1.ContainerStatus, terminal, initialized bool, replaced map[string]bool) v1.PodPhase {
	spec := &pod.Spec
	pendingRestartableInit := 0
	pendingRegularInit := 0
	failedInitNotRestartable := 0

	for i := range spec.InitContainers {
		c := &spec.InitContainers[i]
		if isRestartableInit(c) {
			continue
		}
		st, ok := findStatus(info, c.Name)
		if !ok {
			pendingRegularInit++
			continue
		}
		switch {
		case st.State.Running != nil:
			pendingRegularInit++
		case st.State.Terminated != nil:
			if code := st.State.Terminated.ExitCode; code != 0 && !containerShouldRestart(c, spec, code) {
				failedInitNotRestartable++
			}
		case st.State.Waiting != nil:
			if last := st.LastTerminationState.Terminated; last != nil {
				if last.ExitCode != 0 && !containerShouldRestart(c, spec, last.ExitCode) {
					failedInitNotRestartable++
				}
			} else {
				pendingRegularInit++
			}
		default:
			pendingRegularInit++
		}
	}

	unknown, running, waiting, stopped, stoppedNotRestartable, succeeded := 0, 0, 0, 0, 0, 0

	for i := range spec.InitContainers {
		c := &spec.InitContainers[i]
		if !isRestartableInit(c) {
			continue
		}
		st, ok := findStatus(info, c.Name)
		if !ok {
			unknown++
			continue
		}
		switch {
		case st.State.Running != nil:
			if st.Started == nil || !*st.Started {
				pendingRestartableInit++
			}
			running++
		case st.State.Terminated != nil:
			// Stopped sidecars do not count towards the phase.
		case st.State.Waiting != nil:
			if st.LastTerminationState.Terminated == nil {
				pendingRestartableInit++
				waiting++
			}
		default:
			pendingRestartableInit++
			unknown++
		}
	}

	for i := range spec.Containers {
		c := &spec.Containers[i]
		st, ok := findStatus(info, c.Name)
		if !ok {
			unknown++
			continue
		}
		switch {
		case st.State.Running != nil:
			running++
		case st.State.Terminated != nil:
			stopped++
			code := st.State.Terminated.ExitCode
			if !replaced[c.Name] && !containerShouldRestart(c, spec, code) {
				stoppedNotRestartable++
			}
			if code == 0 {
				succeeded++
			}
		case st.State.Waiting != nil:
			if last := st.LastTerminationState.Terminated; last != nil {
				stopped++
				if !replaced[c.Name] && !containerShouldRestart(c, spec, last.ExitCode) {
					stoppedNotRestartable++
				}
			} else {
				waiting++
			}
		default:
			unknown++
		}
	}

	if failedInitNotRestartable > 0 {
		return v1.PodFailed
	}
	switch {
	case pendingRegularInit > 0 || (pendingRestartableInit > 0 && !initialized):
		return v1.PodPending
	case waiting > 0:
		return v1.PodPending
	case running > 0 && unknown == 0:
		return v1.PodRunning
	case running == 0 && stopped > 0 && unknown == 0:
		if terminal {
			if stopped == succeeded {
				return v1.PodSucceeded
			}
			return v1.PodFailed
		}
		if stopped != stoppedNotRestartable {
			// At least one is on its way to a restart.
			return v1.PodRunning
		}
		if stopped == succeeded {
			return v1.PodSucceeded
		}
		return v1.PodFailed
	default:
		return v1.PodPending
	}
}
