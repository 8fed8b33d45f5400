package e2e

import (
	"fmt"
	apiv1 "github.com/mqlet/mqlet/api/v1"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
)

// What a postStart hook writes is there in the container: a readiness
// probe that reads it passes. A postStart hook that fails kills the
// container (FailedPostStartHook) and it is restarted.
func TestHookPostStartVisibleInContainer(t *testing.T) {
	e := newPodEnv(t, "")
	e.cleanupPods("post", "postfail")
	from := e.mq.Mark()
	e.apply(e.probePod("post", "Always", "exec sleep 3600", `    lifecycle:
      postStart:
        exec:
          command: ["sh", "-c", "echo hello-from-poststart > /tmp/poststart"]
    readinessProbe:
      exec:
        command: ["grep", "-q", "hello-from-poststart", "/tmp/poststart"]
      periodSeconds: 1
`), apiv1.Succeeded, podReadyTimeout)
	p := e.waitStatus("post", 60*time.Second, "Ready", func(p *v1.Pod) bool { return podCondition(p, v1.PodReady) == v1.ConditionTrue })
	if cs, _ := containerStatus(p, "main", false); cs.RestartCount != 0 {
		t.Fatalf("restarted: %s", dump(cs))
	}

	id := e.nextID("apply")
	e.mq.Command(e.node, "apply", id, e.probePod("postfail", "Always", "exec sleep 3600", `    lifecycle:
      postStart:
        exec:
          command: ["sh", "-c", "echo no >&2; exit 3"]
`))
	e.mq.WaitReply(e.node, id, apiv1.Accepted, 30*time.Second)
	e.waitStatus("postfail", 90*time.Second, "restartCount >= 1", func(p *v1.Pod) bool {
		cs, ok := containerStatus(p, "main", false)
		return ok && cs.RestartCount >= 1
	})
	failed := e.eventsOf(from, "postfail", "FailedPostStartHook")
	if len(failed) == 0 || !strings.Contains(failed[0].Message, "exited with 3") || failed[0].Type != v1.EventTypeWarning {
		t.Fatalf("FailedPostStartHook events = %s, want a Warning naming exit 3", dump(failed))
	}
}

// The preStop hook runs before the container gets SIGTERM: the container's
// TERM trap exits 7 when the hook's file is there and 9 when it is not, and
// a liveness kill shows which in the last termination state.
func TestHookPreStopBeforeSIGTERM(t *testing.T) {
	e := newPodEnv(t, "")
	e.cleanupPods("pre")
	id := e.nextID("apply")
	e.mq.Command(e.node, "apply", id, e.probePod("pre", "Always",
		`trap 'if [ -f /tmp/prestop ]; then exit 7; else exit 9; fi' TERM; touch /tmp/alive; (sleep 3; rm -f /tmp/alive) & while true; do sleep 1; done`,
		`    lifecycle:
      preStop:
        exec:
          command: ["touch", "/tmp/prestop"]
    livenessProbe:
      exec:
        command: ["cat", "/tmp/alive"]
      periodSeconds: 1
      failureThreshold: 1
`))
	e.mq.WaitReply(e.node, id, apiv1.Accepted, 30*time.Second)
	p := e.waitStatus("pre", 90*time.Second, "restarted after the liveness kill", func(p *v1.Pod) bool {
		cs, ok := containerStatus(p, "main", false)
		return ok && cs.RestartCount >= 1 && cs.LastTerminationState.Terminated != nil
	})
	cs, _ := containerStatus(p, "main", false)
	if code := cs.LastTerminationState.Terminated.ExitCode; code != 7 {
		t.Fatalf("the killed attempt exited %d, want 7 (9: SIGTERM came before preStop's file)", code)
	}
}

// A deleted pod (its spec gone from the store) still runs its preStop
// hook, recorded on the container: an httpGet to this test's server.
func TestHookPreStopOnDelete(t *testing.T) {
	e := newPodEnv(t, "admission:\n  profile: privileged\n")
	var mu sync.Mutex
	var hits []string
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		mu.Lock()
		hits = append(hits, r.URL.Path+" "+r.Header.Get("X-Hook"))
		mu.Unlock()
	})}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	// No cleanupPods: the test deletes the pod itself (the sweep catches a failure before).
	e.apply(e.probePod("bye", "Always", "exec sleep 3600", fmt.Sprintf(`    lifecycle:
      preStop:
        httpGet:
          host: 127.0.0.1
          port: %d
          path: /prestop
          httpHeaders:
          - name: X-Hook
            value: bye
`, l.Addr().(*net.TCPAddr).Port)), apiv1.Succeeded, podReadyTimeout)
	mu.Lock()
	before := len(hits)
	mu.Unlock()
	if before != 0 {
		t.Fatalf("preStop ran before any stop: %v", hits)
	}
	if r := e.deletePod("bye"); r.Phase != apiv1.Succeeded {
		t.Fatalf("delete reply %s", dump(r))
	}
	mu.Lock()
	defer mu.Unlock()
	if len(hits) != 1 || hits[0] != "/prestop bye" {
		t.Fatalf("preStop requests %q, want one GET /prestop with X-Hook bye", hits)
	}
}
