package podstatus

import (
	"sort"
	"strings"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/mqlet/mqlet/cri"
)

// containerStatuses builds one status per spec container, in spec order, the
// way kubelet's convertToAPIContainerStatuses does.
func containerStatuses(pod *v1.Pod, rs *cri.PodStatus, hints Hints, previous []v1.ContainerStatus, specs []v1.Container, hasInit, isInit bool) []v1.ContainerStatus {
	if len(specs) == 0 {
		return nil
	}
	oldByName := make(map[string]v1.ContainerStatus, len(previous))
	for _, st := range previous {
		oldByName[st.Name] = st
	}
	defaultWaiting := ReasonContainerCreating
	if hasInit {
		defaultWaiting = ReasonPodInitializing
	}

	attempts := attemptsByName(rs, isInit)
	out := make([]v1.ContainerStatus, 0, len(specs))
	for i := range specs {
		spec := &specs[i]
		old, hadOld := oldByName[spec.Name]
		st := v1.ContainerStatus{
			Name:  spec.Name,
			Image: spec.Image,
			State: v1.ContainerState{Waiting: &v1.ContainerStateWaiting{Reason: defaultWaiting}},
		}
		if hadOld {
			if old.State.Terminated != nil {
				st = *old.DeepCopy()
			} else {
				st.RestartCount = old.RestartCount
				st.LastTerminationState = *old.LastTerminationState.DeepCopy()
			}
		}

		tries := attempts[spec.Name]
		switch {
		case len(tries) > 0:
			var oldPtr *v1.ContainerStatus
			if hadOld {
				oldPtr = &old
			}
			st = convertAttempt(spec, &tries[0], oldPtr, hints)
			if len(tries) > 1 {
				prev := convertAttempt(spec, &tries[1], nil, hints)
				st.LastTerminationState = prev.State
			}
		case hadOld && old.State.Running != nil && st.LastTerminationState.Terminated == nil:
			// It was running and has vanished from the runtime: show it as
			// stopped rather than never started, or the pod would fall back
			// to Pending.
			st.LastTerminationState.Terminated = &v1.ContainerStateTerminated{
				Reason:   ReasonContainerStatusUnknown,
				Message:  "The container could not be located when the pod was deleted.  The container used to be Running",
				ExitCode: 137,
			}
			if pod.DeletionTimestamp == nil {
				st.RestartCount++
			}
		}

		var newest *cri.ContainerStatus
		if len(tries) > 0 {
			newest = &tries[0]
		}
		if isInit && newest != nil && newest.State == cri.ContainerExited && newest.ExitCode == 0 {
			out = append(out, st)
			continue
		}
		if isInit && newest == nil && !isRestartableInit(spec) && anyRegularContainerCreated(pod, rs) && st.State.Waiting != nil {
			// The init container was removed after it ran: regular
			// containers exist only once every init container succeeded.
			st.State = v1.ContainerState{Terminated: &v1.ContainerStateTerminated{
				Reason:   "Completed",
				Message:  "Unable to get init container status from container runtime and pod has been initialized, treat it as exited normally",
				ExitCode: 0,
			}}
			out = append(out, st)
			continue
		}
		if w, ok := hints.Waiting[spec.Name]; ok && w.Reason != "" && shouldRestart(pod, spec, newest) {
			if st.State.Terminated != nil {
				st.LastTerminationState = st.State
			}
			st.State = v1.ContainerState{Waiting: &v1.ContainerStateWaiting{Reason: w.Reason, Message: w.Message}}
		}
		out = append(out, st)
	}
	return out
}

// attemptsByName groups the runtime's attempts per container, newest first.
func attemptsByName(rs *cri.PodStatus, isInit bool) map[string][]cri.ContainerStatus {
	out := map[string][]cri.ContainerStatus{}
	for _, c := range rs.Containers {
		if c.Init != isInit {
			continue
		}
		out[c.Name] = append(out[c.Name], c)
	}
	for name := range out {
		list := out[name]
		sort.SliceStable(list, func(i, j int) bool { return list[i].CreatedAt.After(list[j].CreatedAt) })
	}
	return out
}

func convertAttempt(spec *v1.Container, c *cri.ContainerStatus, old *v1.ContainerStatus, hints Hints) v1.ContainerStatus {
	id := hints.runtimeName() + "://" + c.ID
	st := v1.ContainerStatus{
		Name:         spec.Name,
		RestartCount: int32(c.RestartCount),
		Image:        displayImage(spec, c),
		ImageID:      c.ImageRef,
		ContainerID:  id,
	}
	switch c.State {
	case cri.ContainerRunning:
		st.State.Running = &v1.ContainerStateRunning{StartedAt: metav1.NewTime(c.StartedAt)}
	case cri.ContainerCreated:
		// Created but not started: "waiting to be running".
		st.State.Waiting = &v1.ContainerStateWaiting{}
	case cri.ContainerExited:
		st.State.Terminated = &v1.ContainerStateTerminated{
			ExitCode:    c.ExitCode,
			Reason:      exitReason(c),
			Message:     c.Message,
			StartedAt:   metav1.NewTime(c.StartedAt),
			FinishedAt:  metav1.NewTime(c.FinishedAt),
			ContainerID: id,
		}
	default:
		if old != nil && old.State.Running != nil {
			// It was running; "never ran" and "ran and was lost" differ.
			st.State.Terminated = &v1.ContainerStateTerminated{
				Reason:   ReasonContainerStatusUnknown,
				Message:  "The container could not be located when the pod was terminated",
				ExitCode: 137,
			}
			st.RestartCount = old.RestartCount + 1
		} else {
			st.State.Waiting = &v1.ContainerStateWaiting{}
		}
	}
	return st
}

// displayImage prefers the image the user asked for over a bare image ID.
func displayImage(spec *v1.Container, c *cri.ContainerStatus) string {
	if c.Image == "" || strings.HasPrefix(c.Image, "sha256:") {
		return spec.Image
	}
	return c.Image
}

func exitReason(c *cri.ContainerStatus) string {
	switch {
	case c.Reason != "":
		return c.Reason
	case c.ExitCode == 0:
		return "Completed"
	default:
		return "Error"
	}
}

func isRestartableInit(c *v1.Container) bool {
	return c.RestartPolicy != nil && *c.RestartPolicy == v1.ContainerRestartPolicyAlways
}

// containerShouldRestart applies the container's own restart policy, else
// the pod's (Always when unset), to an exit code.
func containerShouldRestart(c *v1.Container, spec *v1.PodSpec, exitCode int32) bool {
	if c.RestartPolicy != nil {
		switch *c.RestartPolicy {
		case v1.ContainerRestartPolicyAlways:
			return true
		case v1.ContainerRestartPolicyOnFailure:
			return exitCode != 0
		case v1.ContainerRestartPolicyNever:
			return false
		}
	}
	switch spec.RestartPolicy {
	case v1.RestartPolicyOnFailure:
		return exitCode != 0
	case v1.RestartPolicyNever:
		return false
	default:
		return true
	}
}

// shouldRestart mirrors kubelet's ShouldContainerBeRestarted: whether the
// next sync would start this container (so a waiting reason applies to it).
func shouldRestart(pod *v1.Pod, spec *v1.Container, newest *cri.ContainerStatus) bool {
	if pod.DeletionTimestamp != nil {
		return false
	}
	if newest == nil {
		return true
	}
	switch newest.State {
	case cri.ContainerRunning:
		return false
	case cri.ContainerExited:
		return cri.OfOlderSpec(spec, newest) || containerShouldRestart(spec, &pod.Spec, newest.ExitCode)
	default:
		return true
	}
}

// replacedContainers names the app containers whose current spec has not
// finished a run (see phase): the newest attempt was made from an older
// spec, or it is the current spec's, created but never started (the agent
// died between CreateContainer and StartContainer), after an attempt of an
// older spec: the exit shown as its last termination is the old spec's.
func replacedContainers(pod *v1.Pod, rs *cri.PodStatus) map[string]bool {
	var out map[string]bool
	newest := attemptsByName(rs, false)
	for i := range pod.Spec.Containers {
		spec := &pod.Spec.Containers[i]
		tries := newest[spec.Name]
		if len(tries) == 0 {
			continue
		}
		notStarted := tries[0].State == cri.ContainerCreated
		if cri.OfOlderSpec(spec, &tries[0]) || (notStarted && len(tries) > 1 && cri.OfOlderSpec(spec, &tries[1])) {
			if out == nil {
				out = map[string]bool{}
			}
			out[spec.Name] = true
		}
	}
	return out
}

func anyRegularContainerCreated(pod *v1.Pod, rs *cri.PodStatus) bool {
	for _, spec := range pod.Spec.Containers {
		for _, c := range rs.Containers {
			if !c.Init && c.Name == spec.Name {
				return true
			}
		}
	}
	return false
}

// Probed is what the prober says of one running container attempt.
type Probed struct {
	Started bool // its startup probe succeeded (or it has none)
	Ready   bool // started, and its readiness probe succeeded (or it has none)
}

// setProbeResults fills Started and Ready as the kubelet does: a running
// container without probes is started and ready; one with a startup or
// readiness probe is so only once the prober says so (hints.Probes, by
// runtime container ID); a regular init container is ready once it exited 0.
func setProbeResults(pod *v1.Pod, s *v1.PodStatus, hints Hints) {
	prefix := hints.runtimeName() + "://"
	probed := func(c *v1.Container, cs *v1.ContainerStatus) {
		running := cs.State.Running != nil
		started, ready := running, running
		if running && (c.StartupProbe != nil || c.ReadinessProbe != nil) {
			p := hints.Probes[strings.TrimPrefix(cs.ContainerID, prefix)]
			if c.StartupProbe != nil {
				started = p.Started
			}
			ready = started && (c.ReadinessProbe == nil || p.Ready)
		}
		cs.Started, cs.Ready = &started, ready
	}
	for i := range s.ContainerStatuses {
		probed(&pod.Spec.Containers[i], &s.ContainerStatuses[i])
	}
	for i := range s.InitContainerStatuses {
		cs := &s.InitContainerStatuses[i]
		if c := &pod.Spec.InitContainers[i]; isRestartableInit(c) {
			probed(c, cs)
			continue
		}
		started := cs.State.Running != nil
		cs.Started = &started
		cs.Ready = cs.State.Terminated != nil && cs.State.Terminated.ExitCode == 0
	}
}
