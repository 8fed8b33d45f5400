package e2e

import (
	"fmt"
	apiv1 "github.com/mqlet/mqlet/api/v1"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
)

// probePod is a busybox pod running cmd with the given container extras
// (probes, ports) indented under the container.
func (e *podEnv) probePod(name, restartPolicy, cmd, extra string) []byte {
	return []byte(fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: %s
  namespace: %s
spec:
  restartPolicy: %s
  terminationGracePeriodSeconds: 2
  containers:
  - name: main
    image: docker.io/mqlet/busybox:test
    imagePullPolicy: Never
    command: ["sh", "-c", %q]
%s`, name, e.ns, restartPolicy, cmd, extra))
}

func podCondition(p *v1.Pod, t v1.PodConditionType) v1.ConditionStatus {
	for _, c := range p.Status.Conditions {
		if c.Type == t {
			return c.Status
		}
	}
	return ""
}

// eventsOf returns the events about pod name with this reason since mark.
func (e *podEnv) eventsOf(from int, name, reason string) []v1.Event {
	var out []v1.Event
	for _, ev := range e.events(from) {
		if ev.InvolvedObject.Name == name && ev.InvolvedObject.Namespace == e.ns && ev.Reason == reason {
			out = append(out, ev)
		}
	}
	return out
}

// livenessRestarts applies a pod whose container passes its liveness probe
// for its first seconds and then fails it, and checks the kubelet's
// answer: Unhealthy events, a Killing event, the container restarted
// with a growing restartCount, each attempt having lived past its healthy
// seconds (so it was not killed while healthy).
func livenessRestarts(t *testing.T, kind, cmd, extra string) {
	e := newPodEnv(t, "")
	e.cleanupPods("live")
	from := e.mq.Mark()
	id := e.nextID("apply")
	e.mq.Command(e.node, "apply", id, e.probePod("live", "Always", cmd, extra))
	e.mq.WaitReply(e.node, id, apiv1.Accepted, 30*time.Second)

	p := e.waitStatus("live", 120*time.Second, "restartCount >= 2", func(p *v1.Pod) bool {
		cs, ok := containerStatus(p, "main", false)
		return ok && cs.RestartCount >= 2
	})
	cs, _ := containerStatus(p, "main", false)
	last := cs.LastTerminationState.Terminated
	if last == nil {
		t.Fatalf("restarted container has no last termination: %s", dump(cs))
	}
	if lived := last.FinishedAt.Sub(last.StartedAt.Time); lived < 3*time.Second {
		t.Errorf("the previous attempt lived %v; it was healthy for its first 4 s and must not have been killed then", lived)
	}
	unhealthy := e.eventsOf(from, "live", "Unhealthy")
	if len(unhealthy) == 0 || !strings.HasPrefix(unhealthy[0].Message, "Liveness probe failed") {
		t.Fatalf("Unhealthy events = %s, want \"Liveness probe failed: ...\"", dump(unhealthy))
	}
	if unhealthy[0].InvolvedObject.FieldPath != "spec.containers{main}" || unhealthy[0].Type != v1.EventTypeWarning {
		t.Errorf("Unhealthy event %s, want a Warning about spec.containers{main}", dump(unhealthy[0]))
	}
	killing := e.eventsOf(from, "live", "Killing")
	found := false
	for _, ev := range killing {
		if strings.Contains(ev.Message, "failed liveness probe, will be restarted") {
			found = true
		}
	}
	if !found {
		t.Fatalf("no Killing event saying the container failed its liveness probe: %s", dump(killing))
	}
	t.Logf("%s liveness: restartCount %d, first Unhealthy %q, %d Killing events", kind, cs.RestartCount, unhealthy[0].Message, len(killing))
}

// An exec liveness probe whose file goes away restarts the container.
func TestProbeExecLivenessRestarts(t *testing.T) {
	livenessRestarts(t, "exec", "touch /tmp/healthy; sleep 4; rm -f /tmp/healthy; exec sleep 3600", `    livenessProbe:
      exec:
        command: ["cat", "/tmp/healthy"]
      periodSeconds: 1
      failureThreshold: 2
`)
}

// An httpGet liveness probe (named port, a header) that starts getting
// 404 restarts the container.
func TestProbeHTTPGetLivenessRestarts(t *testing.T) {
	livenessRestarts(t, "httpGet", "mkdir -p /www; echo ok > /www/healthz; httpd -f -p 8080 -h /www & sleep 4; rm -f /www/healthz; wait", `    ports:
    - name: web
      containerPort: 8080
    livenessProbe:
      httpGet:
        path: /healthz
        port: web
        httpHeaders:
        - name: X-Probe
          value: mqlet
      periodSeconds: 1
      failureThreshold: 2
`)
}

// A tcpSocket liveness probe whose listener goes away restarts the container.
func TestProbeTCPSocketLivenessRestarts(t *testing.T) {
	livenessRestarts(t, "tcpSocket", "mkdir -p /www; httpd -f -p 8081 -h /www & pid=$!; sleep 4; kill $pid; exec sleep 3600", `    livenessProbe:
      tcpSocket:
        port: 8081
      periodSeconds: 1
      failureThreshold: 2
`)
}

// A readiness probe that never passes keeps the container, ContainersReady
// and Ready false while the pod runs, and restarts nothing.
func TestProbeFailingReadinessKeepsPodUnready(t *testing.T) {
	e := newPodEnv(t, "")
	e.cleanupPods("unready")
	from := e.mq.Mark()
	id := e.nextID("apply")
	e.mq.Command(e.node, "apply", id, e.probePod("unready", "Always", "exec sleep 3600", `    readinessProbe:
      exec:
        command: ["cat", "/tmp/ready"]
      periodSeconds: 1
`))
	e.mq.WaitReply(e.node, id, apiv1.Accepted, 30*time.Second)
	e.waitStatus("unready", podReadyTimeout, "running", func(p *v1.Pod) bool { return p.Status.Phase == v1.PodRunning })
	Eventually(t, 60*time.Second, "3 failed readiness checks", func() bool { return len(e.eventsOf(from, "unready", "Unhealthy")) >= 3 })
	for _, p := range e.podStatuses("unready") {
		cs, ok := containerStatus(&p, "main", false)
		if ok && cs.Ready || podCondition(&p, v1.ContainersReady) == v1.ConditionTrue || podCondition(&p, v1.PodReady) == v1.ConditionTrue {
			t.Fatalf("a status claims readiness although the probe never passed: %s", dump(p.Status))
		}
	}
	p, _ := e.status("unready")
	cs, _ := containerStatus(p, "main", false)
	if p.Status.Phase != v1.PodRunning || cs.State.Running == nil || cs.RestartCount != 0 || cs.Started == nil || !*cs.Started {
		t.Fatalf("status %s, want Running, started, not restarted", dump(p.Status))
	}
	if podCondition(p, v1.ContainersReady) != v1.ConditionFalse || podCondition(p, v1.PodReady) != v1.ConditionFalse {
		t.Fatalf("conditions %s, want ContainersReady and Ready False", dump(p.Status.Conditions))
	}
	ev := e.eventsOf(from, "unready", "Unhealthy")[0]
	if !strings.HasPrefix(ev.Message, "Readiness probe failed") {
		t.Fatalf("Unhealthy event %q, want \"Readiness probe failed: ...\"", ev.Message)
	}
	if k := e.eventsOf(from, "unready", "Killing"); len(k) != 0 {
		t.Fatalf("a failing readiness probe killed the container: %s", dump(k))
	}
}

// No status claims readiness before initialDelaySeconds have passed since
// the container started; readiness comes soon after.
func TestProbeInitialDelayHonoured(t *testing.T) {
	e := newPodEnv(t, "")
	e.cleanupPods("delayed")
	id := e.nextID("apply")
	e.mq.Command(e.node, "apply", id, e.probePod("delayed", "Always", "exec sleep 3600", `    readinessProbe:
      exec:
        command: ["true"]
      initialDelaySeconds: 6
      periodSeconds: 1
`))
	e.mq.WaitReply(e.node, id, apiv1.Accepted, 30*time.Second)
	p := e.waitStatus("delayed", podReadyTimeout, "Ready", func(p *v1.Pod) bool { return podCondition(p, v1.PodReady) == v1.ConditionTrue })
	cs, _ := containerStatus(p, "main", false)
	if cs.State.Running == nil {
		t.Fatalf("ready but not running: %s", dump(cs))
	}
	started := cs.State.Running.StartedAt.Time
	var readyAt time.Time
	for _, c := range p.Status.Conditions {
		if c.Type == v1.PodReady {
			readyAt = c.LastTransitionTime.Time
		}
	}
	// Times are whole seconds on the wire: allow one for the truncation.
	if readyAt.Before(started.Add(5 * time.Second)) {
		t.Fatalf("Ready at %v, %v after the container started; initialDelaySeconds is 6", readyAt, readyAt.Sub(started))
	}
	if reply := e.waitFinalAny(id, 30*time.Second); reply.Phase != "succeeded" {
		t.Fatalf("apply reply %s, want succeeded", dump(reply))
	}
	t.Logf("ready %v after the container started (initialDelaySeconds 6)", readyAt.Sub(started))
}

// A startup probe holds liveness and readiness back: a liveness probe
// that would fail at once does not kill the slow starter, Started and
// Ready come only after the startup probe passed.
func TestProbeStartupHoldsOthersBack(t *testing.T) {
	e := newPodEnv(t, "")
	e.cleanupPods("slow")
	from := e.mq.Mark()
	id := e.nextID("apply")
	e.mq.Command(e.node, "apply", id, e.probePod("slow", "Always", "sleep 6; touch /tmp/started; exec sleep 3600", `    startupProbe:
      exec:
        command: ["cat", "/tmp/started"]
      periodSeconds: 1
      failureThreshold: 60
    livenessProbe:
      exec:
        command: ["cat", "/tmp/started"]
      periodSeconds: 1
      failureThreshold: 1
    readinessProbe:
      exec:
        command: ["true"]
      periodSeconds: 1
`))
	e.mq.WaitReply(e.node, id, apiv1.Accepted, 30*time.Second)
	p := e.waitStatus("slow", podReadyTimeout, "Ready", func(p *v1.Pod) bool { return podCondition(p, v1.PodReady) == v1.ConditionTrue })
	cs, _ := containerStatus(p, "main", false)
	if cs.RestartCount != 0 || cs.Started == nil || !*cs.Started || !cs.Ready {
		t.Fatalf("status %s, want started, ready, never restarted", dump(cs))
	}
	sawUnstarted := false
	for _, q := range e.podStatuses("slow") {
		c, ok := containerStatus(&q, "main", false)
		if !ok || c.State.Running == nil {
			continue
		}
		if c.Started != nil && !*c.Started {
			sawUnstarted = true
			if c.Ready {
				t.Fatalf("ready before started: %s", dump(c))
			}
		}
	}
	if !sawUnstarted {
		t.Error("no status showed the running container not yet started")
	}
	for _, ev := range e.eventsOf(from, "slow", "Unhealthy") {
		if !strings.HasPrefix(ev.Message, "Startup probe failed") {
			t.Fatalf("an Unhealthy event other than the startup probe's: %q (liveness/readiness must wait)", ev.Message)
		}
	}
	if k := e.eventsOf(from, "slow", "Killing"); len(k) != 0 {
		t.Fatalf("the slow starter was killed: %s", dump(k))
	}
}
