// Package podstatus turns what the container runtime reports about a pod into
// the Kubernetes v1.PodStatus mqlet publishes, following the kubelet's
// generateAPIPodStatus / getPhase / condition generators. Everything here is a
// pure function of its inputs: no I/O, no clocks, no globals.
package podstatus

import (
	"net"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	v1qos "k8s.io/kubernetes/pkg/apis/core/v1/helper/qos"

	"github.com/mqlet/mqlet/cri"
)

// Waiting reasons the kubelet uses for containers that are not running yet.
const (
	ReasonContainerCreating = "ContainerCreating"
	ReasonPodInitializing   = "PodInitializing"
	ReasonCrashLoopBackOff  = "CrashLoopBackOff"

	// ReasonContainerStatusUnknown is the terminated reason for a container
	// that was running and can no longer be found in the cri.
	ReasonContainerStatusUnknown = "ContainerStatusUnknown"
	// ReasonRuntimeUnreachable marks Ready/ContainersReady False while the
	// container runtime cannot be asked.
	ReasonRuntimeUnreachable = "ContainerRuntimeUnreachable"
)

// Condition reasons, as the kubelet's status package spells them.
const (
	condPodCompleted             = "PodCompleted"
	condPodFailed                = "PodFailed"
	condContainersNotReady       = "ContainersNotReady"
	condContainersNotInitialized = "ContainersNotInitialized"
	condReadinessGatesNotReady   = "ReadinessGatesNotReady"
	condPodSandboxNotReady       = "PodSandboxNotReady"
)

// Waiting is why a container is not running, as the agent saw it in its last
// sync (the kubelet keeps these in its reasonCache).
type Waiting struct {
	Reason  string
	Message string
}

// Hints carries what only the agent knows and the runtime cannot tell.
type Hints struct {
	// RuntimeName prefixes container IDs: "<RuntimeName>://<id>".
	// Empty means "containerd".
	RuntimeName string
	// Waiting holds, per container name, why that container is not running
	// (CrashLoopBackOff, ErrImageNeverPull, CreateContainerConfigError, ...).
	// It is applied only to containers that the restart policy would start
	// again, as the kubelet does.
	Waiting map[string]Waiting
	// HostIPs are the node's addresses, primary first.
	HostIPs []string
	// Previous is the last status built for this pod. It keeps StartTime,
	// conditions' LastTransitionTime and terminal phases stable. Pass nil
	// when the agent deliberately starts the pod afresh (new spec, restart).
	Previous *v1.PodStatus
	// Probes holds the prober's view of each probed running container, by
	// runtime container ID (without the "<runtime>://" prefix). A container
	// with a startup or readiness probe missing here is neither started
	// nor ready.
	Probes map[string]Probed
	// RuntimeUnreachable says the runtime could not be asked; the runtime
	// status passed to Build is then ignored and the previous view is kept
	// with every container marked not ready.
	RuntimeUnreachable bool
	// Terminal says the agent is stopping the pod for good (deleted,
	// deadline): containers will not be restarted, so the phase becomes
	// Succeeded or Failed once all of them have stopped.
	Terminal bool
	// FailReason, when set, forces phase Failed with this reason and
	// FailMessage (admission rejections such as "UnexpectedAdmissionError").
	FailReason  string
	FailMessage string
}

func (h Hints) runtimeName() string {
	if h.RuntimeName == "" {
		return "containerd"
	}
	return h.RuntimeName
}

// Build returns the API status of pod given the runtime's view rs (nil when
// the runtime knows nothing of it), the agent's hints and the current time.
func Build(pod *v1.Pod, rs *cri.PodStatus, hints Hints, now time.Time) v1.PodStatus {
	now = now.UTC().Truncate(time.Second)
	var old v1.PodStatus
	if hints.Previous != nil {
		old = *hints.Previous.DeepCopy()
	} else {
		old = *pod.Status.DeepCopy()
	}
	if hints.RuntimeUnreachable {
		return unreachableStatus(pod, old, hints, now)
	}
	if rs == nil {
		rs = &cri.PodStatus{}
	}

	var s v1.PodStatus
	hasInit := len(pod.Spec.InitContainers) > 0
	s.InitContainerStatuses = containerStatuses(pod, rs, hints, old.InitContainerStatuses, pod.Spec.InitContainers, hasInit, true)
	s.ContainerStatuses = containerStatuses(pod, rs, hints, old.ContainerStatuses, pod.Spec.Containers, hasInit, false)
	setProbeResults(pod, &s, hints)

	all := append(append([]v1.ContainerStatus{}, s.ContainerStatuses...), s.InitContainerStatuses...)
	s.Phase = phase(pod, all, hints.Terminal, anyActiveRegularContainer(pod, rs), replacedContainers(pod, rs))

	// A pod never leaves a terminal phase (kubelet's three-way merge).
	if s.Phase != v1.PodFailed && s.Phase != v1.PodSucceeded {
		switch {
		case old.Phase == v1.PodFailed || old.Phase == v1.PodSucceeded:
			s.Phase = old.Phase
		case pod.Status.Phase == v1.PodFailed || pod.Status.Phase == v1.PodSucceeded:
			s.Phase = pod.Status.Phase
		}
	}
	if s.Phase == old.Phase {
		s.Reason, s.Message = old.Reason, old.Message
	}
	if hints.FailReason != "" {
		s.Phase, s.Reason, s.Message = v1.PodFailed, hints.FailReason, hints.FailMessage
	}

	s.QOSClass = v1qos.GetPodQOS(pod)
	setIPs(pod, rs, hints, old, &s)
	s.Conditions = conditions(pod, old, &s, sandboxReady(rs), now)
	s.StartTime = startTime(old, rs, now)
	s.ObservedGeneration = pod.Generation
	capTerminationMessages(pod, &s)
	normalizeTimes(&s)
	return s
}

// unreachableStatus keeps what was last known, since the runtime cannot say
// otherwise, but stops claiming readiness.
func unreachableStatus(pod *v1.Pod, old v1.PodStatus, hints Hints, now time.Time) v1.PodStatus {
	if old.Phase == "" {
		// Nothing known yet: report it as not started.
		h := hints
		h.RuntimeUnreachable = false
		old = Build(pod, nil, h, now)
	}
	s := old
	for i := range s.ContainerStatuses {
		s.ContainerStatuses[i].Ready = false
	}
	for i := range s.InitContainerStatuses {
		if s.InitContainerStatuses[i].State.Terminated == nil {
			s.InitContainerStatuses[i].Ready = false
		}
	}
	msg := "the container runtime cannot be reached"
	for _, t := range []v1.PodConditionType{v1.ContainersReady, v1.PodReady} {
		c := v1.PodCondition{Type: t, Status: v1.ConditionFalse, Reason: ReasonRuntimeUnreachable, Message: msg, ObservedGeneration: pod.Generation}
		s.Conditions = replaceCondition(s.Conditions, c, old.Conditions, now)
	}
	if hints.FailReason != "" {
		s.Phase, s.Reason, s.Message = v1.PodFailed, hints.FailReason, hints.FailMessage
	}
	s.StartTime = startTime(old, nil, now)
	s.ObservedGeneration = pod.Generation
	normalizeTimes(&s)
	return s
}

// startTime keeps the previous start time unless a sandbox still known to
// the runtime is older: after mqlet restarted, the oldest sandbox tells
// when the pod started, so adopting a running pod does not make it look
// new (nor restart its activeDeadlineSeconds).
func startTime(old v1.PodStatus, rs *cri.PodStatus, now time.Time) *metav1.Time {
	t := metav1.NewTime(now)
	if old.StartTime != nil && !old.StartTime.IsZero() {
		// An older sandbox was made before mqlet restarted (its first
		// status, built before the runtime answered, said "now").
		t = *old.StartTime.DeepCopy()
	}
	if rs != nil {
		for _, sb := range rs.Sandboxes {
			if !sb.CreatedAt.IsZero() && sb.CreatedAt.Before(t.Time) {
				t = metav1.NewTime(sb.CreatedAt)
			}
		}
	}
	return &t
}

// newestReadySandbox is the newest sandbox if it is ready (the kubelet only
// trusts the IPs of the current sandbox).
func newestReadySandbox(rs *cri.PodStatus) *cri.SandboxStatus {
	if len(rs.Sandboxes) == 0 || !rs.Sandboxes[0].Ready {
		return nil
	}
	return &rs.Sandboxes[0]
}

func sandboxReady(rs *cri.PodStatus) bool { return newestReadySandbox(rs) != nil }

// anyActiveRegularContainer reports whether a regular container was created
// in the current sandbox, which means initialization finished.
func anyActiveRegularContainer(pod *v1.Pod, rs *cri.PodStatus) bool {
	if len(rs.Sandboxes) == 0 {
		return false
	}
	since := rs.Sandboxes[0].CreatedAt
	regular := make(map[string]bool, len(pod.Spec.Containers))
	for _, c := range pod.Spec.Containers {
		regular[c.Name] = true
	}
	for _, c := range rs.Containers {
		if regular[c.Name] && !c.Init && !c.CreatedAt.Before(since) {
			return true
		}
	}
	return false
}

func setIPs(pod *v1.Pod, rs *cri.PodStatus, hints Hints, old v1.PodStatus, s *v1.PodStatus) {
	for _, ip := range hints.HostIPs {
		s.HostIPs = append(s.HostIPs, v1.HostIP{IP: ip})
	}
	if len(s.HostIPs) > 0 {
		s.HostIP = s.HostIPs[0].IP
	}

	var ips []string
	switch {
	case pod.Spec.HostNetwork:
		ips = hints.HostIPs
	case newestReadySandbox(rs) != nil:
		sb := newestReadySandbox(rs)
		ips = sb.IPs
		if len(ips) == 0 && sb.IP != "" {
			ips = []string{sb.IP}
		}
	}
	ips = sortIPs(ips, hints.HostIPs)
	if len(ips) == 0 {
		// Pod IPs stay once assigned, even when the sandbox has stopped
		// (a Completed pod still shows the IP it had).
		s.PodIP, s.PodIPs = old.PodIP, old.PodIPs
		return
	}
	for _, ip := range ips {
		s.PodIPs = append(s.PodIPs, v1.PodIP{IP: ip})
	}
	s.PodIP = s.PodIPs[0].IP
}

// sortIPs keeps at most one IP of each family, the node's family first, as
// kubelet's sortPodIPs does.
func sortIPs(ips, hostIPs []string) []string {
	primaryV4 := true
	if len(hostIPs) > 0 {
		if ip := net.ParseIP(hostIPs[0]); ip != nil && ip.To4() == nil {
			primaryV4 = false
		}
	}
	pick := func(v4 bool) string {
		for _, s := range ips {
			ip := net.ParseIP(s)
			if ip == nil {
				continue
			}
			if (ip.To4() != nil) == v4 {
				return ip.String()
			}
		}
		return ""
	}
	var out []string
	if ip := pick(primaryV4); ip != "" {
		out = append(out, ip)
	}
	if ip := pick(!primaryV4); ip != "" {
		out = append(out, ip)
	}
	return out
}

// normalizeTimes truncates every timestamp to seconds, the precision they
// have on the wire, so a status rebuilt from a decoded one compares equal.
func normalizeTimes(s *v1.PodStatus) {
	trunc := func(t *metav1.Time) {
		if t != nil {
			*t = t.Rfc3339Copy()
		}
	}
	trunc(s.StartTime)
	for i := range s.Conditions {
		trunc(&s.Conditions[i].LastTransitionTime)
		trunc(&s.Conditions[i].LastProbeTime)
	}
	for _, list := range [][]v1.ContainerStatus{s.ContainerStatuses, s.InitContainerStatuses} {
		for i := range list {
			for _, st := range []*v1.ContainerState{&list[i].State, &list[i].LastTerminationState} {
				if st.Running != nil {
					trunc(&st.Running.StartedAt)
				}
				if st.Terminated != nil {
					trunc(&st.Terminated.StartedAt)
					trunc(&st.Terminated.FinishedAt)
				}
			}
		}
	}
}
