package e2e

import (
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	apiv1 "github.com/mqlet/mqlet/api/v1"
)

// applyAccepted sends an apply and waits until it is accepted (a pod
// that runs to its end may be answered succeeded while it runs, or failed).
func (e *podEnv) applyAccepted(payload []byte) {
	e.t.Helper()
	id := e.nextID("apply")
	e.mq.Command(e.node, "apply", id, payload)
	e.mq.WaitReply(e.node, id, apiv1.Accepted, 30*time.Second)
}

func terminated(p *v1.Pod, c string) *v1.ContainerStateTerminated {
	cs, ok := containerStatus(p, c, false)
	if !ok {
		return nil
	}
	return cs.State.Terminated
}

// What a container writes to its terminationMessagePath is its terminated
// message (the default /dev/termination-log, and a path of its own).
func TestPodTerminationMessageFromFile(t *testing.T) {
	e := newPodEnv(t, "")
	e.cleanupPods("msg")
	e.applyAccepted(e.probePod("msg", "Never", "echo bye > /dev/termination-log; exit 1", `  - name: custom
    image: docker.io/mqlet/busybox:test
    imagePullPolicy: Never
    terminationMessagePath: /tmp/why
    command: ["sh", "-c", "printf 'custom words' > /tmp/why"]
`))
	p := e.waitStatus("msg", podReadyTimeout, "both containers terminated", func(p *v1.Pod) bool {
		return terminated(p, "main") != nil && terminated(p, "custom") != nil
	})
	if got := terminated(p, "main"); got.Message != "bye\n" || got.ExitCode != 1 {
		t.Errorf("main terminated %s, want message %q and exit 1", dump(got), "bye\n")
	}
	if got := terminated(p, "custom"); got.Message != "custom words" || got.ExitCode != 0 {
		t.Errorf("custom terminated %s, want message %q and exit 0", dump(got), "custom words")
	}
	if p.Status.Phase != v1.PodFailed {
		t.Errorf("phase %s, want Failed", p.Status.Phase)
	}
}

// FallbackToLogsOnError: a failed container that wrote no message gets
// the tail of its log; one that succeeded gets none. Every line goes to
// stdout: the runtime copies stdout and stderr into the log separately, so
// their lines keep no order between the two streams.
func TestPodTerminationMessageFromLogsOnError(t *testing.T) {
	e := newPodEnv(t, "")
	e.cleanupPods("logmsg")
	e.applyAccepted(e.probePod("logmsg", "Never", "for i in $(seq 1 200); do echo line-$i; done; echo last-words; exit 3",
		`    terminationMessagePolicy: FallbackToLogsOnError
  - name: fine
    image: docker.io/mqlet/busybox:test
    imagePullPolicy: Never
    terminationMessagePolicy: FallbackToLogsOnError
    command: ["sh", "-c", "echo all good"]
`))
	p := e.waitStatus("logmsg", podReadyTimeout, "both containers terminated", func(p *v1.Pod) bool {
		return terminated(p, "main") != nil && terminated(p, "fine") != nil
	})
	main := terminated(p, "main")
	lines := strings.Split(strings.TrimSuffix(main.Message, "\n"), "\n")
	if main.ExitCode != 3 || !strings.HasSuffix(main.Message, "line-200\nlast-words\n") || len(lines) != 80 || lines[0] != "line-122" || len(main.Message) > 2048 {
		t.Errorf("main terminated exit %d with %d lines (%d bytes) from %q, want exit 3 and the log's last 80 lines ending in last-words",
			main.ExitCode, len(lines), len(main.Message), lines[0])
	}
	if fine := terminated(p, "fine"); fine.ExitCode != 0 || fine.Message != "" {
		t.Errorf("fine terminated %s, want exit 0 and no message", dump(fine))
	}
}

// activeDeadlineSeconds: a pod running past it is stopped (Killing) and
// Failed with DeadlineExceeded a moment after the deadline, and its
// container is not restarted although its restartPolicy is Always.
func TestPodActiveDeadline(t *testing.T) {
	e := newPodEnv(t, "")
	e.cleanupPods("deadline")
	from := e.mq.Mark()
	pod := strings.Replace(string(e.probePod("deadline", "Always", "sleep 3600", "")),
		"  restartPolicy: Always\n", "  restartPolicy: Always\n  activeDeadlineSeconds: 3\n", 1)
	e.apply([]byte(pod), apiv1.Succeeded, podReadyTimeout)
	p := e.waitStatus("deadline", 60*time.Second, "Failed with DeadlineExceeded", func(p *v1.Pod) bool {
		return p.Status.Phase == v1.PodFailed && p.Status.Reason == "DeadlineExceeded"
	})
	failedAt := time.Now()
	if p.Status.StartTime == nil {
		t.Fatalf("no startTime: %s", dump(p.Status))
	}
	late := failedAt.Sub(p.Status.StartTime.Time) - 3*time.Second
	t.Logf("failed %v after the deadline (startTime %s, second precision)", late.Round(time.Millisecond), p.Status.StartTime.Format(time.RFC3339))
	if late > 5*time.Second {
		t.Errorf("failed %v after the deadline, want within a few seconds", late)
	}
	if p.Status.Message != "Pod was active on the node longer than the specified deadline" {
		t.Errorf("message %q", p.Status.Message)
	}
	p = e.waitStatus("deadline", 30*time.Second, "its container terminated", func(p *v1.Pod) bool { return terminated(p, "main") != nil })
	if p.Status.Phase != v1.PodFailed || p.Status.Reason != "DeadlineExceeded" {
		t.Errorf("after the stop: phase %s reason %s", p.Status.Phase, p.Status.Reason)
	}
	if ev := e.eventsOf(from, "deadline", "Killing"); len(ev) == 0 {
		t.Error("no Killing event")
	}
	if ev := e.eventsOf(from, "deadline", "DeadlineExceeded"); len(ev) != 1 {
		t.Errorf("DeadlineExceeded events = %s, want one", dump(ev))
	}
	// No restart after it: the backoff of this env is 1 s, so a restart
	// would show within a few seconds.
	until := time.Now().Add(5 * time.Second)
	for time.Now().Before(until) {
		if ids := e.runningIDs("deadline"); len(ids) != 0 {
			t.Fatalf("a container runs again after the deadline: %v", ids)
		}
		if p, _ := e.status("deadline"); p != nil && p.Status.Phase != v1.PodFailed {
			t.Fatalf("phase went back to %s", p.Status.Phase)
		}
		<-time.After(200 * time.Millisecond)
	}
}

// The deadline counts from the pod's start, not from mqlet's: killed and
// started again midway, mqlet fails the pod at its original deadline.
func TestPodActiveDeadlineSurvivesARestart(t *testing.T) {
	e := newPodEnv(t, "")
	e.cleanupPods("deadline2")
	pod := strings.Replace(string(e.probePod("deadline2", "Always", "sleep 3600", "")),
		"  restartPolicy: Always\n", "  restartPolicy: Always\n  activeDeadlineSeconds: 10\n", 1)
	e.apply([]byte(pod), apiv1.Succeeded, podReadyTimeout)
	p := e.waitStatus("deadline2", 30*time.Second, "a startTime", func(p *v1.Pod) bool { return p.Status.StartTime != nil })
	start := p.Status.StartTime.Time
	e.kill9BetweenSyncs()
	// Down past half the deadline (the scenario, not a wait for a sync).
	<-time.After(time.Until(start.Add(5 * time.Second)))
	restarted := time.Now()
	e.agent.Restart()
	e.waitStatus("deadline2", 30*time.Second, "Failed with DeadlineExceeded after the restart", func(p *v1.Pod) bool {
		return p.Status.Phase == v1.PodFailed && p.Status.Reason == "DeadlineExceeded"
	})
	failed := time.Now()
	t.Logf("failed %v after the start (deadline 10 s), %v after the restart", failed.Sub(start).Round(time.Millisecond), failed.Sub(restarted).Round(time.Millisecond))
	if failed.Sub(restarted) >= 9*time.Second {
		t.Errorf("failed %v after the restart: the deadline was counted from the restart", failed.Sub(restarted))
	}
	if late := failed.Sub(start) - 10*time.Second; late > 5*time.Second {
		t.Errorf("failed %v after the deadline", late)
	}
	if ids := e.runningIDs("deadline2"); len(ids) != 0 {
		e.waitStatus("deadline2", 30*time.Second, "its container terminated", func(p *v1.Pod) bool { return terminated(p, "main") != nil })
	}
}
