package podstatus

import (
	"strings"
	"testing"
	"unicode/utf8"

	v1 "k8s.io/api/core/v1"
)

// Each container gets its share of the pod's 12 KiB, in the current and
// the last terminated state, init containers counted.
func TestTerminationMessagesShareThePodCap(t *testing.T) {
	pod := &v1.Pod{Spec: v1.PodSpec{
		InitContainers: []v1.Container{{Name: "i"}},
		Containers:     []v1.Container{{Name: "a"}, {Name: "b"}},
	}}
	long := strings.Repeat("x", 5000)
	term := func(msg string) *v1.ContainerStateTerminated { return &v1.ContainerStateTerminated{Message: msg} }
	s := v1.PodStatus{
		InitContainerStatuses: []v1.ContainerStatus{{Name: "i", State: v1.ContainerState{Terminated: term(long)}}},
		ContainerStatuses: []v1.ContainerStatus{
			{Name: "a", State: v1.ContainerState{Terminated: term(long)}, LastTerminationState: v1.ContainerState{Terminated: term(long)}},
			{Name: "b", State: v1.ContainerState{Terminated: term("short")}},
		},
	}
	capTerminationMessages(pod, &s)
	want := MaxPodTerminationMessageBytes / 3
	for _, got := range []int{len(s.InitContainerStatuses[0].State.Terminated.Message),
		len(s.ContainerStatuses[0].State.Terminated.Message), len(s.ContainerStatuses[0].LastTerminationState.Terminated.Message)} {
		if got != want {
			t.Errorf("message of %d bytes, want %d", got, want)
		}
	}
	if got := s.ContainerStatuses[1].State.Terminated.Message; got != "short" {
		t.Errorf("a short message became %q", got)
	}

	one := &v1.Pod{Spec: v1.PodSpec{Containers: []v1.Container{{Name: "a"}}}}
	s = v1.PodStatus{ContainerStatuses: []v1.ContainerStatus{{Name: "a", State: v1.ContainerState{Terminated: term(strings.Repeat("y", 20000))}}}}
	capTerminationMessages(one, &s)
	if got := len(s.ContainerStatuses[0].State.Terminated.Message); got != MaxPodTerminationMessageBytes {
		t.Errorf("a lone container's message has %d bytes, want %d", got, MaxPodTerminationMessageBytes)
	}
}

// A cut never splits a character.
func TestCutMessageKeepsCharactersWhole(t *testing.T) {
	msg := strings.Repeat("é", 10) // 2 bytes each
	for max := 0; max <= len(msg)+1; max++ {
		got := cutMessage(msg, max)
		if len(got) > max || !utf8.ValidString(got) || len(got) < max-1 {
			t.Errorf("cutMessage(%d) = %q (%d bytes)", max, got, len(got))
		}
	}
}
