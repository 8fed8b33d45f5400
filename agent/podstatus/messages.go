package podstatus

import (
	"unicode/utf8"

	v1 "k8s.io/api/core/v1"
)

// MaxPodTerminationMessageBytes is what all of a pod's termination
// messages may hold together (the kubelet's
// MaxPodTerminationMessageLogLength): each container's terminated message
// is cut to this divided by the number of containers of the pod.
const MaxPodTerminationMessageBytes = 12 * 1024

// capTerminationMessages cuts each terminated message of s to the
// container's share of MaxPodTerminationMessageBytes, as the kubelet's
// status manager does (at a character boundary, so the JSON stays what
// was written).
func capTerminationMessages(pod *v1.Pod, s *v1.PodStatus) {
	per := MaxPodTerminationMessageBytes
	if n := len(pod.Spec.Containers) + len(pod.Spec.InitContainers) + len(pod.Spec.EphemeralContainers); n > 0 {
		per /= n
	}
	for _, list := range [][]v1.ContainerStatus{s.InitContainerStatuses, s.ContainerStatuses} {
		for i := range list {
			for _, t := range []*v1.ContainerStateTerminated{list[i].State.Terminated, list[i].LastTerminationState.Terminated} {
				if t != nil {
					t.Message = cutMessage(t.Message, per)
				}
			}
		}
	}
}

// cutMessage is the first max bytes of msg, ending at a character boundary.
func cutMessage(msg string, max int) string {
	if len(msg) <= max {
		return msg
	}
	cut := max
	for cut > 0 && cut > max-utf8.UTFMax && !utf8.RuneStart(msg[cut]) {
		cut--
	}
	return msg[:cut]
}
