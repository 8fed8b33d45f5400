package podstatus

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/mqlet/mqlet/cri"
)

var t0 = time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)

func at(sec int) time.Time { return t0.Add(time.Duration(sec) * time.Second) }

func newPod(policy v1.RestartPolicy, containers ...string) *v1.Pod {
	p := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default", UID: "uid-1", Generation: 3},
		Spec:       v1.PodSpec{RestartPolicy: policy},
	}
	for _, c := range containers {
		p.Spec.Containers = append(p.Spec.Containers, v1.Container{Name: c, Image: "busybox:" + c})
	}
	return p
}

func withInit(p *v1.Pod, names ...string) *v1.Pod {
	for _, n := range names {
		p.Spec.InitContainers = append(p.Spec.InitContainers, v1.Container{Name: n, Image: "busybox:init"})
	}
	return p
}

func readySandbox(ip string) cri.SandboxStatus {
	return cri.SandboxStatus{ID: "sb1", Ready: true, CreatedAt: at(0), IP: ip, IPs: []string{ip}}
}

func running(name, id string, restart int) cri.ContainerStatus {
	return cri.ContainerStatus{ID: id, Name: name, State: cri.ContainerRunning, CreatedAt: at(restart*10 + 1), StartedAt: at(restart*10 + 2), Image: "busybox:" + name, ImageRef: "sha256:img", RestartCount: restart}
}

func exited(name, id string, restart int, code int32, reason string) cri.ContainerStatus {
	return cri.ContainerStatus{ID: id, Name: name, State: cri.ContainerExited, CreatedAt: at(restart*10 + 1), StartedAt: at(restart*10 + 2), FinishedAt: at(restart*10 + 5), ExitCode: code, Reason: reason, Image: "busybox:" + name, ImageRef: "sha256:img", RestartCount: restart}
}

// ofOlderSpec is c as an attempt of an older spec of its container (one
// stopped for its replacement).
func ofOlderSpec(c cri.ContainerStatus) cri.ContainerStatus {
	c.SpecHash = "older-spec"
	return c
}

func initExited(name, id string, code int32) cri.ContainerStatus {
	c := exited(name, id, 0, code, "")
	c.Init = true
	c.Image = "busybox:init"
	return c
}

func rsOf(sb []cri.SandboxStatus, cs ...cri.ContainerStatus) *cri.PodStatus {
	return &cri.PodStatus{UID: "uid-1", Name: "web", Namespace: "default", Sandboxes: sb, Containers: cs}
}

func cond(t *testing.T, s v1.PodStatus, typ v1.PodConditionType) v1.PodCondition {
	t.Helper()
	for _, c := range s.Conditions {
		if c.Type == typ {
			return c
		}
	}
	t.Fatalf("condition %s missing in %+v", typ, s.Conditions)
	return v1.PodCondition{}
}

func cstatus(t *testing.T, list []v1.ContainerStatus, name string) v1.ContainerStatus {
	t.Helper()
	st, ok := findStatus(list, name)
	if !ok {
		t.Fatalf("no status for container %s", name)
	}
	return st
}

// stateOf names a container state compactly: "waiting:Reason",
// "running", "terminated:Reason:code".
func stateOf(s v1.ContainerState) string {
	switch {
	case s.Running != nil:
		return "running"
	case s.Terminated != nil:
		return "terminated:" + s.Terminated.Reason + ":" + itoa(s.Terminated.ExitCode)
	case s.Waiting != nil:
		return "waiting:" + s.Waiting.Reason
	}
	return "none"
}

func itoa(i int32) string { return strconv.Itoa(int(i)) }

func TestBuildPhasesAndContainerStates(t *testing.T) {
	sb := []cri.SandboxStatus{readySandbox("10.88.0.5")}
	cases := []struct {
		name        string
		pod         *v1.Pod
		rs          *cri.PodStatus
		hints       Hints
		phase       v1.PodPhase
		states      map[string]string // container -> state
		lastStates  map[string]string
		restarts    map[string]int32
		initStates  map[string]string
		ready       v1.ConditionStatus
		readyReason string
		initialized v1.ConditionStatus
	}{
		{
			name:   "nothing in the runtime yet",
			pod:    newPod(v1.RestartPolicyAlways, "app"),
			rs:     nil,
			phase:  v1.PodPending,
			states: map[string]string{"app": "waiting:ContainerCreating"},
			ready:  v1.ConditionFalse, readyReason: condContainersNotReady, initialized: v1.ConditionTrue,
		},
		{
			name:   "running",
			pod:    newPod(v1.RestartPolicyAlways, "app"),
			rs:     rsOf(sb, running("app", "c1", 0)),
			phase:  v1.PodRunning,
			states: map[string]string{"app": "running"},
			ready:  v1.ConditionTrue, initialized: v1.ConditionTrue,
		},
		// A spec update stopped the old container (gracefully: exit 0)
		// and the new one has not started: the pod has not finished.
		{
			name:   "replaced container exited 0 under Never: still running",
			pod:    newPod(v1.RestartPolicyNever, "app"),
			rs:     rsOf(sb, ofOlderSpec(exited("app", "c1", 0, 0, ""))),
			phase:  v1.PodRunning,
			states: map[string]string{"app": "terminated:Completed:0"},
			ready:  v1.ConditionFalse, readyReason: condContainersNotReady, initialized: v1.ConditionTrue,
		},
		{
			name:   "replaced container exited 143 under Never: not failed",
			pod:    newPod(v1.RestartPolicyNever, "app"),
			rs:     rsOf(sb, ofOlderSpec(exited("app", "c1", 0, 143, "Error"))),
			phase:  v1.PodRunning,
			states: map[string]string{"app": "terminated:Error:143"},
			ready:  v1.ConditionFalse, readyReason: condContainersNotReady, initialized: v1.ConditionTrue,
		},
		{
			name:       "replaced container under OnFailure: the new one's waiting reason shows",
			pod:        newPod(v1.RestartPolicyOnFailure, "app"),
			rs:         rsOf(sb, ofOlderSpec(exited("app", "c1", 0, 0, ""))),
			hints:      Hints{Waiting: map[string]Waiting{"app": {Reason: "ErrImagePull", Message: "not found"}}},
			phase:      v1.PodRunning,
			states:     map[string]string{"app": "waiting:ErrImagePull"},
			lastStates: map[string]string{"app": "terminated:Completed:0"},
			ready:      v1.ConditionFalse, readyReason: condContainersNotReady, initialized: v1.ConditionTrue,
		},
		{
			name:   "the new spec's own exit 0 under Never: succeeded",
			pod:    newPod(v1.RestartPolicyNever, "app"),
			rs:     rsOf(sb, exited("app", "c2", 1, 0, ""), ofOlderSpec(exited("app", "c1", 0, 0, ""))),
			phase:  v1.PodSucceeded,
			states: map[string]string{"app": "terminated:Completed:0"},
			ready:  v1.ConditionFalse, readyReason: condPodCompleted, initialized: v1.ConditionTrue,
		},
		{
			name:       "crash loop with Always",
			pod:        newPod(v1.RestartPolicyAlways, "app"),
			rs:         rsOf(sb, exited("app", "c2", 2, 1, "Error"), exited("app", "c1", 1, 1, "Error")),
			hints:      Hints{Waiting: map[string]Waiting{"app": {Reason: ReasonCrashLoopBackOff, Message: "back-off 20s restarting failed container=app"}}},
			phase:      v1.PodRunning,
			states:     map[string]string{"app": "waiting:CrashLoopBackOff"},
			lastStates: map[string]string{"app": "terminated:Error:1"},
			restarts:   map[string]int32{"app": 2},
			ready:      v1.ConditionFalse, readyReason: condContainersNotReady, initialized: v1.ConditionTrue,
		},
		{
			name:   "exited and restarting without a reason recorded yet",
			pod:    newPod(v1.RestartPolicyAlways, "app"),
			rs:     rsOf(sb, exited("app", "c1", 0, 2, "")),
			phase:  v1.PodRunning,
			states: map[string]string{"app": "terminated:Error:2"},
			ready:  v1.ConditionFalse, readyReason: condContainersNotReady, initialized: v1.ConditionTrue,
		},
		{
			name:   "completed Never pod succeeds, waiting hint ignored",
			pod:    newPod(v1.RestartPolicyNever, "job"),
			rs:     rsOf(sb, exited("job", "c1", 0, 0, "")),
			hints:  Hints{Waiting: map[string]Waiting{"job": {Reason: ReasonCrashLoopBackOff}}},
			phase:  v1.PodSucceeded,
			states: map[string]string{"job": "terminated:Completed:0"},
			ready:  v1.ConditionFalse, readyReason: condPodCompleted, initialized: v1.ConditionTrue,
		},
		{
			name:   "failed Never pod",
			pod:    newPod(v1.RestartPolicyNever, "job", "side"),
			rs:     rsOf(sb, exited("job", "c1", 0, 3, "Error"), exited("side", "c2", 0, 0, "Completed")),
			phase:  v1.PodFailed,
			states: map[string]string{"job": "terminated:Error:3", "side": "terminated:Completed:0"},
			ready:  v1.ConditionFalse, readyReason: condPodFailed, initialized: v1.ConditionTrue,
		},
		{
			name:   "OOMKilled Never pod",
			pod:    newPod(v1.RestartPolicyNever, "job"),
			rs:     rsOf(sb, exited("job", "c1", 0, 137, "OOMKilled")),
			phase:  v1.PodFailed,
			states: map[string]string{"job": "terminated:OOMKilled:137"},
			ready:  v1.ConditionFalse, readyReason: condPodFailed, initialized: v1.ConditionTrue,
		},
		{
			name:   "Never pod with one still running",
			pod:    newPod(v1.RestartPolicyNever, "job", "side"),
			rs:     rsOf(sb, exited("job", "c1", 0, 3, "Error"), running("side", "c2", 0)),
			phase:  v1.PodRunning,
			states: map[string]string{"job": "terminated:Error:3", "side": "running"},
			ready:  v1.ConditionFalse, readyReason: condContainersNotReady, initialized: v1.ConditionTrue,
		},
		{
			name:   "OnFailure success",
			pod:    newPod(v1.RestartPolicyOnFailure, "job"),
			rs:     rsOf(sb, exited("job", "c1", 0, 0, "Completed")),
			phase:  v1.PodSucceeded,
			states: map[string]string{"job": "terminated:Completed:0"},
			ready:  v1.ConditionFalse, readyReason: condPodCompleted, initialized: v1.ConditionTrue,
		},
		{
			name:       "OnFailure failure is restarted",
			pod:        newPod(v1.RestartPolicyOnFailure, "job"),
			rs:         rsOf(sb, exited("job", "c1", 0, 1, "Error")),
			hints:      Hints{Waiting: map[string]Waiting{"job": {Reason: ReasonCrashLoopBackOff}}},
			phase:      v1.PodRunning,
			states:     map[string]string{"job": "waiting:CrashLoopBackOff"},
			lastStates: map[string]string{"job": "terminated:Error:1"},
			ready:      v1.ConditionFalse, readyReason: condContainersNotReady, initialized: v1.ConditionTrue,
		},
		{
			name:   "Always pod whose containers all exited 0 keeps Running",
			pod:    newPod(v1.RestartPolicyAlways, "app"),
			rs:     rsOf(sb, exited("app", "c1", 0, 0, "Completed")),
			phase:  v1.PodRunning,
			states: map[string]string{"app": "terminated:Completed:0"},
			ready:  v1.ConditionFalse, readyReason: condContainersNotReady, initialized: v1.ConditionTrue,
		},
		{
			name:   "Always pod stopped for good succeeds",
			pod:    newPod(v1.RestartPolicyAlways, "app"),
			rs:     rsOf(sb, exited("app", "c1", 0, 0, "Completed")),
			hints:  Hints{Terminal: true},
			phase:  v1.PodSucceeded,
			states: map[string]string{"app": "terminated:Completed:0"},
			ready:  v1.ConditionFalse, readyReason: condPodCompleted, initialized: v1.ConditionTrue,
		},
		{
			name:   "Always pod stopped for good with SIGTERM fails",
			pod:    newPod(v1.RestartPolicyAlways, "app"),
			rs:     rsOf(sb, exited("app", "c1", 0, 143, "Error")),
			hints:  Hints{Terminal: true},
			phase:  v1.PodFailed,
			states: map[string]string{"app": "terminated:Error:143"},
			ready:  v1.ConditionFalse, readyReason: condPodFailed, initialized: v1.ConditionTrue,
		},
		{
			name:       "init container running",
			pod:        withInit(newPod(v1.RestartPolicyAlways, "app"), "setup"),
			rs:         rsOf(sb, func() cri.ContainerStatus { c := running("setup", "i1", 0); c.Init = true; return c }()),
			phase:      v1.PodPending,
			states:     map[string]string{"app": "waiting:PodInitializing"},
			initStates: map[string]string{"setup": "running"},
			ready:      v1.ConditionFalse, readyReason: condContainersNotReady, initialized: v1.ConditionFalse,
		},
		{
			name:       "init done, app running",
			pod:        withInit(newPod(v1.RestartPolicyAlways, "app"), "setup"),
			rs:         rsOf(sb, running("app", "c1", 0), initExited("setup", "i1", 0)),
			phase:      v1.PodRunning,
			states:     map[string]string{"app": "running"},
			initStates: map[string]string{"setup": "terminated:Completed:0"},
			ready:      v1.ConditionTrue, initialized: v1.ConditionTrue,
		},
		{
			name:       "init failed with Never fails the pod",
			pod:        withInit(newPod(v1.RestartPolicyNever, "app"), "setup"),
			rs:         rsOf(sb, initExited("setup", "i1", 1)),
			phase:      v1.PodFailed,
			states:     map[string]string{"app": "waiting:PodInitializing"},
			initStates: map[string]string{"setup": "terminated:Error:1"},
			ready:      v1.ConditionFalse, readyReason: condPodFailed, initialized: v1.ConditionFalse,
		},
		{
			name:       "init crash loop with Always stays Pending",
			pod:        withInit(newPod(v1.RestartPolicyAlways, "app"), "setup"),
			rs:         rsOf(sb, initExited("setup", "i1", 1)),
			hints:      Hints{Waiting: map[string]Waiting{"setup": {Reason: ReasonCrashLoopBackOff}}},
			phase:      v1.PodPending,
			states:     map[string]string{"app": "waiting:PodInitializing"},
			initStates: map[string]string{"setup": "waiting:CrashLoopBackOff"},
			ready:      v1.ConditionFalse, readyReason: condContainersNotReady, initialized: v1.ConditionFalse,
		},
		{
			name:   "image never pulled",
			pod:    newPod(v1.RestartPolicyAlways, "app"),
			rs:     rsOf(sb),
			hints:  Hints{Waiting: map[string]Waiting{"app": {Reason: "ErrImageNeverPull", Message: "image not present"}}},
			phase:  v1.PodPending,
			states: map[string]string{"app": "waiting:ErrImageNeverPull"},
			ready:  v1.ConditionFalse, readyReason: condContainersNotReady, initialized: v1.ConditionTrue,
		},
		{
			name:   "admission failure forces Failed",
			pod:    newPod(v1.RestartPolicyAlways, "app"),
			rs:     nil,
			hints:  Hints{FailReason: "UnexpectedAdmissionError", FailMessage: "hostPath denied"},
			phase:  v1.PodFailed,
			states: map[string]string{"app": "waiting:ContainerCreating"},
			ready:  v1.ConditionFalse, readyReason: condPodFailed, initialized: v1.ConditionTrue,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := Build(tc.pod, tc.rs, tc.hints, at(100))
			if s.Phase != tc.phase {
				t.Fatalf("phase = %s, want %s (statuses %+v)", s.Phase, tc.phase, s.ContainerStatuses)
			}
			if len(s.ContainerStatuses) != len(tc.pod.Spec.Containers) {
				t.Fatalf("got %d container statuses for %d containers", len(s.ContainerStatuses), len(tc.pod.Spec.Containers))
			}
			for name, want := range tc.states {
				if got := stateOf(cstatus(t, s.ContainerStatuses, name).State); got != want {
					t.Errorf("container %s state = %s, want %s", name, got, want)
				}
			}
			for name, want := range tc.lastStates {
				if got := stateOf(cstatus(t, s.ContainerStatuses, name).LastTerminationState); got != want {
					t.Errorf("container %s lastState = %s, want %s", name, got, want)
				}
			}
			for name, want := range tc.restarts {
				if got := cstatus(t, s.ContainerStatuses, name).RestartCount; got != want {
					t.Errorf("container %s restarts = %d, want %d", name, got, want)
				}
			}
			for name, want := range tc.initStates {
				if got := stateOf(cstatus(t, s.InitContainerStatuses, name).State); got != want {
					t.Errorf("init container %s state = %s, want %s", name, got, want)
				}
			}
			ready := cond(t, s, v1.PodReady)
			if ready.Status != tc.ready || ready.Reason != tc.readyReason {
				t.Errorf("Ready = %s/%q, want %s/%q", ready.Status, ready.Reason, tc.ready, tc.readyReason)
			}
			if cr := cond(t, s, v1.ContainersReady); cr.Status != ready.Status {
				t.Errorf("ContainersReady %s differs from Ready %s", cr.Status, ready.Status)
			}
			if got := cond(t, s, v1.PodInitialized).Status; got != tc.initialized {
				t.Errorf("Initialized = %s, want %s", got, tc.initialized)
			}
			if got := cond(t, s, v1.PodScheduled).Status; got != v1.ConditionTrue {
				t.Errorf("PodScheduled = %s", got)
			}
			if s.ObservedGeneration != 3 {
				t.Errorf("observedGeneration = %d, want 3", s.ObservedGeneration)
			}
			for _, c := range s.Conditions {
				if c.ObservedGeneration != 3 {
					t.Errorf("condition %s observedGeneration = %d", c.Type, c.ObservedGeneration)
				}
			}
		})
	}
}

func TestBuildSidecar(t *testing.T) {
	always := v1.ContainerRestartPolicyAlways
	pod := withInit(newPod(v1.RestartPolicyAlways, "app"), "proxy")
	pod.Spec.InitContainers[0].RestartPolicy = &always
	sb := []cri.SandboxStatus{readySandbox("10.88.0.5")}
	proxy := running("proxy", "p1", 0)
	proxy.Init = true

	s := Build(pod, rsOf(sb, proxy, running("app", "a1", 0)), Hints{}, at(100))
	if s.Phase != v1.PodRunning || cond(t, s, v1.PodReady).Status != v1.ConditionTrue || cond(t, s, v1.PodInitialized).Status != v1.ConditionTrue {
		t.Fatalf("sidecar pod = %s ready %s initialized %s", s.Phase, cond(t, s, v1.PodReady).Status, cond(t, s, v1.PodInitialized).Status)
	}
	if !s.InitContainerStatuses[0].Ready {
		t.Error("running sidecar not ready")
	}

	// The sidecar crashed after the app started: the pod stays Running
	// but is not ready.
	crashed := exited("proxy", "p1", 0, 1, "Error")
	crashed.Init = true
	s = Build(pod, rsOf(sb, crashed, running("app", "a1", 0)), Hints{Waiting: map[string]Waiting{"proxy": {Reason: ReasonCrashLoopBackOff}}}, at(200))
	if s.Phase != v1.PodRunning || cond(t, s, v1.PodReady).Status != v1.ConditionFalse {
		t.Errorf("crashed sidecar = %s ready %s", s.Phase, cond(t, s, v1.PodReady).Status)
	}
	if got := stateOf(s.InitContainerStatuses[0].State); got != "waiting:CrashLoopBackOff" {
		t.Errorf("sidecar state = %s", got)
	}

	// Before the app exists, a not-yet-started sidecar keeps the pod Pending.
	s = Build(pod, rsOf(sb), Hints{}, at(0))
	if s.Phase != v1.PodPending || cond(t, s, v1.PodInitialized).Status != v1.ConditionFalse {
		t.Errorf("fresh sidecar pod = %s initialized %s", s.Phase, cond(t, s, v1.PodInitialized).Status)
	}
}

func TestBuildContainerDetails(t *testing.T) {
	pod := newPod(v1.RestartPolicyAlways, "b", "a")
	old := cri.SandboxStatus{ID: "sb0", Ready: false, CreatedAt: at(-50), IP: "10.88.0.2", IPs: []string{"10.88.0.2"}}
	rs := rsOf([]cri.SandboxStatus{readySandbox("10.88.0.5"), old},
		running("a", "aaa", 1), exited("a", "aa0", 0, 137, "OOMKilled"), running("b", "bbb", 0))
	rs.Containers[2].Image = "sha256:deadbeef" // runtime reported only the image ID
	s := Build(pod, rs, Hints{RuntimeName: "cri-o", HostIPs: []string{"192.168.1.10"}}, at(100))

	if s.ContainerStatuses[0].Name != "b" || s.ContainerStatuses[1].Name != "a" {
		t.Fatalf("statuses not in spec order: %s, %s", s.ContainerStatuses[0].Name, s.ContainerStatuses[1].Name)
	}
	a := s.ContainerStatuses[1]
	if a.ContainerID != "cri-o://aaa" || a.ImageID != "sha256:img" || a.Image != "busybox:a" || a.RestartCount != 1 {
		t.Errorf("a identity = %q %q %q %d", a.ContainerID, a.ImageID, a.Image, a.RestartCount)
	}
	if !a.Ready || a.Started == nil || !*a.Started {
		t.Errorf("a ready=%v started=%v, want both true", a.Ready, a.Started)
	}
	if !a.State.Running.StartedAt.Time.Equal(at(12)) {
		t.Errorf("a startedAt = %v", a.State.Running.StartedAt)
	}
	lt := a.LastTerminationState.Terminated
	if lt == nil || lt.Reason != "OOMKilled" || lt.ExitCode != 137 || lt.ContainerID != "cri-o://aa0" || !lt.FinishedAt.Time.Equal(at(5)) {
		t.Errorf("a lastState = %+v", lt)
	}
	if b := s.ContainerStatuses[0]; b.Image != "busybox:b" {
		t.Errorf("b image = %q, want the spec image instead of a bare ID", b.Image)
	}
	if s.PodIP != "10.88.0.5" || len(s.PodIPs) != 1 || s.HostIP != "192.168.1.10" || len(s.HostIPs) != 1 {
		t.Errorf("IPs: pod %q %v host %q %v", s.PodIP, s.PodIPs, s.HostIP, s.HostIPs)
	}
	if s.StartTime == nil || !s.StartTime.Time.Equal(at(-50)) {
		t.Errorf("startTime = %v", s.StartTime)
	}
	if s.QOSClass != v1.PodQOSBestEffort {
		t.Errorf("qosClass = %q", s.QOSClass)
	}
	if got := cond(t, s, v1.PodReadyToStartContainers).Status; got != v1.ConditionTrue {
		t.Errorf("PodReadyToStartContainers = %s", got)
	}
}

func TestBuildIPs(t *testing.T) {
	t.Run("dual stack, node family first", func(t *testing.T) {
		sb := readySandbox("fd00::5")
		sb.IPs = []string{"fd00::5", "fd00::6", "10.0.0.5"}
		s := Build(newPod(v1.RestartPolicyAlways, "app"), rsOf([]cri.SandboxStatus{sb}), Hints{HostIPs: []string{"192.168.1.10", "fd00::1"}}, at(0))
		if len(s.PodIPs) != 2 || s.PodIPs[0].IP != "10.0.0.5" || s.PodIPs[1].IP != "fd00::5" || s.PodIP != "10.0.0.5" {
			t.Errorf("podIPs = %v (%s)", s.PodIPs, s.PodIP)
		}
		if len(s.HostIPs) != 2 || s.HostIPs[1].IP != "fd00::1" {
			t.Errorf("hostIPs = %v", s.HostIPs)
		}
	})
	t.Run("host network takes node IPs", func(t *testing.T) {
		pod := newPod(v1.RestartPolicyAlways, "app")
		pod.Spec.HostNetwork = true
		s := Build(pod, rsOf([]cri.SandboxStatus{{ID: "sb", Ready: true}}), Hints{HostIPs: []string{"192.168.1.10"}}, at(0))
		if s.PodIP != "192.168.1.10" {
			t.Errorf("podIP = %q", s.PodIP)
		}
	})
	t.Run("not-ready sandbox keeps previous IPs", func(t *testing.T) {
		pod := newPod(v1.RestartPolicyNever, "job")
		first := Build(pod, rsOf([]cri.SandboxStatus{readySandbox("10.88.0.7")}, running("job", "c1", 0)), Hints{}, at(0))
		stopped := readySandbox("10.88.0.7")
		stopped.Ready = false
		s := Build(pod, rsOf([]cri.SandboxStatus{stopped}, exited("job", "c1", 0, 0, "Completed")), Hints{Previous: &first}, at(10))
		if s.PodIP != "10.88.0.7" || s.Phase != v1.PodSucceeded {
			t.Errorf("podIP = %q phase %s", s.PodIP, s.Phase)
		}
		if got := cond(t, s, v1.PodReadyToStartContainers).Status; got != v1.ConditionFalse {
			t.Errorf("PodReadyToStartContainers = %s with a stopped sandbox", got)
		}
	})
}

func TestBuildKeepsTimesStable(t *testing.T) {
	pod := newPod(v1.RestartPolicyAlways, "app")
	sb := []cri.SandboxStatus{readySandbox("10.88.0.5")}
	first := Build(pod, rsOf(sb, running("app", "c1", 0)), Hints{}, at(100))
	again := Build(pod, rsOf(sb, running("app", "c1", 0)), Hints{Previous: &first}, at(200))
	if !Equal(first, again) {
		t.Fatalf("unchanged pod produced a different status:\n%+v\n%+v", first, again)
	}
	crashed := Build(pod, rsOf(sb, exited("app", "c1", 0, 1, "Error")), Hints{Previous: &again}, at(300))
	if Equal(again, crashed) {
		t.Fatal("crash did not change the status")
	}
	if got := cond(t, crashed, v1.PodReady); got.Status != v1.ConditionFalse || !got.LastTransitionTime.Time.Equal(at(300)) {
		t.Errorf("Ready after crash = %s at %v, want False at %v", got.Status, got.LastTransitionTime, at(300))
	}
	if got := cond(t, crashed, v1.PodScheduled); !got.LastTransitionTime.Time.Equal(at(100)) {
		t.Errorf("PodScheduled transition moved to %v", got.LastTransitionTime)
	}
	if !crashed.StartTime.Time.Equal(at(0)) {
		t.Errorf("startTime moved to %v", crashed.StartTime)
	}
}

func TestBuildRoundTripsThroughStrictJSON(t *testing.T) {
	pod := withInit(newPod(v1.RestartPolicyAlways, "app"), "setup")
	rs := rsOf([]cri.SandboxStatus{readySandbox("10.88.0.5")}, running("app", "c1", 0), initExited("setup", "i1", 0))
	rs.Containers[0].StartedAt = rs.Containers[0].StartedAt.Add(123 * time.Millisecond)
	s := Build(pod, rs, Hints{HostIPs: []string{"192.168.1.10"}}, at(100).Add(456*time.Millisecond))
	data, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var decoded v1.PodStatus
	if err := dec.Decode(&decoded); err != nil {
		t.Fatalf("strict decode: %v\n%s", err, data)
	}
	if !Equal(s, decoded) {
		t.Fatalf("status changed through JSON:\n%+v\n%+v", s, decoded)
	}
	rebuilt := Build(pod, rs, Hints{HostIPs: []string{"192.168.1.10"}, Previous: &decoded}, at(500))
	if !Equal(rebuilt, decoded) {
		t.Fatalf("rebuilding from a decoded previous status changed it:\n%+v\n%+v", decoded, rebuilt)
	}
}

func TestBuildRuntimeUnreachable(t *testing.T) {
	pod := newPod(v1.RestartPolicyAlways, "app")
	prev := Build(pod, rsOf([]cri.SandboxStatus{readySandbox("10.88.0.5")}, running("app", "c1", 0)), Hints{}, at(0))
	s := Build(pod, nil, Hints{Previous: &prev, RuntimeUnreachable: true}, at(50))
	if s.Phase != v1.PodRunning {
		t.Errorf("phase = %s, want the last known Running", s.Phase)
	}
	if cs := s.ContainerStatuses[0]; cs.Ready || stateOf(cs.State) != "running" || cs.ContainerID != "containerd://c1" {
		t.Errorf("container = ready %v state %s id %s", cs.Ready, stateOf(cs.State), cs.ContainerID)
	}
	r := cond(t, s, v1.PodReady)
	if r.Status != v1.ConditionFalse || r.Reason != ReasonRuntimeUnreachable || !r.LastTransitionTime.Time.Equal(at(50)) {
		t.Errorf("Ready = %+v", r)
	}
	if prev.ContainerStatuses[0].Ready != true {
		t.Error("Build modified the previous status it was given")
	}

	fresh := Build(pod, nil, Hints{RuntimeUnreachable: true}, at(50))
	if fresh.Phase != v1.PodPending || cond(t, fresh, v1.PodReady).Reason != ReasonRuntimeUnreachable {
		t.Errorf("unknown pod with unreachable runtime = %s / %+v", fresh.Phase, cond(t, fresh, v1.PodReady))
	}
}

func TestBuildContainerVanished(t *testing.T) {
	pod := newPod(v1.RestartPolicyAlways, "app")
	sb := []cri.SandboxStatus{readySandbox("10.88.0.5")}
	prev := Build(pod, rsOf(sb, running("app", "c1", 0)), Hints{}, at(0))

	gone := Build(pod, rsOf(sb), Hints{Previous: &prev}, at(10))
	cs := gone.ContainerStatuses[0]
	if cs.LastTerminationState.Terminated == nil || cs.LastTerminationState.Terminated.Reason != ReasonContainerStatusUnknown || cs.RestartCount != 1 {
		t.Errorf("vanished container = %+v", cs)
	}
	if gone.Phase != v1.PodRunning {
		t.Errorf("phase = %s, want Running (the container ran)", gone.Phase)
	}

	unknown := cri.ContainerStatus{ID: "c1", Name: "app", State: cri.ContainerUnknown, CreatedAt: at(1)}
	lost := Build(pod, rsOf(sb, unknown), Hints{Previous: &prev}, at(10))
	if got := stateOf(lost.ContainerStatuses[0].State); got != "terminated:ContainerStatusUnknown:137" {
		t.Errorf("unknown-state container = %s", got)
	}
}

func TestBuildTerminalPhaseIsSticky(t *testing.T) {
	pod := newPod(v1.RestartPolicyNever, "job")
	done := Build(pod, rsOf([]cri.SandboxStatus{readySandbox("10.88.0.5")}, exited("job", "c1", 0, 0, "")), Hints{}, at(0))
	if done.Phase != v1.PodSucceeded {
		t.Fatalf("phase = %s", done.Phase)
	}
	// The runtime garbage-collected everything.
	later := Build(pod, nil, Hints{Previous: &done}, at(600))
	if later.Phase != v1.PodSucceeded {
		t.Errorf("phase after GC = %s, want Succeeded", later.Phase)
	}
	if got := stateOf(later.ContainerStatuses[0].State); got != "terminated:Completed:0" {
		t.Errorf("state after GC = %s", got)
	}
}

func TestIsRunningOrDone(t *testing.T) {
	sb := []cri.SandboxStatus{readySandbox("10.88.0.5")}
	cases := []struct {
		name       string
		pod        *v1.Pod
		rs         *cri.PodStatus
		hints      Hints
		done, ok   bool
		reasonPart string
	}{
		{"all running", newPod(v1.RestartPolicyAlways, "a", "b"), rsOf(sb, running("a", "1", 0), running("b", "2", 0)), Hints{}, true, true, "all 2 containers running"},
		{"running again after an OOM kill", newPod(v1.RestartPolicyAlways, "a"), rsOf(sb, exited("a", "1", 0, 137, "OOMKilled"), running("a", "2", 1)), Hints{}, true, true,
			"all 1 containers running; container a restarted 1 time, last ended OOMKilled (exit code 137)"},
		{"one still creating", newPod(v1.RestartPolicyAlways, "a", "b"), rsOf(sb, running("a", "1", 0)), Hints{Waiting: map[string]Waiting{"b": {Reason: "ContainerCreating"}}}, false, false, "container b: ContainerCreating"},
		{"succeeded", newPod(v1.RestartPolicyNever, "a"), rsOf(sb, exited("a", "1", 0, 0, "")), Hints{}, true, true, "succeeded"},
		{"failed", newPod(v1.RestartPolicyNever, "a"), rsOf(sb, exited("a", "1", 0, 2, "Error")), Hints{}, true, false, "container a Error (exit code 2)"},
		{"never pull", newPod(v1.RestartPolicyAlways, "a"), rsOf(sb), Hints{Waiting: map[string]Waiting{"a": {Reason: "ErrImageNeverPull", Message: `image "x" is not present`}}}, true, false, "ErrImageNeverPull"},
		{"config error", newPod(v1.RestartPolicyAlways, "a"), rsOf(sb), Hints{Waiting: map[string]Waiting{"a": {Reason: "CreateContainerConfigError", Message: `configmap "c" not found`}}}, true, false, `configmap "c" not found`},
		{"crash loop is not final", newPod(v1.RestartPolicyAlways, "a"), rsOf(sb, exited("a", "1", 0, 1, "Error")), Hints{Waiting: map[string]Waiting{"a": {Reason: ReasonCrashLoopBackOff}}}, false, false, "CrashLoopBackOff"},
		{"init running", withInit(newPod(v1.RestartPolicyAlways, "a"), "i"), rsOf(sb, func() cri.ContainerStatus { c := running("i", "1", 0); c.Init = true; return c }()), Hints{}, false, false, "PodInitializing"},
		{"rejected", newPod(v1.RestartPolicyAlways, "a"), nil, Hints{FailReason: "Rejected", FailMessage: "hostPath is not allowed"}, true, false, "Rejected: hostPath is not allowed"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			st := Build(tc.pod, tc.rs, tc.hints, at(0))
			done, ok, reason := IsRunningOrDone(st, tc.pod)
			if done != tc.done || ok != tc.ok || !strings.Contains(reason, tc.reasonPart) {
				t.Errorf("IsRunningOrDone = %v %v %q, want %v %v containing %q", done, ok, reason, tc.done, tc.ok, tc.reasonPart)
			}
		})
	}
}

func TestMessage(t *testing.T) {
	sb := []cri.SandboxStatus{readySandbox("10.88.0.5")}
	initRunning := func() cri.ContainerStatus { c := running("i", "1", 0); c.Init = true; return c }()
	deleting := newPod(v1.RestartPolicyAlways, "a")
	now := metav1.NewTime(at(0))
	deleting.DeletionTimestamp = &now
	cases := []struct {
		name  string
		pod   *v1.Pod
		rs    *cri.PodStatus
		hints Hints
		want  string
	}{
		{"running", newPod(v1.RestartPolicyAlways, "a"), rsOf(sb, running("a", "1", 0)), Hints{}, "Running (1/1 ready, 0 restarts)"},
		{"crash loop", newPod(v1.RestartPolicyAlways, "a"), rsOf(sb, exited("a", "2", 5, 1, "Error")), Hints{Waiting: map[string]Waiting{"a": {Reason: ReasonCrashLoopBackOff}}}, "CrashLoopBackOff (0/1 ready, 5 restarts)"},
		{"completed", newPod(v1.RestartPolicyNever, "a"), rsOf(sb, exited("a", "1", 0, 0, "")), Hints{}, "Completed (0/1 ready, 0 restarts)"},
		{"init", withInit(newPod(v1.RestartPolicyAlways, "a"), "i"), rsOf(sb, initRunning), Hints{}, "Init:0/1 (0/1 ready, 0 restarts)"},
		{"init crash", withInit(newPod(v1.RestartPolicyAlways, "a"), "i"), rsOf(sb, initExited("i", "1", 1)), Hints{Waiting: map[string]Waiting{"i": {Reason: ReasonCrashLoopBackOff}}}, "Init:CrashLoopBackOff (0/1 ready, 0 restarts)"},
		{"terminating", deleting, rsOf(sb, running("a", "1", 1)), Hints{}, "Terminating (1/1 ready, 1 restart)"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := Message(tc.pod, Build(tc.pod, tc.rs, tc.hints, at(0))); got != tc.want {
				t.Errorf("Message = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestEqualComparesValues(t *testing.T) {
	a := Build(newPod(v1.RestartPolicyAlways, "app"), nil, Hints{}, at(0))
	b := *a.DeepCopy()
	if !Equal(a, b) {
		t.Fatal("deep copy not equal")
	}
	b.ContainerStatuses[0].State.Waiting.Message = "changed"
	if Equal(a, b) {
		t.Fatal("a change inside a pointed-to struct went unnoticed")
	}
	c := *a.DeepCopy()
	c.StartTime = &metav1.Time{Time: a.StartTime.Time.In(time.FixedZone("x", 3600))}
	if !Equal(a, c) {
		t.Fatal("the same instant in another zone compared unequal")
	}
}

// An agent killed between creating the new spec's container and starting
// it leaves that container created, after the old spec's graceful exit 0:
// the exit is the old spec's, so neither OnFailure nor Never finishes the
// pod on it (once Failed, a pod stays Failed).
func TestBuildNewSpecCreatedAfterOldExitIsNotFinished(t *testing.T) {
	for _, policy := range []v1.RestartPolicy{v1.RestartPolicyOnFailure, v1.RestartPolicyNever} {
		p := newPod(policy, "main")
		created := cri.ContainerStatus{ID: "c2", Name: "main", State: cri.ContainerCreated, CreatedAt: at(20), Image: "busybox:main"}
		old := ofOlderSpec(exited("main", "c1", 0, 0, ""))
		st := Build(p, rsOf([]cri.SandboxStatus{readySandbox("10.0.0.1")}, created, old), Hints{}, at(30))
		if st.Phase == v1.PodFailed || st.Phase == v1.PodSucceeded {
			t.Errorf("%s: phase %s, want the pod not finished", policy, st.Phase)
		}
	}
}
