package cri

import (
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"
)

func testPod(policy v1.RestartPolicy, inits []string, apps ...string) *v1.Pod {
	pod := &v1.Pod{}
	pod.Name, pod.Namespace, pod.UID = "web", "default", testUID
	pod.Spec.RestartPolicy = policy
	for _, n := range inits {
		pod.Spec.InitContainers = append(pod.Spec.InitContainers, v1.Container{Name: n, Image: "busybox"})
	}
	for _, n := range apps {
		pod.Spec.Containers = append(pod.Spec.Containers, v1.Container{Name: n, Image: "busybox"})
	}
	return pod
}

func readySandbox(pod *v1.Pod) SandboxStatus {
	return SandboxStatus{ID: "sb1", Ready: true, Attempt: 0, SpecHash: HashSandbox(pod)}
}

func running(pod *v1.Pod, name string) ContainerStatus {
	for _, c := range pod.Spec.Containers {
		if c.Name == name {
			return ContainerStatus{ID: "id-" + name, Name: name, State: ContainerRunning, SpecHash: HashContainer(&c)}
		}
	}
	panic(name)
}

func exited(name string, code int32, init bool) ContainerStatus {
	return ContainerStatus{ID: "id-" + name, Name: name, State: ContainerExited, ExitCode: code, Init: init}
}

func TestComputePodActions(t *testing.T) {
	always := testPod(v1.RestartPolicyAlways, nil, "a", "b")
	never := testPod(v1.RestartPolicyNever, nil, "a")
	onFailure := testPod(v1.RestartPolicyOnFailure, nil, "a")
	withInit := testPod(v1.RestartPolicyAlways, []string{"i1", "i2"}, "a")
	neverInit := testPod(v1.RestartPolicyNever, []string{"i1"}, "a")
	changed := testPod(v1.RestartPolicyAlways, nil, "a", "b")
	changed.Spec.Containers[1].Image = "busybox:2"
	hostNet := testPod(v1.RestartPolicyAlways, nil, "a")
	hostNet.Spec.HostNetwork = true

	tests := []struct {
		name   string
		pod    *v1.Pod
		status PodStatus
		want   podActions
	}{
		{"new pod creates sandbox and starts all", always, PodStatus{},
			podActions{CreateSandbox: true, NextInit: -1, ContainersToStart: []int{0, 1}}},
		{"running pod: nothing to do", always,
			PodStatus{Sandboxes: []SandboxStatus{readySandbox(always)}, Containers: []ContainerStatus{running(always, "a"), running(always, "b")}},
			podActions{SandboxID: "sb1", NextInit: -1}},
		{"exited under Always restarts", always,
			PodStatus{Sandboxes: []SandboxStatus{readySandbox(always)}, Containers: []ContainerStatus{running(always, "a"), exited("b", 0, false)}},
			podActions{SandboxID: "sb1", NextInit: -1, ContainersToStart: []int{1}}},
		{"exited 1 under Never stops the pod", never,
			PodStatus{Sandboxes: []SandboxStatus{readySandbox(never)}, Containers: []ContainerStatus{exited("a", 1, false)}},
			podActions{SandboxID: "sb1", NextInit: -1, KillPod: true}},
		{"exited 1 under OnFailure restarts", onFailure,
			PodStatus{Sandboxes: []SandboxStatus{readySandbox(onFailure)}, Containers: []ContainerStatus{exited("a", 1, false)}},
			podActions{SandboxID: "sb1", NextInit: -1, ContainersToStart: []int{0}}},
		{"exited 0 under OnFailure is done", onFailure,
			PodStatus{Sandboxes: []SandboxStatus{readySandbox(onFailure)}, Containers: []ContainerStatus{exited("a", 0, false)}},
			podActions{SandboxID: "sb1", NextInit: -1, KillPod: true}},
		{"spec change replaces only that container", changed,
			PodStatus{Sandboxes: []SandboxStatus{readySandbox(changed)}, Containers: []ContainerStatus{running(changed, "a"), running(always, "b")}},
			podActions{SandboxID: "sb1", NextInit: -1, ContainersToStart: []int{1}, ContainersToKill: map[string]killReason{"id-b": {}}}},
		{"sandbox spec change recreates the pod", hostNet,
			PodStatus{Sandboxes: []SandboxStatus{{ID: "sb1", Ready: true, Attempt: 2, SpecHash: HashSandbox(always)}}, Containers: []ContainerStatus{running(hostNet, "a")}},
			podActions{KillPod: true, CreateSandbox: true, SandboxAttempt: 3, NextInit: -1, ContainersToStart: []int{0}}},
		{"dead sandbox is recreated with attempt+1", always,
			PodStatus{Sandboxes: []SandboxStatus{{ID: "sb1", Ready: false, Attempt: 0, SpecHash: HashSandbox(always)}}},
			podActions{KillPod: true, CreateSandbox: true, SandboxAttempt: 1, NextInit: -1, ContainersToStart: []int{0, 1}}},
		{"dead sandbox of a finished Never pod stays dead", never,
			PodStatus{Sandboxes: []SandboxStatus{{ID: "sb1", Ready: false, SpecHash: HashSandbox(never)}}, Containers: []ContainerStatus{exited("a", 0, false)}},
			podActions{KillPod: true, SandboxAttempt: 1, NextInit: -1}},
		{"first init container starts first", withInit,
			PodStatus{Sandboxes: []SandboxStatus{readySandbox(withInit)}},
			podActions{SandboxID: "sb1", NextInit: 0}},
		{"running init container blocks", withInit,
			PodStatus{Sandboxes: []SandboxStatus{readySandbox(withInit)}, Containers: []ContainerStatus{{ID: "x", Name: "i1", Init: true, State: ContainerRunning}}},
			podActions{SandboxID: "sb1", NextInit: -1}},
		{"second init after first succeeded", withInit,
			PodStatus{Sandboxes: []SandboxStatus{readySandbox(withInit)}, Containers: []ContainerStatus{exited("i1", 0, true)}},
			podActions{SandboxID: "sb1", NextInit: 1}},
		{"failed init restarts and blocks apps", withInit,
			PodStatus{Sandboxes: []SandboxStatus{readySandbox(withInit)}, Containers: []ContainerStatus{exited("i2", 1, true), exited("i1", 0, true)}},
			podActions{SandboxID: "sb1", NextInit: 1}},
		{"failed init under Never fails the pod", neverInit,
			PodStatus{Sandboxes: []SandboxStatus{readySandbox(neverInit)}, Containers: []ContainerStatus{exited("i1", 1, true)}},
			podActions{SandboxID: "sb1", NextInit: -1, PodFailed: true, KillPod: true}},
		{"apps start after all inits succeeded", withInit,
			PodStatus{Sandboxes: []SandboxStatus{readySandbox(withInit)}, Containers: []ContainerStatus{exited("i2", 0, true), exited("i1", 0, true)}},
			podActions{SandboxID: "sb1", NextInit: -1, ContainersToStart: []int{0}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := tt.status
			got := computePodActions(tt.pod, &st)
			if got.KillPod != tt.want.KillPod || got.CreateSandbox != tt.want.CreateSandbox ||
				got.SandboxAttempt != tt.want.SandboxAttempt || got.SandboxID != tt.want.SandboxID ||
				got.PodFailed != tt.want.PodFailed || got.NextInit != tt.want.NextInit ||
				!slices.Equal(got.ContainersToStart, tt.want.ContainersToStart) {
				t.Fatalf("got %+v\nwant %+v", got, tt.want)
			}
			if len(got.ContainersToKill) != len(tt.want.ContainersToKill) {
				t.Fatalf("kill %v, want %v", got.ContainersToKill, tt.want.ContainersToKill)
			}
			for id := range tt.want.ContainersToKill {
				if _, ok := got.ContainersToKill[id]; !ok {
					t.Fatalf("kill %v, want %s killed", got.ContainersToKill, id)
				}
			}
		})
	}
}

func TestHashes(t *testing.T) {
	a := v1.Container{Name: "a", Image: "busybox", Command: []string{"sleep", "1"}}
	b := a.DeepCopy()
	b.Command = []string{"sleep", "2"}
	if HashContainer(&a) != HashContainer(a.DeepCopy()) {
		t.Fatal("hash of an identical copy differs")
	}
	if HashContainer(&a) == HashContainer(b) {
		t.Fatal("hash ignores a command change")
	}
	pod := testPod(v1.RestartPolicyAlways, nil, "a")
	base := HashSandbox(pod)
	pod.Spec.Containers[0].Image = "other"
	if HashSandbox(pod) != base {
		t.Fatal("sandbox hash depends on the container image")
	}
	for name, mutate := range map[string]func(p *v1.Pod){
		"hostNetwork": func(p *v1.Pod) { p.Spec.HostNetwork = true },
		"hostname":    func(p *v1.Pod) { p.Spec.Hostname = "h" },
		"dnsPolicy":   func(p *v1.Pod) { p.Spec.DNSPolicy = v1.DNSNone },
		"hostPort": func(p *v1.Pod) {
			p.Spec.Containers[0].Ports = []v1.ContainerPort{{ContainerPort: 80, HostPort: 8080}}
		},
	} {
		p := pod.DeepCopy()
		mutate(p)
		if HashSandbox(p) == base {
			t.Errorf("sandbox hash ignores %s", name)
		}
	}
}
