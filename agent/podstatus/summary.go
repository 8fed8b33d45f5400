package podstatus

import (
	"fmt"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
)

// Equal reports whether a and b would publish the same status: it compares
// values deeply (times by instant, quantities by value), never pointers.
func Equal(a, b v1.PodStatus) bool {
	return equality.Semantic.DeepEqual(a, b)
}

// definiteErrors are waiting reasons that no retry will cure without a new
// spec or new objects.
var definiteErrors = map[string]bool{
	"ErrImageNeverPull":          true,
	"InvalidImageName":           true,
	"CreateContainerConfigError": true,
}

// IsDefiniteError reports whether a container waiting for reason will not
// start without the operator changing something.
func IsDefiniteError(reason string) bool { return definiteErrors[reason] }

// IsRunningOrDone says whether an apply of pod can be answered yet: done is
// false while it is still on its way; when done, ok tells succeeded (every
// container running, or phase Succeeded) from failed (phase Failed, or a
// container waiting on a definite error). reason is a readable explanation.
func IsRunningOrDone(st v1.PodStatus, pod *v1.Pod) (done bool, ok bool, reason string) {
	switch st.Phase {
	case v1.PodSucceeded:
		return true, true, "pod succeeded"
	case v1.PodFailed:
		return true, false, "pod failed: " + failureDetail(st)
	}
	for _, list := range [][]v1.ContainerStatus{st.InitContainerStatuses, st.ContainerStatuses} {
		for _, cs := range list {
			if w := cs.State.Waiting; w != nil && IsDefiniteError(w.Reason) {
				return true, false, containerWaitingText(cs.Name, w)
			}
		}
	}
	if st.Phase == v1.PodRunning && allRunning(pod, st) {
		// Running now, and how each got there: a container that was
		// killed (OOMKilled at once) and started again is not just running.
		msg := fmt.Sprintf("all %d containers running", len(pod.Spec.Containers))
		for _, cs := range st.ContainerStatuses {
			if t := cs.LastTerminationState.Terminated; t != nil && cs.RestartCount > 0 {
				times := "times"
				if cs.RestartCount == 1 {
					times = "time"
				}
				msg += fmt.Sprintf("; container %s restarted %d %s, last ended %s (exit code %d)", cs.Name, cs.RestartCount, times, t.Reason, t.ExitCode)
			}
		}
		return true, true, msg
	}
	return false, false, pendingDetail(pod, st)
}

func allRunning(pod *v1.Pod, st v1.PodStatus) bool {
	if len(pod.Spec.Containers) == 0 {
		return false
	}
	for _, c := range pod.Spec.Containers {
		cs, ok := findStatus(st.ContainerStatuses, c.Name)
		if !ok || cs.State.Running == nil {
			return false
		}
	}
	return true
}

func containerWaitingText(name string, w *v1.ContainerStateWaiting) string {
	if w.Message == "" {
		return fmt.Sprintf("container %s: %s", name, w.Reason)
	}
	return fmt.Sprintf("container %s: %s: %s", name, w.Reason, w.Message)
}

func failureDetail(st v1.PodStatus) string {
	if st.Reason != "" {
		if st.Message != "" {
			return st.Reason + ": " + st.Message
		}
		return st.Reason
	}
	var parts []string
	for _, list := range [][]v1.ContainerStatus{st.InitContainerStatuses, st.ContainerStatuses} {
		for _, cs := range list {
			t := cs.State.Terminated
			if t == nil {
				t = cs.LastTerminationState.Terminated
			}
			if t != nil && t.ExitCode != 0 {
				parts = append(parts, fmt.Sprintf("container %s %s (exit code %d)", cs.Name, t.Reason, t.ExitCode))
			}
		}
	}
	if len(parts) == 0 {
		return "no reason recorded"
	}
	return strings.Join(parts, ", ")
}

func pendingDetail(pod *v1.Pod, st v1.PodStatus) string {
	var parts []string
	for _, list := range [][]v1.ContainerStatus{st.InitContainerStatuses, st.ContainerStatuses} {
		for _, cs := range list {
			if w := cs.State.Waiting; w != nil && w.Reason != "" {
				parts = append(parts, containerWaitingText(cs.Name, w))
			}
		}
	}
	phase := st.Phase
	if phase == "" {
		phase = v1.PodPending
	}
	if len(parts) == 0 {
		return "pod " + string(phase)
	}
	return "pod " + string(phase) + ": " + strings.Join(parts, "; ")
}

// Message summarises a status the way kubectl's STATUS column does, with
// readiness and restarts: "CrashLoopBackOff (0/1 ready, 5 restarts)".
func Message(pod *v1.Pod, st v1.PodStatus) string {
	reason := string(st.Phase)
	if reason == "" {
		reason = string(v1.PodPending)
	}
	if st.Reason != "" {
		reason = st.Reason
	}
	restarts := 0
	initializing := false
	for i, cs := range st.InitContainerStatuses {
		restarts += int(cs.RestartCount)
		if t := cs.State.Terminated; t != nil && t.ExitCode == 0 {
			continue
		}
		if i < len(pod.Spec.InitContainers) && isRestartableInit(&pod.Spec.InitContainers[i]) && cs.Started != nil && *cs.Started {
			continue
		}
		switch {
		case cs.State.Terminated != nil:
			reason = "Init:" + terminatedText(cs.State.Terminated)
		case cs.State.Waiting != nil && cs.State.Waiting.Reason != "" && cs.State.Waiting.Reason != ReasonPodInitializing:
			reason = "Init:" + cs.State.Waiting.Reason
		default:
			reason = fmt.Sprintf("Init:%d/%d", i, len(pod.Spec.InitContainers))
		}
		initializing = true
		break
	}
	ready := 0
	if !initializing {
		restarts = 0
		hasRunning := false
		for i := len(st.ContainerStatuses) - 1; i >= 0; i-- {
			cs := st.ContainerStatuses[i]
			restarts += int(cs.RestartCount)
			switch {
			case cs.State.Waiting != nil && cs.State.Waiting.Reason != "":
				reason = cs.State.Waiting.Reason
			case cs.State.Terminated != nil:
				reason = terminatedText(cs.State.Terminated)
			case cs.State.Running != nil && cs.Ready:
				hasRunning = true
				ready++
			}
		}
		if reason == "Completed" && hasRunning {
			reason = string(v1.PodRunning)
		}
	}
	if pod.DeletionTimestamp != nil {
		reason = "Terminating"
	}
	restartWord := "restarts"
	if restarts == 1 {
		restartWord = "restart"
	}
	return fmt.Sprintf("%s (%d/%d ready, %d %s)", reason, ready, len(pod.Spec.Containers), restarts, restartWord)
}

func terminatedText(t *v1.ContainerStateTerminated) string {
	switch {
	case t.Reason != "":
		return t.Reason
	case t.Signal != 0:
		return fmt.Sprintf("Signal:%d", t.Signal)
	default:
		return fmt.Sprintf("ExitCode:%d", t.ExitCode)
	}
}
