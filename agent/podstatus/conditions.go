package podstatus

import (
	"fmt"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// kubeletOwned are the condition types Build computes; any other condition
// already on the pod (readiness gates set by someone else) is kept as is.
var kubeletOwned = map[v1.PodConditionType]bool{
	v1.PodScheduled:              true,
	v1.PodReady:                  true,
	v1.PodInitialized:            true,
	v1.ContainersReady:           true,
	v1.PodReadyToStartContainers: true,
}

// conditions returns the pod's conditions in the kubelet's order, keeping a
// condition's LastTransitionTime when its status did not change.
func conditions(pod *v1.Pod, old v1.PodStatus, s *v1.PodStatus, sandboxReady bool, now time.Time) []v1.PodCondition {
	var out []v1.PodCondition
	for _, c := range pod.Status.Conditions {
		if !kubeletOwned[c.Type] {
			out = append(out, *c.DeepCopy())
		}
	}
	gen := pod.Generation
	all := append(append([]v1.ContainerStatus{}, s.InitContainerStatuses...), s.ContainerStatuses...)

	readyToStart := v1.PodCondition{Type: v1.PodReadyToStartContainers, Status: v1.ConditionTrue, ObservedGeneration: gen}
	if !sandboxReady {
		readyToStart.Status = v1.ConditionFalse
		readyToStart.Reason = condPodSandboxNotReady
	}
	containersReady := containersReadyCondition(pod, all, s.Phase)
	generated := []v1.PodCondition{
		readyToStart,
		initializedCondition(pod, all, s.Phase),
		readyCondition(pod, out, containersReady),
		containersReady,
		{Type: v1.PodScheduled, Status: v1.ConditionTrue},
	}
	for _, c := range generated {
		c.ObservedGeneration = gen
		out = replaceCondition(out, c, old.Conditions, now)
	}
	return out
}

// replaceCondition puts c into list (replacing one of its type), taking its
// LastTransitionTime from previous when the status is unchanged.
func replaceCondition(list []v1.PodCondition, c v1.PodCondition, previous []v1.PodCondition, now time.Time) []v1.PodCondition {
	c.LastTransitionTime = metav1.NewTime(now)
	for _, p := range previous {
		if p.Type == c.Type && p.Status == c.Status {
			c.LastTransitionTime = p.LastTransitionTime
		}
	}
	for i := range list {
		if list[i].Type == c.Type {
			list[i] = c
			return list
		}
	}
	return append(list, c)
}

func containersReadyCondition(pod *v1.Pod, statuses []v1.ContainerStatus, phase v1.PodPhase) v1.PodCondition {
	var unknown, unready []string
	check := func(name string) {
		st, ok := findStatus(statuses, name)
		switch {
		case !ok:
			unknown = append(unknown, name)
		case !st.Ready:
			unready = append(unready, name)
		}
	}
	for i := range pod.Spec.InitContainers {
		if isRestartableInit(&pod.Spec.InitContainers[i]) {
			check(pod.Spec.InitContainers[i].Name)
		}
	}
	for _, c := range pod.Spec.Containers {
		check(c.Name)
	}
	cond := v1.PodCondition{Type: v1.ContainersReady, Status: v1.ConditionFalse}
	switch {
	case phase == v1.PodSucceeded && len(unknown) == 0:
		cond.Reason = condPodCompleted
		return cond
	case phase == v1.PodFailed:
		cond.Reason = condPodFailed
		return cond
	}
	var msgs []string
	if len(unknown) > 0 {
		msgs = append(msgs, fmt.Sprintf("containers with unknown status: %v", unknown))
	}
	if len(unready) > 0 {
		msgs = append(msgs, fmt.Sprintf("containers with unready status: %v", unready))
	}
	if len(msgs) > 0 {
		cond.Reason = condContainersNotReady
		cond.Message = strings.Join(msgs, ", ")
		return cond
	}
	cond.Status = v1.ConditionTrue
	return cond
}

func readyCondition(pod *v1.Pod, others []v1.PodCondition, containersReady v1.PodCondition) v1.PodCondition {
	if containersReady.Status != v1.ConditionTrue {
		return v1.PodCondition{Type: v1.PodReady, Status: containersReady.Status, Reason: containersReady.Reason, Message: containersReady.Message}
	}
	var msgs []string
	for _, gate := range pod.Spec.ReadinessGates {
		found := false
		for _, c := range others {
			if c.Type != gate.ConditionType {
				continue
			}
			found = true
			if c.Status != v1.ConditionTrue {
				msgs = append(msgs, fmt.Sprintf("the status of pod readiness gate %q is not \"True\", but %v", string(gate.ConditionType), c.Status))
			}
		}
		if !found {
			msgs = append(msgs, fmt.Sprintf("corresponding condition of pod readiness gate %q does not exist.", string(gate.ConditionType)))
		}
	}
	if len(msgs) > 0 {
		return v1.PodCondition{Type: v1.PodReady, Status: v1.ConditionFalse, Reason: condReadinessGatesNotReady, Message: strings.Join(msgs, ", ")}
	}
	return v1.PodCondition{Type: v1.PodReady, Status: v1.ConditionTrue}
}

func initializedCondition(pod *v1.Pod, statuses []v1.ContainerStatus, phase v1.PodPhase) v1.PodCondition {
	var unknown, incomplete []string
	for i := range pod.Spec.InitContainers {
		c := &pod.Spec.InitContainers[i]
		st, ok := findStatus(statuses, c.Name)
		if !ok {
			unknown = append(unknown, c.Name)
			continue
		}
		done := st.Ready
		if isRestartableInit(c) {
			done = st.Started != nil && *st.Started
		}
		if !done {
			incomplete = append(incomplete, c.Name)
		}
	}
	cond := v1.PodCondition{Type: v1.PodInitialized, Status: v1.ConditionTrue}
	if phase == v1.PodSucceeded && len(unknown) == 0 {
		cond.Reason = condPodCompleted
		return cond
	}
	if anyRegularContainerStarted(pod, statuses) {
		return cond
	}
	var msgs []string
	if len(unknown) > 0 {
		msgs = append(msgs, fmt.Sprintf("containers with unknown status: %v", unknown))
	}
	if len(incomplete) > 0 {
		msgs = append(msgs, fmt.Sprintf("containers with incomplete status: %v", incomplete))
	}
	if len(msgs) > 0 {
		cond.Status = v1.ConditionFalse
		cond.Reason = condContainersNotInitialized
		cond.Message = strings.Join(msgs, ", ")
	}
	return cond
}

func anyRegularContainerStarted(pod *v1.Pod, statuses []v1.ContainerStatus) bool {
	for _, c := range pod.Spec.Containers {
		if st, ok := findStatus(statuses, c.Name); ok && (st.State.Running != nil || st.State.Terminated != nil) {
			return true
		}
	}
	return false
}
