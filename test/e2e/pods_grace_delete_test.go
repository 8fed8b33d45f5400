package e2e

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	apiv1 "github.com/mqlet/mqlet/api/v1"
)

// A delete of a pod that stops gracefully for longer than
// pods.applyDeadline is answered in_progress at the deadline, saying when
// the grace period ends, and succeeded once the pod is gone; never failed
// while the pod is within its grace period (issue 18). Meanwhile the delete
// is visible, as the kubelet and the API server show it (issue 22): a
// Killing event per container, the pod published with its deletion
// timestamp (Terminating), and get of the pod by name answers it.
func TestDeleteWithinLongGracePeriodIsNotFailed(t *testing.T) {
	e := startSlowToStopPod(t)
	from := e.mq.Mark()
	id := e.nextID("delete")
	sent := time.Now()
	e.mq.Command(e.node, "delete", id, fmt.Appendf(nil, `{"kind":"Pod","namespace":%q,"name":"slow"}`, e.ns))
	waiting := e.mq.WaitReply(e.node, id, apiv1.InProgress, 60*time.Second)
	if !strings.Contains(waiting.Message, "terminating: grace period ends at") {
		t.Fatalf("in_progress %q, want it to say when the grace period ends", waiting.Message)
	}
	if len(e.cri.Running(e.ns, "slow")) == 0 {
		t.Fatal("the pod stopped before the grace period ended: the container did not ignore SIGTERM")
	}
	if evs := e.eventsOf(from, "slow", "Killing"); len(evs) == 0 || evs[0].Message != "Stopping container main" {
		t.Errorf("Killing events of the deleted pod: %+v, want \"Stopping container main\"", evs)
	}
	m := e.mq.WaitFor(from, 10*time.Second, "the pod published terminating", func(m Msg) bool {
		var p v1.Pod
		return m.Topic == prefix+"/"+e.node+"/pods/"+e.ns+"/slow" && json.Unmarshal(m.Payload, &p) == nil && p.DeletionTimestamp != nil
	})
	var published v1.Pod
	_ = json.Unmarshal(m.Payload, &published)
	if g := published.DeletionGracePeriodSeconds; g == nil || *g != 14 {
		t.Errorf("terminating pod published with deletionGracePeriodSeconds %v, want 14", g)
	}
	got := final(t, e.command("get", apiv1.GetRequest{Kind: "Pod", Namespace: e.ns, Name: "slow"}, verbsTimeout), apiv1.Succeeded)
	var res apiv1.GetResult
	if err := json.Unmarshal(got.RawResult(), &res); err != nil || len(res.Pods) != 1 || res.Pods[0].DeletionTimestamp == nil {
		t.Errorf("get of the terminating pod: %s (%v), want it with its deletion timestamp", got.RawResult(), err)
	}
	final := e.waitFinal(id, apiv1.Succeeded, 90*time.Second)
	if took := time.Since(sent); took < 10*time.Second {
		t.Fatalf("succeeded after %v, before the grace period could end", took)
	}
	if !strings.Contains(final.Message, "deleted") {
		t.Fatalf("final %q", final.Message)
	}
	if n := len(e.cri.Sandboxes(e.ns, "slow")); n != 0 {
		t.Fatalf("%d sandboxes left after the delete succeeded", n)
	}
}

// The same delete with mqlet killed while the pod is within its grace
// period, after the in_progress: the moved deadline was kept with the
// pending reply, so the restarted mqlet answers succeeded once the pod is
// gone, not failed at the deadline the delete had before.
func TestDeleteWithinGracePeriodSurvivesAKill(t *testing.T) {
	e := startSlowToStopPod(t)
	id := e.nextID("delete")
	e.mq.Command(e.node, "delete", id, fmt.Appendf(nil, `{"kind":"Pod","namespace":%q,"name":"slow"}`, e.ns))
	e.mq.WaitReply(e.node, id, apiv1.InProgress, 60*time.Second)
	e.agent.Kill9()
	e.restartArmed("")
	e.waitFinal(id, apiv1.Succeeded, 90*time.Second)
	e.exactlyOneFinal(id, apiv1.Succeeded)
	if n := len(e.cri.Sandboxes(e.ns, "slow")); n != 0 {
		t.Fatalf("%d sandboxes left after the delete succeeded", n)
	}
}

// startSlowToStopPod starts mqlet with a 4 s applyDeadline and runs pod
// "slow", whose container ignores SIGTERM for its 14 s grace period.
func startSlowToStopPod(t *testing.T) *podEnv {
	t.Helper()
	e := startPodEnv(t, func(logDir string) string {
		return fmt.Sprintf(`runtime:
  plegPeriod: 500ms
  podLogDir: %s
pods:
  applyDeadline: 4s
telemetry:
  metricsInterval: 0s
`, logDir)
	})
	e.cleanupPods()
	pod := fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: slow
  namespace: %s
spec:
  terminationGracePeriodSeconds: 14
  containers:
  - name: main
    image: docker.io/mqlet/busybox:test
    imagePullPolicy: Never
    command: ["sh", "-c", "trap 'echo ignoring TERM' TERM; while true; do sleep 1; done"]
`, e.ns)
	e.apply([]byte(pod), apiv1.Succeeded, podReadyTimeout)
	return e
}
