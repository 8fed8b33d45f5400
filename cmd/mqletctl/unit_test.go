package main

import (
	"flag"
	"io"
	"reflect"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestParseInterleaved(t *testing.T) {
	cases := []struct {
		args    []string
		wantPos []string
		wantNS  string
	}{
		{[]string{"pods", "web", "-n", "prod"}, []string{"pods", "web"}, "prod"},
		{[]string{"-n", "prod", "pods"}, []string{"pods"}, "prod"},
		{[]string{"pods", "-n", "prod", "web"}, []string{"pods", "web"}, "prod"},
		{[]string{"pods", "--", "-n"}, []string{"pods", "-n"}, ""},
	}
	for _, c := range cases {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		ns := fs.String("n", "", "")
		pos, err := parseInterleaved(fs, c.args)
		if err != nil || !reflect.DeepEqual(pos, c.wantPos) || *ns != c.wantNS {
			t.Errorf("parseInterleaved(%q) = %q, ns %q, %v; want %q, %q", c.args, pos, *ns, err, c.wantPos, c.wantNS)
		}
	}
}

func TestPodStatus(t *testing.T) {
	always := v1.ContainerRestartPolicyAlways
	now := metav1.Now()
	running := v1.ContainerState{Running: &v1.ContainerStateRunning{}}
	cases := []struct {
		name string
		pod  v1.Pod
		want string
	}{
		{"phase only", v1.Pod{Status: v1.PodStatus{Phase: v1.PodRunning}}, "Running"},
		{"no status yet", v1.Pod{}, "Pending"},
		{"pod reason", v1.Pod{Status: v1.PodStatus{Phase: v1.PodFailed, Reason: "Evicted"}}, "Evicted"},
		{"image pull", v1.Pod{Status: v1.PodStatus{Phase: v1.PodPending, ContainerStatuses: []v1.ContainerStatus{
			{State: v1.ContainerState{Waiting: &v1.ContainerStateWaiting{Reason: "ErrImagePull"}}}}}}, "ErrImagePull"},
		{"exit code", v1.Pod{Status: v1.PodStatus{Phase: v1.PodFailed, ContainerStatuses: []v1.ContainerStatus{
			{State: v1.ContainerState{Terminated: &v1.ContainerStateTerminated{ExitCode: 3}}}}}}, "ExitCode:3"},
		{"completed", v1.Pod{Status: v1.PodStatus{Phase: v1.PodSucceeded, ContainerStatuses: []v1.ContainerStatus{
			{State: v1.ContainerState{Terminated: &v1.ContainerStateTerminated{Reason: "Completed"}}}}}}, "Completed"},
		{"init waiting", v1.Pod{
			Spec: v1.PodSpec{InitContainers: []v1.Container{{Name: "i1"}, {Name: "i2"}}},
			Status: v1.PodStatus{Phase: v1.PodPending, InitContainerStatuses: []v1.ContainerStatus{
				{Name: "i1", State: v1.ContainerState{Terminated: &v1.ContainerStateTerminated{ExitCode: 0}}},
				{Name: "i2", State: running},
			}}}, "Init:1/2"},
		{"init crash", v1.Pod{
			Spec: v1.PodSpec{InitContainers: []v1.Container{{Name: "i1"}}},
			Status: v1.PodStatus{Phase: v1.PodPending, InitContainerStatuses: []v1.ContainerStatus{
				{Name: "i1", State: v1.ContainerState{Waiting: &v1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}}},
			}}}, "Init:CrashLoopBackOff"},
		{"sidecar running does not block", v1.Pod{
			Spec: v1.PodSpec{InitContainers: []v1.Container{{Name: "side", RestartPolicy: &always}}, Containers: []v1.Container{{Name: "app"}}},
			Status: v1.PodStatus{Phase: v1.PodRunning,
				InitContainerStatuses: []v1.ContainerStatus{{Name: "side", State: running}},
				ContainerStatuses:     []v1.ContainerStatus{{Name: "app", Ready: true, State: running}},
			}}, "Running"},
		{"terminating", v1.Pod{ObjectMeta: metav1.ObjectMeta{DeletionTimestamp: &now}, Status: v1.PodStatus{Phase: v1.PodRunning}}, "Terminating"},
	}
	for _, c := range cases {
		if got := podStatus(&c.pod); got != c.want {
			t.Errorf("%s: podStatus = %q, want %q", c.name, got, c.want)
		}
	}
}

func TestRequestIDsAreSafeAndDistinct(t *testing.T) {
	seen := map[string]bool{}
	for i := 0; i < 100; i++ {
		id := newRequestID()
		if !requestIDPattern.MatchString(id) || seen[id] {
			t.Fatalf("request id %q unsafe or repeated", id)
		}
		seen[id] = true
	}
	if a, b := newClientID(), newClientID(); a == b || len(a) <= len("mqletctl-") {
		t.Errorf("client ids %q, %q", a, b)
	}
}
