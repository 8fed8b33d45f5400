package cri

import (
	"slices"
	"testing"
	"time"

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

// older is c as an attempt of an older spec of its container.
func older(c ContainerStatus) ContainerStatus {
	c.SpecHash = "older-spec"
	return c
}

func withProbes(pod *v1.Pod, liveness, startup bool) *v1.Pod {
	p := pod.DeepCopy()
	for i := range p.Spec.Containers {
		probe := &v1.Probe{ProbeHandler: v1.ProbeHandler{Exec: &v1.ExecAction{Command: []string{"true"}}}}
		if liveness {
			p.Spec.Containers[i].LivenessProbe = probe
		}
		if startup {
			p.Spec.Containers[i].StartupProbe = probe
		}
	}
	return p
}

// sidecarPod has a sidecar s1 (with a startup probe), a regular init
// container i1, a sidecar s2 (with a liveness probe when live) and an app
// container a.
func sidecarPod(policy v1.RestartPolicy, live bool) *v1.Pod {
	pod := testPod(policy, []string{"s1", "i1", "s2"}, "a")
	always := v1.ContainerRestartPolicyAlways
	probe := &v1.Probe{ProbeHandler: v1.ProbeHandler{Exec: &v1.ExecAction{Command: []string{"true"}}}}
	pod.Spec.InitContainers[0].RestartPolicy = &always
	pod.Spec.InitContainers[0].StartupProbe = probe
	pod.Spec.InitContainers[2].RestartPolicy = &always
	if live {
		pod.Spec.InitContainers[2].LivenessProbe = probe
	}
	return pod
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
	live := withProbes(always, true, false)
	liveNever := withProbes(never, true, false)
	liveOnFailure := withProbes(onFailure, true, false)
	liveStartup := withProbes(always, true, true)
	startupOnly := withProbes(always, false, true)

	// Sidecars: s1 (with a startup probe) and s2 around a regular init i1.
	side := sidecarPod(v1.RestartPolicyAlways, false)
	sideJob := sidecarPod(v1.RestartPolicyNever, false)
	sideOnFailure := sidecarPod(v1.RestartPolicyOnFailure, false)
	sideLive := sidecarPod(v1.RestartPolicyNever, true)
	sideRunning := func(pod *v1.Pod, name string) ContainerStatus {
		for _, c := range pod.Spec.InitContainers {
			if c.Name == name {
				return ContainerStatus{ID: "id-" + name, Name: name, Init: true, State: ContainerRunning, SpecHash: HashContainer(&c)}
			}
		}
		panic(name)
	}
	withSandbox := func(pod *v1.Pod, cs ...ContainerStatus) PodStatus {
		return PodStatus{Sandboxes: []SandboxStatus{readySandbox(pod)}, Containers: cs}
	}
	s1ok := ProbeResultMap{{"id-s1", ProbeStartup}: ProbeSuccess}

	type pr = ProbeResultMap
	type pk = ProbeKey
	kills := func(r Reason, restart bool, ids ...string) map[string]killReason {
		m := map[string]killReason{}
		for _, id := range ids {
			m[id] = killReason{Reason: r, Restart: restart}
		}
		return m
	}
	runningSet := func(pod *v1.Pod, names ...string) PodStatus {
		st := PodStatus{Sandboxes: []SandboxStatus{readySandbox(pod)}}
		for _, n := range names {
			st.Containers = append(st.Containers, running(pod, n))
		}
		return st
	}

	tests := []struct {
		name   string
		pod    *v1.Pod
		status PodStatus
		probes ProbeResults
		want   podActions
	}{
		{"new pod creates sandbox and starts all", always, PodStatus{}, nil,
			podActions{CreateSandbox: true, ContainersToStart: []int{0, 1}, Reason: ReasonNoSandbox}},
		{"running pod: nothing to do", always, runningSet(always, "a", "b"), nil,
			podActions{SandboxID: "sb1"}},
		{"exited under Always restarts", always,
			PodStatus{Sandboxes: []SandboxStatus{readySandbox(always)}, Containers: []ContainerStatus{running(always, "a"), exited("b", 0, false)}}, nil,
			podActions{SandboxID: "sb1", ContainersToStart: []int{1}}},
		{"exited 1 under Never stops the pod", never,
			PodStatus{Sandboxes: []SandboxStatus{readySandbox(never)}, Containers: []ContainerStatus{exited("a", 1, false)}}, nil,
			podActions{SandboxID: "sb1", KillPod: true, Reason: ReasonAllTerminated}},
		{"exited 1 under OnFailure restarts", onFailure,
			PodStatus{Sandboxes: []SandboxStatus{readySandbox(onFailure)}, Containers: []ContainerStatus{exited("a", 1, false)}}, nil,
			podActions{SandboxID: "sb1", ContainersToStart: []int{0}}},
		{"exited 0 under OnFailure is done", onFailure,
			PodStatus{Sandboxes: []SandboxStatus{readySandbox(onFailure)}, Containers: []ContainerStatus{exited("a", 0, false)}}, nil,
			podActions{SandboxID: "sb1", KillPod: true, Reason: ReasonAllTerminated}},
		// A replacement whose old container has exited (stopped gracefully,
		// exit 0, the agent gone before the new start, or the start held
		// back): the current spec has not run, whatever the policy.
		{"replaced container exited 0 under Never starts the new spec", never,
			withSandbox(never, older(exited("a", 0, false))), nil,
			podActions{SandboxID: "sb1", ContainersToStart: []int{0}}},
		{"replaced container exited 0 under OnFailure starts the new spec", onFailure,
			withSandbox(onFailure, older(exited("a", 0, false))), nil,
			podActions{SandboxID: "sb1", ContainersToStart: []int{0}}},
		{"replaced container exited 143 under Never starts the new spec", never,
			withSandbox(never, older(exited("a", 143, false))), nil,
			podActions{SandboxID: "sb1", ContainersToStart: []int{0}}},
		{"the new spec's own exit 0 under OnFailure is done", onFailure,
			withSandbox(onFailure, exited("a", 0, false), older(exited("a", 0, false))), nil,
			podActions{SandboxID: "sb1", KillPod: true, Reason: ReasonAllTerminated}},
		{"running under Never with a changed spec is replaced", never,
			withSandbox(never, older(running(never, "a"))), nil,
			podActions{SandboxID: "sb1", ContainersToStart: []int{0}, ContainersToKill: kills(ReasonContainerSpecChanged, true, "id-a")}},
		{"dead sandbox of a Never pod whose spec changed gets a new one", never,
			PodStatus{Sandboxes: []SandboxStatus{{ID: "sb1", Ready: false, SpecHash: HashSandbox(never)}}, Containers: []ContainerStatus{older(exited("a", 0, false))}}, nil,
			podActions{KillPod: true, CreateSandbox: true, SandboxAttempt: 1, ContainersToStart: []int{0}, Initialized: true, Reason: ReasonSandboxNotReady}},
		{"dead sandbox of an OnFailure pod whose spec changed restarts it", onFailure,
			PodStatus{Sandboxes: []SandboxStatus{{ID: "sb1", Ready: false, SpecHash: HashSandbox(onFailure)}}, Containers: []ContainerStatus{older(exited("a", 0, false))}}, nil,
			podActions{KillPod: true, CreateSandbox: true, SandboxAttempt: 1, ContainersToStart: []int{0}, Initialized: true, Reason: ReasonSandboxNotReady}},
		{"spec change replaces only that container", changed,
			PodStatus{Sandboxes: []SandboxStatus{readySandbox(changed)}, Containers: []ContainerStatus{running(changed, "a"), running(always, "b")}}, nil,
			podActions{SandboxID: "sb1", ContainersToStart: []int{1}, ContainersToKill: kills(ReasonContainerSpecChanged, true, "id-b")}},
		{"sandbox spec change recreates the pod", hostNet,
			PodStatus{Sandboxes: []SandboxStatus{{ID: "sb1", Ready: true, Attempt: 2, SpecHash: HashSandbox(always)}}, Containers: []ContainerStatus{running(hostNet, "a")}}, nil,
			podActions{KillPod: true, CreateSandbox: true, SandboxAttempt: 3, ContainersToStart: []int{0}, Reason: ReasonSandboxSpecChanged}},
		{"two ready sandboxes recreate the pod", always,
			PodStatus{Sandboxes: []SandboxStatus{{ID: "sb2", Ready: true, Attempt: 1, SpecHash: HashSandbox(always)}, readySandbox(always)}}, nil,
			podActions{KillPod: true, CreateSandbox: true, SandboxAttempt: 2, ContainersToStart: []int{0, 1}, Reason: ReasonMoreThanOneSandbox}},
		{"dead sandbox is recreated with attempt+1", always,
			PodStatus{Sandboxes: []SandboxStatus{{ID: "sb1", Ready: false, Attempt: 0, SpecHash: HashSandbox(always)}}}, nil,
			podActions{KillPod: true, CreateSandbox: true, SandboxAttempt: 1, ContainersToStart: []int{0, 1}, Reason: ReasonSandboxNotReady}},
		{"dead sandbox of a Never pod whose new spec was only created gets a new one", never,
			PodStatus{Sandboxes: []SandboxStatus{{ID: "sb1", Ready: false, SpecHash: HashSandbox(never)}},
				Containers: []ContainerStatus{{ID: "c2", Name: "a", State: ContainerCreated}, older(exited("a", 0, false))}}, nil,
			podActions{KillPod: true, CreateSandbox: true, SandboxAttempt: 1, ContainersToStart: []int{0}, Initialized: true, Reason: ReasonSandboxNotReady}},
		{"dead sandbox of a Never pod whose first container was only created gets a new one", never,
			PodStatus{Sandboxes: []SandboxStatus{{ID: "sb1", Ready: false, SpecHash: HashSandbox(never)}},
				Containers: []ContainerStatus{{ID: "c1", Name: "a", State: ContainerCreated}}}, nil,
			podActions{KillPod: true, CreateSandbox: true, SandboxAttempt: 1, ContainersToStart: []int{0}, Initialized: true, Reason: ReasonSandboxNotReady}},
		{"dead sandbox of a finished Never pod stays dead", never,
			PodStatus{Sandboxes: []SandboxStatus{{ID: "sb1", Ready: false, SpecHash: HashSandbox(never)}}, Containers: []ContainerStatus{exited("a", 0, false)}}, nil,
			podActions{KillPod: true, SandboxAttempt: 1, Reason: ReasonSandboxNotReady}},
		{"first init container starts first", withInit,
			PodStatus{Sandboxes: []SandboxStatus{readySandbox(withInit)}}, nil,
			podActions{SandboxID: "sb1", InitToStart: []int{0}}},
		{"running init container blocks", withInit,
			PodStatus{Sandboxes: []SandboxStatus{readySandbox(withInit)}, Containers: []ContainerStatus{{ID: "x", Name: "i1", Init: true, State: ContainerRunning}}}, nil,
			podActions{SandboxID: "sb1"}},
		{"created init container is killed and started over", withInit,
			PodStatus{Sandboxes: []SandboxStatus{readySandbox(withInit)}, Containers: []ContainerStatus{{ID: "x", Name: "i1", Init: true, State: ContainerCreated}}}, nil,
			podActions{SandboxID: "sb1", InitToStart: []int{0}, ContainersToKill: kills(ReasonContainerNotRunning, false, "x")}},
		{"second init after first succeeded", withInit,
			PodStatus{Sandboxes: []SandboxStatus{readySandbox(withInit)}, Containers: []ContainerStatus{exited("i1", 0, true)}}, nil,
			podActions{SandboxID: "sb1", InitToStart: []int{1}}},
		{"failed init restarts and blocks apps", withInit,
			PodStatus{Sandboxes: []SandboxStatus{readySandbox(withInit)}, Containers: []ContainerStatus{exited("i2", 1, true), exited("i1", 0, true)}}, nil,
			podActions{SandboxID: "sb1", InitToStart: []int{1}}},
		{"failed init under Never fails the pod", neverInit,
			PodStatus{Sandboxes: []SandboxStatus{readySandbox(neverInit)}, Containers: []ContainerStatus{exited("i1", 1, true)}}, nil,
			podActions{SandboxID: "sb1", PodFailed: true, KillPod: true, Reason: ReasonInitFailed, FailedInit: "i1"}},
		{"apps start after all inits succeeded", withInit,
			PodStatus{Sandboxes: []SandboxStatus{readySandbox(withInit)}, Containers: []ContainerStatus{exited("i2", 0, true), exited("i1", 0, true)}}, nil,
			podActions{SandboxID: "sb1", ContainersToStart: []int{0}}},

		// Sidecars.
		{"sidecar pod starts the first init container in a new sandbox", side, PodStatus{}, nil,
			podActions{CreateSandbox: true, InitToStart: []int{0}, Reason: ReasonNoSandbox}},
		{"a running sidecar is not waited for to complete, but for its startup probe", side,
			withSandbox(side, sideRunning(side, "s1")), nil,
			podActions{SandboxID: "sb1"}},
		{"a started sidecar lets the next init container go", side,
			withSandbox(side, sideRunning(side, "s1")), s1ok,
			podActions{SandboxID: "sb1", InitToStart: []int{1}}},
		{"a regular init container after a sidecar is waited for", side,
			withSandbox(side, ContainerStatus{ID: "id-i1", Name: "i1", Init: true, State: ContainerRunning}, sideRunning(side, "s1")), s1ok,
			podActions{SandboxID: "sb1"}},
		{"the last sidecar starts once the regular init container completed", side,
			withSandbox(side, exited("i1", 0, true), sideRunning(side, "s1")), s1ok,
			podActions{SandboxID: "sb1", InitToStart: []int{2}}},
		{"the app containers start once the last sidecar started", side,
			withSandbox(side, sideRunning(side, "s2"), exited("i1", 0, true), sideRunning(side, "s1")), s1ok,
			podActions{SandboxID: "sb1", ContainersToStart: []int{0}, Initialized: true}},
		{"a sidecar that exits is restarted beside the running app", side,
			withSandbox(side, running(side, "a"), sideRunning(side, "s2"), exited("s1", 0, true)), nil,
			podActions{SandboxID: "sb1", InitToStart: []int{0}, Initialized: true}},
		{"a sidecar that exits under restartPolicy Never is restarted too", sideJob,
			withSandbox(sideJob, running(sideJob, "a"), sideRunning(sideJob, "s2"), exited("s1", 1, true)), nil,
			podActions{SandboxID: "sb1", InitToStart: []int{0}, Initialized: true}},
		{"a sidecar exited before it started is restarted, the rest wait", side,
			withSandbox(side, exited("s1", 1, true)), nil,
			podActions{SandboxID: "sb1", InitToStart: []int{0}}},
		{"a sidecar whose record is gone is started again after initialization", side,
			withSandbox(side, running(side, "a"), sideRunning(side, "s2")), nil,
			podActions{SandboxID: "sb1", InitToStart: []int{0}, Initialized: true}},
		{"a completed regular init container is not run again after initialization", side,
			withSandbox(side, running(side, "a"), sideRunning(side, "s2"), sideRunning(side, "s1")), s1ok,
			podActions{SandboxID: "sb1", Initialized: true}},
		{"a failed startup probe of a sidecar kills and restarts it", side,
			withSandbox(side, sideRunning(side, "s1")), ProbeResultMap{{"id-s1", ProbeStartup}: ProbeFailure},
			podActions{SandboxID: "sb1", InitToStart: []int{0}, ContainersToKill: kills(ReasonStartupFailed, true, "id-s1")}},
		{"a failed liveness probe of a sidecar restarts it whatever the pod's policy", sideLive,
			withSandbox(sideLive, running(sideLive, "a"), sideRunning(sideLive, "s2"), exited("i1", 0, true), sideRunning(sideLive, "s1")),
			ProbeResultMap{{"id-s1", ProbeStartup}: ProbeSuccess, {"id-s2", ProbeLiveness}: ProbeFailure},
			podActions{SandboxID: "sb1", InitToStart: []int{2}, Initialized: true, ContainersToKill: kills(ReasonLivenessFailed, true, "id-s2")}},
		{"a changed sidecar is replaced", side,
			withSandbox(side, running(side, "a"), ContainerStatus{ID: "id-s2", Name: "s2", Init: true, State: ContainerRunning, SpecHash: "old"}, sideRunning(side, "s1")), s1ok,
			podActions{SandboxID: "sb1", InitToStart: []int{2}, Initialized: true, ContainersToKill: kills(ReasonContainerSpecChanged, true, "id-s2")}},
		{"a job's sidecars do not keep it alive: the pod is stopped when the app completed", sideJob,
			withSandbox(sideJob, exited("a", 0, false), sideRunning(sideJob, "s2"), exited("i1", 0, true), sideRunning(sideJob, "s1")), s1ok,
			podActions{SandboxID: "sb1", KillPod: true, Reason: ReasonAllTerminated, Initialized: true}},
		{"a job's exited sidecar is not restarted once the app completed", sideJob,
			withSandbox(sideJob, exited("a", 1, false), exited("s2", 1, true), exited("i1", 0, true), sideRunning(sideJob, "s1")), s1ok,
			podActions{SandboxID: "sb1", KillPod: true, Reason: ReasonAllTerminated, Initialized: true}},
		{"a completed OnFailure pod with sidecars gets no new sandbox", sideOnFailure,
			PodStatus{Sandboxes: []SandboxStatus{{ID: "sb1", SpecHash: HashSandbox(sideOnFailure)}},
				Containers: []ContainerStatus{exited("a", 0, false), exited("s2", 137, true), exited("i1", 0, true), exited("s1", 137, true)}}, nil,
			podActions{KillPod: true, SandboxAttempt: 1, Reason: ReasonSandboxNotReady}},

		// Probes.
		{"liveness failure under Always kills and restarts that container", live, runningSet(live, "a", "b"),
			pr{pk{"id-b", ProbeLiveness}: ProbeFailure, pk{"id-a", ProbeLiveness}: ProbeSuccess},
			podActions{SandboxID: "sb1", ContainersToStart: []int{1}, ContainersToKill: kills(ReasonLivenessFailed, true, "id-b")}},
		{"liveness failure under OnFailure restarts", liveOnFailure, runningSet(liveOnFailure, "a"),
			pr{pk{"id-a", ProbeLiveness}: ProbeFailure},
			podActions{SandboxID: "sb1", ContainersToStart: []int{0}, ContainersToKill: kills(ReasonLivenessFailed, true, "id-a")}},
		{"liveness failure under Never kills without restart and stops the pod", liveNever, runningSet(liveNever, "a"),
			pr{pk{"id-a", ProbeLiveness}: ProbeFailure},
			podActions{SandboxID: "sb1", KillPod: true, Reason: ReasonAllTerminated, ContainersToKill: kills(ReasonLivenessFailed, false, "id-a")}},
		{"liveness unknown or success keeps the container", live, runningSet(live, "a", "b"),
			pr{pk{"id-a", ProbeLiveness}: ProbeSuccess},
			podActions{SandboxID: "sb1"}},
		{"readiness failure does not kill", live, runningSet(live, "a", "b"),
			pr{pk{"id-a", ProbeReadiness}: ProbeFailure},
			podActions{SandboxID: "sb1"}},
		{"liveness result of a container without a liveness probe is ignored", always, runningSet(always, "a", "b"),
			pr{pk{"id-a", ProbeLiveness}: ProbeFailure},
			podActions{SandboxID: "sb1"}},
		{"startup failure kills and restarts", startupOnly, runningSet(startupOnly, "a", "b"),
			pr{pk{"id-a", ProbeStartup}: ProbeFailure, pk{"id-b", ProbeStartup}: ProbeSuccess},
			podActions{SandboxID: "sb1", ContainersToStart: []int{0}, ContainersToKill: kills(ReasonStartupFailed, true, "id-a")}},
		{"liveness is not acted on before startup succeeded", liveStartup, runningSet(liveStartup, "a", "b"),
			pr{pk{"id-a", ProbeLiveness}: ProbeFailure, pk{"id-b", ProbeLiveness}: ProbeFailure, pk{"id-b", ProbeStartup}: ProbeSuccess},
			podActions{SandboxID: "sb1", ContainersToStart: []int{1}, ContainersToKill: kills(ReasonLivenessFailed, true, "id-b")}},
		{"results of an older attempt do not touch the new one", live, runningSet(live, "a", "b"),
			pr{pk{"id-old", ProbeLiveness}: ProbeFailure},
			podActions{SandboxID: "sb1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := tt.status
			got := computePodActions(tt.pod, &st, tt.probes, false)
			if got.KillPod != tt.want.KillPod || got.CreateSandbox != tt.want.CreateSandbox ||
				got.SandboxAttempt != tt.want.SandboxAttempt || got.SandboxID != tt.want.SandboxID ||
				got.PodFailed != tt.want.PodFailed || !slices.Equal(got.InitToStart, tt.want.InitToStart) ||
				got.Reason != tt.want.Reason || got.FailedInit != tt.want.FailedInit ||
				(hasSidecar(tt.pod) && got.Initialized != tt.want.Initialized) ||
				!slices.Equal(got.ContainersToStart, tt.want.ContainersToStart) {
				t.Fatalf("got %+v\nwant %+v", got, tt.want)
			}
			if len(got.ContainersToKill) != len(tt.want.ContainersToKill) {
				t.Fatalf("kill %v, want %v", got.ContainersToKill, tt.want.ContainersToKill)
			}
			for id, want := range tt.want.ContainersToKill {
				k, ok := got.ContainersToKill[id]
				if !ok || k.Reason != want.Reason || k.Restart != want.Restart {
					t.Fatalf("kill %+v, want %s killed with %+v", got.ContainersToKill, id, want)
				}
			}
		})
	}
}

func TestStarted(t *testing.T) {
	plain := v1.Container{Name: "a"}
	gated := v1.Container{Name: "a", StartupProbe: &v1.Probe{}}
	run := &ContainerStatus{ID: "c1", State: ContainerRunning}
	done := &ContainerStatus{ID: "c1", State: ContainerExited}
	ok := ProbeResultMap{{"c1", ProbeStartup}: ProbeSuccess}
	failed := ProbeResultMap{{"c1", ProbeStartup}: ProbeFailure}
	for _, tt := range []struct {
		name   string
		c      *v1.Container
		s      *ContainerStatus
		probes ProbeResults
		want   bool
	}{
		{"running without a startup probe", &plain, run, nil, true},
		{"exited is never started", &plain, done, nil, false},
		{"no status", &plain, nil, nil, false},
		{"startup probe with no result", &gated, run, ProbeResultMap{}, false},
		{"startup probe with no results at all", &gated, run, nil, false},
		{"startup probe failed", &gated, run, failed, false},
		{"startup probe succeeded", &gated, run, ok, true},
	} {
		if got := Started(tt.c, tt.s, tt.probes); got != tt.want {
			t.Errorf("%s: Started = %v, want %v", tt.name, got, tt.want)
		}
	}
}

func TestReasonWording(t *testing.T) {
	for r := ReasonNone + 1; r <= ReasonStartupFailed; r++ {
		if s := r.String(); s == "" || s == "unknown reason" {
			t.Errorf("Reason %d has no wording", r)
		}
	}
	if s := Reason(999).String(); s != "unknown reason" {
		t.Errorf("Reason(999) = %q", s)
	}
	for _, tt := range []struct {
		k    killReason
		want string
	}{
		{killReason{Name: "a", Reason: ReasonLivenessFailed, Restart: true}, "container a failed liveness probe, will be restarted"},
		{killReason{Name: "a", Reason: ReasonStartupFailed}, "container a failed startup probe"},
		{killReason{Name: "a", Reason: ReasonContainerSpecChanged, Restart: true}, "container spec changed, will be restarted"},
		{killReason{Name: "i", Reason: ReasonContainerNotRunning, State: ContainerCreated, Init: true}, "init container is in state created"},
		{killReason{Name: "a", Reason: ReasonContainerNotRunning, State: ContainerUnknown, Restart: true}, "container is in state unknown, will be restarted"},
	} {
		if got := tt.k.Message(); got != tt.want {
			t.Errorf("Message() = %q, want %q", got, tt.want)
		}
	}
	if got := (podActions{Reason: ReasonInitFailed, FailedInit: "i1"}).reasonText(); got != "init container i1 failed" {
		t.Errorf("reasonText = %q", got)
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

// The backoff key is the kubelet's: one per spec of each container of each
// pod, so a changed spec starts with no crash-loop history.
func TestBackoffKey(t *testing.T) {
	pod := testPod(v1.RestartPolicyAlways, nil, "a", "b")
	a := &pod.Spec.Containers[0]
	key := BackoffKey(pod, a)
	if key != BackoffKey(pod.DeepCopy(), a.DeepCopy()) {
		t.Fatal("the key of an identical pod and container differs")
	}
	changed := a.DeepCopy()
	changed.Command = []string{"sleep", "2"}
	other := pod.DeepCopy()
	other.UID = "another-uid"
	renamed := pod.DeepCopy()
	renamed.Name = "other"
	for what, k := range map[string]string{
		"a changed spec":    BackoffKey(pod, changed),
		"another container": BackoffKey(pod, &pod.Spec.Containers[1]),
		"another uid":       BackoffKey(other, a),
		"another pod name":  BackoffKey(renamed, a),
	} {
		if k == key {
			t.Errorf("%s has the same backoff key %q", what, key)
		}
	}
	if want := "web_default_" + testUID + "_a_" + HashContainer(a); key != want {
		t.Errorf("key = %q, want %q", key, want)
	}
}

func TestOfOlderSpec(t *testing.T) {
	pod := testPod(v1.RestartPolicyNever, nil, "a")
	c := &pod.Spec.Containers[0]
	for _, tt := range []struct {
		name string
		s    *ContainerStatus
		want bool
	}{
		{"no attempt", nil, false},
		{"an attempt of the current spec", &ContainerStatus{SpecHash: HashContainer(c)}, false},
		{"an attempt with no hash recorded", &ContainerStatus{}, false},
		{"an attempt of an older spec", &ContainerStatus{SpecHash: "older-spec"}, true},
	} {
		if got := OfOlderSpec(c, tt.s); got != tt.want {
			t.Errorf("%s: OfOlderSpec = %v, want %v", tt.name, got, tt.want)
		}
	}
}

// A failed probe's own terminationGracePeriodSeconds bounds its kill;
// other kills, and probes without one, take the pod's.
func TestKillGraceOfAFailedProbe(t *testing.T) {
	five, nine := int64(5), int64(9)
	pod := &v1.Pod{Spec: v1.PodSpec{TerminationGracePeriodSeconds: &nine, Containers: []v1.Container{
		{Name: "a", LivenessProbe: &v1.Probe{TerminationGracePeriodSeconds: &five}, StartupProbe: &v1.Probe{}},
	}}}
	for _, tc := range []struct {
		why  killReason
		want int64
	}{
		{killReason{Name: "a", Reason: ReasonLivenessFailed}, 5},
		{killReason{Name: "a", Reason: ReasonStartupFailed}, 9},
		{killReason{Name: "a", Reason: ReasonContainerSpecChanged}, 9},
		{killReason{Name: "b", Reason: ReasonLivenessFailed}, 9},
	} {
		if got := killGrace(pod, tc.why); got != tc.want {
			t.Errorf("killGrace(%+v) = %d, want %d", tc.why, got, tc.want)
		}
	}
}

func hasSidecar(pod *v1.Pod) bool {
	for i := range pod.Spec.InitContainers {
		if IsSidecar(&pod.Spec.InitContainers[i]) {
			return true
		}
	}
	return false
}

// fakeBackoff is a crash-loop backoff that holds back the keys it names
// while the exit it is asked about is at or after since.
type fakeBackoff struct {
	since map[string]time.Time
	asked []time.Time
}

func (f *fakeBackoff) InBackoff(key string, finishedAt time.Time) (bool, time.Duration) {
	f.asked = append(f.asked, finishedAt)
	if t, ok := f.since[key]; ok && !finishedAt.Before(t) {
		return true, 10 * time.Second
	}
	return false, 0
}

func (f *fakeBackoff) Delay(string) time.Duration { return 10 * time.Second }

func (f *fakeBackoff) Next(string, time.Time) {}

// The crash-loop backoff counts from the newest exited attempt, as the
// kubelet's doBackOff: a container killed in the same sync (a failed
// liveness probe) still runs in the status, so the attempt before it
// counts and repeated probe kills back off as crashes do.
func TestCrashLoopGate(t *testing.T) {
	pod := testPod(v1.RestartPolicyAlways, []string{"s"}, "a")
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(c ContainerStatus, id string, finished time.Time) ContainerStatus {
		c.ID, c.FinishedAt = id, finished
		return c
	}
	live := running(pod, "a")
	tests := []struct {
		name     string
		status   PodStatus
		init     bool
		since    time.Time // backoff holds exits from this time on
		wantBase string    // "" none
		wantWait bool
	}{
		{"a first attempt has no base and starts at once", PodStatus{}, false, t0, "", false},
		{"a first liveness kill has no exited attempt: it starts at once", PodStatus{Containers: []ContainerStatus{live}}, false, t0, "", false},
		{"a crash counts from its own exit", PodStatus{Containers: []ContainerStatus{at(exited("a", 1, false), "a1", t0.Add(time.Minute))}}, false, t0, "a1", true},
		{"a liveness kill counts from the attempt before it", PodStatus{Containers: []ContainerStatus{live, at(exited("a", 137, false), "a0", t0.Add(time.Minute))}}, false, t0, "a0", true},
		{"a liveness kill long after the backoff ran out starts at once", PodStatus{Containers: []ContainerStatus{live, at(exited("a", 137, false), "a0", t0.Add(-time.Minute))}}, false, t0, "a0", false},
		{"the newest exited attempt counts", PodStatus{Containers: []ContainerStatus{
			at(exited("a", 1, false), "a2", t0.Add(2*time.Minute)), at(exited("a", 1, false), "a1", t0.Add(-time.Minute))}}, false, t0, "a2", true},
		{"a sidecar's attempts are not the app container's", PodStatus{Containers: []ContainerStatus{
			at(exited("a", 1, true), "s1", t0.Add(time.Minute))}}, false, t0, "", false},
		{"a sidecar backs off from its own exit", PodStatus{Containers: []ContainerStatus{
			at(exited("a", 1, true), "s1", t0.Add(time.Minute))}}, true, t0, "s1", true},
		// A spec change replaces the container: no crash to back off from.
		{"a container killed for a spec change is not a crash", PodStatus{Containers: []ContainerStatus{
			older(live), at(exited("a", 0, false), "a0", t0.Add(time.Minute))}}, false, t0, "", false},
		{"a replaced container that exited is not a crash", PodStatus{Containers: []ContainerStatus{
			at(older(exited("a", 0, false)), "a1", t0.Add(time.Minute)), at(exited("a", 0, false), "a0", t0.Add(time.Minute))}}, false, t0, "", false},
		{"a crash of the new spec counts from its own exit", PodStatus{Containers: []ContainerStatus{
			at(exited("a", 1, false), "a2", t0.Add(2*time.Minute)), at(older(exited("a", 0, false)), "a1", t0.Add(time.Minute))}}, false, t0, "a2", true},
		{"a liveness kill of the new spec's first attempt starts at once", PodStatus{Containers: []ContainerStatus{
			live, at(older(exited("a", 0, false)), "a1", t0.Add(time.Minute))}}, false, t0, "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := &pod.Spec.Containers[0]
			b := &fakeBackoff{since: map[string]time.Time{BackoffKey(pod, c): tt.since}}
			st := tt.status
			base, be := crashLoopGate(pod, c, tt.init, &st, b)
			gotBase := ""
			if base != nil {
				gotBase = base.ID
			}
			if gotBase != tt.wantBase || (be != nil) != tt.wantWait {
				t.Fatalf("base %q, backoff %v; want base %q, wait %v", gotBase, be, tt.wantBase, tt.wantWait)
			}
			if be != nil && be.Container != "a" {
				t.Fatalf("backoff names %q", be.Container)
			}
		})
	}
	if base, be := crashLoopGate(pod, &pod.Spec.Containers[0], false, &PodStatus{Containers: []ContainerStatus{exited("a", 1, false)}}, nil); base == nil || be != nil {
		t.Fatalf("without a backoff: base %v, wait %v", base, be)
	}
}

// A sidecar records 1 + its init index; anything else read back is none.
func TestSidecarOrder(t *testing.T) {
	pod := sidecarPod(v1.RestartPolicyAlways, false)
	for i, want := range []int{1, 0, 3} {
		if got := sidecarOrder(pod, &pod.Spec.InitContainers[i], true); got != want {
			t.Errorf("sidecarOrder(%s) = %d, want %d", pod.Spec.InitContainers[i].Name, got, want)
		}
	}
	if got := sidecarOrder(pod, &pod.Spec.Containers[0], false); got != 0 {
		t.Errorf("an app container has order %d", got)
	}
	for v, want := range map[string]int{"1": 1, "3": 3, "": 0, "0": 0, "-2": 0, "x": 0, "99999999": 0} {
		if got := parseSidecar(v); got != want {
			t.Errorf("parseSidecar(%q) = %d, want %d", v, got, want)
		}
	}
}

// A finished pod (SyncInput.Finished) gets no new sandbox whatever the
// runtime lists, in particular once its exited containers were removed
// (GC, an operator) and only the stopped sandbox is left; the same
// listing of a pod not finished gets one (its first run was lost).
func TestFinishedPodGetsNoNewSandbox(t *testing.T) {
	never := testPod(v1.RestartPolicyNever, nil, "a")
	onFailure := testPod(v1.RestartPolicyOnFailure, nil, "a")
	always := testPod(v1.RestartPolicyAlways, nil, "a")
	stopped := func(pod *v1.Pod, cs ...ContainerStatus) PodStatus {
		return PodStatus{Sandboxes: []SandboxStatus{{ID: "sb1", Ready: false, SpecHash: HashSandbox(pod)}}, Containers: cs}
	}
	tests := []struct {
		name     string
		pod      *v1.Pod
		status   PodStatus
		finished bool
		want     podActions
	}{
		{"Never, containers removed, finished", never, stopped(never), true,
			podActions{KillPod: true, SandboxAttempt: 1, Reason: ReasonSandboxNotReady}},
		{"OnFailure, containers removed, finished", onFailure, stopped(onFailure), true,
			podActions{KillPod: true, SandboxAttempt: 1, Reason: ReasonSandboxNotReady}},
		{"Always past its deadline, sandbox stopped, finished", always, stopped(always, exited("a", 137, false)), true,
			podActions{KillPod: true, SandboxAttempt: 1, Reason: ReasonSandboxNotReady}},
		{"sandbox and containers removed, finished", never, PodStatus{}, true,
			podActions{Reason: ReasonNoSandbox}},
		{"Never, exited of an older spec listed, finished", never, stopped(never, older(exited("a", 0, false))), true,
			podActions{KillPod: true, SandboxAttempt: 1, Reason: ReasonSandboxNotReady}},
		{"Never, containers removed, not finished: the first run was lost", never, stopped(never), false,
			podActions{KillPod: true, CreateSandbox: true, SandboxAttempt: 1, ContainersToStart: []int{0}, Initialized: true, Reason: ReasonSandboxNotReady}},
		{"OnFailure, containers removed, not finished", onFailure, stopped(onFailure), false,
			podActions{KillPod: true, CreateSandbox: true, SandboxAttempt: 1, ContainersToStart: []int{0}, Initialized: true, Reason: ReasonSandboxNotReady}},
		{"ready sandbox, finished: nothing new", never, PodStatus{Sandboxes: []SandboxStatus{readySandbox(never)}, Containers: []ContainerStatus{exited("a", 0, false)}}, true,
			podActions{SandboxID: "sb1", KillPod: true, Reason: ReasonAllTerminated}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := tt.status
			got := computePodActions(tt.pod, &st, nil, tt.finished)
			if got.KillPod != tt.want.KillPod || got.CreateSandbox != tt.want.CreateSandbox ||
				got.SandboxAttempt != tt.want.SandboxAttempt || got.SandboxID != tt.want.SandboxID ||
				got.Reason != tt.want.Reason || !slices.Equal(got.InitToStart, tt.want.InitToStart) ||
				!slices.Equal(got.ContainersToStart, tt.want.ContainersToStart) || len(got.ContainersToKill) != 0 {
				t.Fatalf("got %+v\nwant %+v", got, tt.want)
			}
		})
	}
}
