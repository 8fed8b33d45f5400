package e2e

import (
	"fmt"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	apiv1 "github.com/mqlet/mqlet/api/v1"
)

// sidecarPod is a pod with one sidecar (an init container with
// restartPolicy Always) running sideCmd with sideExtra under it, and one
// app container running mainCmd.
func (e *podEnv) sidecarPod(name, restartPolicy, sideCmd, sideExtra, mainCmd string) []byte {
	return []byte(fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: %s
  namespace: %s
spec:
  restartPolicy: %s
  terminationGracePeriodSeconds: 2
  initContainers:
  - name: side
    image: docker.io/mqlet/busybox:test
    imagePullPolicy: Never
    restartPolicy: Always
    command: ["sh", "-c", %q]
%s  containers:
  - name: main
    image: docker.io/mqlet/busybox:test
    imagePullPolicy: Never
    command: ["sh", "-c", %q]
`, name, e.ns, restartPolicy, sideCmd, sideExtra, mainCmd))
}

// A sidecar runs beside the app: the app starts only once the sidecar's
// startup probe passed (4 s after the sidecar started), the sidecar is
// restarted whenever it exits (restartCount grows) while the app runs on
// untouched, and the pod is Initialized and Running throughout.
func TestSidecarRunsBesideAppRestartedAndGatesApp(t *testing.T) {
	e := newPodEnv(t, "")
	e.cleanupPods("withside")
	id := e.nextID("apply")
	e.mq.Command(e.node, "apply", id, e.sidecarPod("withside", "Always",
		"sleep 4; touch /tmp/up; sleep 4; exit 1", `    startupProbe:
      exec:
        command: ["cat", "/tmp/up"]
      periodSeconds: 1
      failureThreshold: 60
`, "exec sleep 3600"))
	e.mq.WaitReply(e.node, id, apiv1.Accepted, 30*time.Second)

	p := e.waitStatus("withside", podReadyTimeout, "sidecar restartCount >= 2", func(p *v1.Pod) bool {
		cs, ok := containerStatus(p, "side", true)
		return ok && cs.RestartCount >= 2
	})
	main, _ := containerStatus(p, "main", false)
	if main.State.Running == nil || main.RestartCount != 0 {
		t.Fatalf("the app container %s, want running and never restarted while its sidecar restarts", dump(main))
	}
	if p.Status.Phase != v1.PodRunning || podCondition(p, v1.PodInitialized) != v1.ConditionTrue {
		t.Fatalf("phase %s, conditions %s; want Running and Initialized", p.Status.Phase, dump(p.Status.Conditions))
	}

	// The history: while the sidecar had not started, the app waited; the
	// app started at least the probe's 4 s after the sidecar (seconds on
	// the wire, so at least 3 s apart).
	var sideStarted, mainStarted time.Time
	sawGated := false
	for _, q := range e.podStatuses("withside") {
		side, ok1 := containerStatus(&q, "side", true)
		app, ok2 := containerStatus(&q, "main", false)
		if !ok1 || !ok2 {
			t.Fatalf("a status without both containers: %s", dump(q.Status))
		}
		if side.State.Running != nil && side.RestartCount == 0 && sideStarted.IsZero() {
			sideStarted = side.State.Running.StartedAt.Time
		}
		// A restarted sidecar waits for its probe again beside the running
		// app; only the first attempt gates it.
		if side.State.Running != nil && side.RestartCount == 0 && side.Started != nil && !*side.Started {
			sawGated = true
			if app.State.Running != nil || app.State.Terminated != nil {
				t.Fatalf("the app ran before its sidecar started: %s", dump(q.Status))
			}
			if podCondition(&q, v1.PodInitialized) != v1.ConditionFalse {
				t.Fatalf("Initialized before the sidecar started: %s", dump(q.Status.Conditions))
			}
		}
		if app.State.Running != nil && mainStarted.IsZero() {
			mainStarted = app.State.Running.StartedAt.Time
			if side.Started == nil || !*side.Started || !side.Ready {
				t.Fatalf("the app runs beside a sidecar not started and ready: %s", dump(side))
			}
		}
	}
	if !sawGated {
		t.Fatal("no status showed the running sidecar not yet started")
	}
	if sideStarted.IsZero() || mainStarted.IsZero() {
		t.Fatalf("start times not seen: sidecar %v, app %v", sideStarted, mainStarted)
	}
	if gap := mainStarted.Sub(sideStarted); gap < 3*time.Second {
		t.Fatalf("the app started %v after its sidecar; its startup probe passes only after 4 s", gap)
	}
	side, _ := containerStatus(p, "side", true)
	t.Logf("app started %v after the sidecar; sidecar restartCount %d, last exit %s", mainStarted.Sub(sideStarted), side.RestartCount, dump(side.LastTerminationState.Terminated))
}

// A Job-like pod (restartPolicy Never) with a sidecar completes when its
// app container exits: the phase becomes Succeeded, its sidecar is
// stopped after the app ended (not restarted), and nothing of it runs.
func TestSidecarJobCompletes(t *testing.T) {
	e := newPodEnv(t, "")
	e.cleanupPods("job")
	id := e.nextID("apply")
	e.mq.Command(e.node, "apply", id, e.sidecarPod("job", "Never",
		"trap 'exit 0' TERM; while true; do sleep 1; done", "", "sleep 3; exit 0"))
	e.mq.WaitReply(e.node, id, apiv1.Accepted, 30*time.Second)

	p := e.waitStatus("job", podReadyTimeout, "Succeeded", func(p *v1.Pod) bool { return p.Status.Phase == v1.PodSucceeded })
	main, _ := containerStatus(p, "main", false)
	side, _ := containerStatus(p, "side", true)
	if main.State.Terminated == nil || main.State.Terminated.ExitCode != 0 {
		t.Fatalf("app container %s, want terminated with exit 0", dump(main))
	}
	if side.State.Terminated == nil || side.RestartCount != 0 {
		t.Fatalf("sidecar %s, want stopped and never restarted", dump(side))
	}
	if side.State.Terminated.FinishedAt.Before(&main.State.Terminated.FinishedAt) {
		t.Fatalf("the sidecar stopped at %v, before its app ended at %v", side.State.Terminated.FinishedAt, main.State.Terminated.FinishedAt)
	}
	sawBeside := false
	for _, q := range e.podStatuses("job") {
		s, _ := containerStatus(&q, "side", true)
		m, _ := containerStatus(&q, "main", false)
		if s.State.Running != nil && m.State.Running != nil {
			sawBeside = true
		}
		if q.Status.Phase == v1.PodPending && m.State.Running != nil {
			t.Fatalf("Pending while the app runs: %s", dump(q.Status))
		}
	}
	if !sawBeside {
		t.Fatal("no status showed the sidecar running beside the app")
	}
	Eventually(t, podGoneTimeout, "no container of the job running", func() bool { return len(e.cri.Running(e.ns, "job")) == 0 })
	t.Logf("job Succeeded; sidecar %s", dump(side.State.Terminated))
}
