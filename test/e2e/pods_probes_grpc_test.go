package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	apiv1 "github.com/mqlet/mqlet/api/v1"
)

// grpcHealthPod runs the grpchealth image (a grpc.health.v1 server built
// by test/images/build.sh) with args, and the given probes.
func (e *podEnv) grpcHealthPod(name string, args []string, probes string) []byte {
	quoted := make([]string, len(args))
	for i, a := range args {
		quoted[i] = fmt.Sprintf("%q", a)
	}
	return []byte(fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: %s
  namespace: %s
spec:
  restartPolicy: Always
  terminationGracePeriodSeconds: 2
  containers:
  - name: main
    image: docker.io/mqlet/grpchealth:test
    imagePullPolicy: Never
    args: [%s]
    ports:
    - containerPort: 9000
%s`, name, e.ns, strings.Join(quoted, ", "), probes))
}

// A grpc readiness probe (with a service name) makes the pod Ready while
// the server says SERVING and not Ready once it says NOT_SERVING, without
// a restart.
func TestProbeGRPCReadiness(t *testing.T) {
	e := newPodEnv(t, "")
	e.cleanupPods("grpc-ready")
	from := e.mq.Mark()
	id := e.nextID("apply")
	e.mq.Command(e.node, "apply", id, e.grpcHealthPod("grpc-ready",
		[]string{"-port", "9000", "-service", "mqlet.Probe", "-serve-for", "8s", "-then", "not-serving"}, `    readinessProbe:
      grpc:
        port: 9000
        service: mqlet.Probe
      periodSeconds: 1
`))
	e.mq.WaitReply(e.node, id, apiv1.Accepted, 30*time.Second)
	e.waitStatus("grpc-ready", podReadyTimeout, "Ready", func(p *v1.Pod) bool {
		cs, ok := containerStatus(p, "main", false)
		return ok && cs.Ready && podCondition(p, v1.PodReady) == v1.ConditionTrue && podCondition(p, v1.ContainersReady) == v1.ConditionTrue
	})
	p := e.waitStatus("grpc-ready", 60*time.Second, "not Ready after NOT_SERVING", func(p *v1.Pod) bool {
		cs, ok := containerStatus(p, "main", false)
		return ok && !cs.Ready && cs.State.Running != nil && podCondition(p, v1.PodReady) == v1.ConditionFalse
	})
	if cs, _ := containerStatus(p, "main", false); cs.RestartCount != 0 || p.Status.Phase != v1.PodRunning {
		t.Fatalf("status %s, want Running and never restarted", dump(p.Status))
	}
	// (A check before the server listened may have failed otherwise.)
	var messages []string
	found := false
	for _, ev := range e.eventsOf(from, "grpc-ready", "Unhealthy") {
		messages = append(messages, ev.Message)
		found = found || ev.Message == `Readiness probe failed: service unhealthy (responded with "NOT_SERVING")`
	}
	if !found {
		t.Fatalf("Unhealthy events %q, want \"Readiness probe failed: service unhealthy (responded with \\\"NOT_SERVING\\\")\"", messages)
	}
	if k := e.eventsOf(from, "grpc-ready", "Killing"); len(k) != 0 {
		t.Fatalf("a failing readiness probe killed the container: %s", dump(k))
	}
}

// grpcLivenessRestarts: a grpc liveness probe restarts the container once
// the server stops answering SERVING (how, per then), with Unhealthy and
// Killing events and a growing restartCount; each new attempt serves
// again and becomes Ready under its grpc readiness probe.
func grpcLivenessRestarts(t *testing.T, then, failure string) {
	e := newPodEnv(t, "")
	e.cleanupPods("grpc-live")
	from := e.mq.Mark()
	id := e.nextID("apply")
	e.mq.Command(e.node, "apply", id, e.grpcHealthPod("grpc-live",
		[]string{"-port", "9000", "-serve-for", "5s", "-then", then}, `    readinessProbe:
      grpc:
        port: 9000
      periodSeconds: 1
    livenessProbe:
      grpc:
        port: 9000
      periodSeconds: 1
      failureThreshold: 2
`))
	e.mq.WaitReply(e.node, id, apiv1.Accepted, 30*time.Second)
	e.waitStatus("grpc-live", podReadyTimeout, "Ready", func(p *v1.Pod) bool {
		cs, ok := containerStatus(p, "main", false)
		return ok && cs.Ready && cs.RestartCount == 0
	})
	p := e.waitStatus("grpc-live", 120*time.Second, "restartCount >= 2", func(p *v1.Pod) bool {
		cs, ok := containerStatus(p, "main", false)
		return ok && cs.RestartCount >= 2
	})
	cs, _ := containerStatus(p, "main", false)
	if last := cs.LastTerminationState.Terminated; last == nil || last.FinishedAt.Sub(last.StartedAt.Time) < 4*time.Second {
		t.Errorf("the previous attempt %s was killed before its 5 s of serving", dump(cs.LastTerminationState))
	}
	// A check before the server listened may have failed otherwise.
	var liveness []string
	said := ""
	for _, ev := range e.eventsOf(from, "grpc-live", "Unhealthy") {
		if strings.HasPrefix(ev.Message, "Liveness probe failed") {
			liveness = append(liveness, ev.Message)
			if said == "" && strings.Contains(ev.Message, failure) {
				said = ev.Message
			}
		}
	}
	if said == "" {
		t.Fatalf("Liveness Unhealthy events %q, want one saying %q", liveness, failure)
	}
	found := false
	for _, ev := range e.eventsOf(from, "grpc-live", "Killing") {
		found = found || strings.Contains(ev.Message, "failed liveness probe, will be restarted")
	}
	if !found {
		t.Fatalf("no Killing event for the failed liveness probe: %s", dump(e.eventsOf(from, "grpc-live", "Killing")))
	}
	// A restarted attempt serves again: Ready comes back.
	e.waitStatus("grpc-live", 60*time.Second, "Ready after a restart", func(p *v1.Pod) bool {
		cs, ok := containerStatus(p, "main", false)
		return ok && cs.Ready && cs.RestartCount >= 2 && podCondition(p, v1.PodReady) == v1.ConditionTrue
	})
	t.Logf("grpc liveness (%s): restartCount %d, Unhealthy %q", then, cs.RestartCount, said)
}

// The health service turns NOT_SERVING: the liveness probe restarts it.
func TestProbeGRPCLivenessNotServingRestarts(t *testing.T) {
	grpcLivenessRestarts(t, "not-serving", `service unhealthy (responded with "NOT_SERVING")`)
}

// The server stops (the process lives on, nothing listens): the liveness
// probe restarts it.
func TestProbeGRPCLivenessStoppedRestarts(t *testing.T) {
	grpcLivenessRestarts(t, "stop", "connection refused")
}
