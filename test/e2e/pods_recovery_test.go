package e2e

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/mqlet/mqlet/agent/store"
	apiv1 "github.com/mqlet/mqlet/api/v1"
)

// snapshot is what CRI runs for one pod.
type snapshot struct {
	containers map[string]string // name → id (running)
	restarts   map[string]string // id → restart-count annotation
	sandboxes  []string
}

func (e *podEnv) snapshot(name string) snapshot {
	s := snapshot{containers: map[string]string{}, restarts: map[string]string{}, sandboxes: e.sandboxIDs(name)}
	for _, c := range e.cri.Running(e.ns, name) {
		s.containers[c.GetMetadata().GetName()] = c.Id
		s.restarts[c.Id] = c.Annotations[restartCountKey]
	}
	return s
}

// sameAs fails unless pod name runs exactly what before recorded.
func (e *podEnv) sameAs(name string, before snapshot, when string) {
	e.t.Helper()
	after := e.snapshot(name)
	if dump(after.containers) != dump(before.containers) || dump(after.restarts) != dump(before.restarts) {
		e.t.Fatalf("%s: pod %s runs %v (restarts %v), want the same containers %v (restarts %v)",
			when, name, after.containers, after.restarts, before.containers, before.restarts)
	}
	if len(after.sandboxes) != 1 || after.sandboxes[0] != before.sandboxes[0] {
		e.t.Fatalf("%s: pod %s has sandboxes %v, want only %v", when, name, after.sandboxes, before.sandboxes)
	}
}

// reconciles counts how often mqlet logged its start-up reconcile.
func reconciles(a *Agent) int {
	return strings.Count(a.Logs(), "reconciling desired state with the runtime")
}

// settle watches pod names for window and fails on any container change.
func (e *podEnv) settle(names []string, before map[string]snapshot, window time.Duration, when string) {
	e.t.Helper()
	end := time.Now().Add(window)
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for time.Now().Before(end) {
		for _, n := range names {
			e.sameAs(n, before[n], when)
		}
		<-tick.C
	}
}

// mqlet killed with SIGKILL and started again adopts the running pods:
// same containers, no second sandbox, no restart; also when the broker is
// down while mqlet starts.
func TestPodsSurviveAgentKill9(t *testing.T) {
	e := newPodEnv(t, "")
	names := []string{"alpha", "beta"}
	e.cleanupPods(names...)
	for _, n := range names {
		e.apply(e.pod(n, "Always", "sleep 3600"), apiv1.Succeeded, podReadyTimeout)
	}
	before := map[string]snapshot{}
	for _, n := range names {
		before[n] = e.snapshot(n)
		if len(before[n].containers) != 1 || len(before[n].sandboxes) != 1 {
			t.Fatalf("pod %s before the kill: %+v, want 1 container, 1 sandbox", n, before[n])
		}
	}

	// 1. SIGKILL, restart with the broker up.
	mark := e.mq.Mark()
	runs := reconciles(e.agent)
	e.agent.Kill9()
	e.agent.Restart()
	e.mq.WaitState(mark, e.node, "online", 30*time.Second)
	for _, n := range names {
		e.mq.WaitFor(mark, 30*time.Second, n+" status after restart", func(m Msg) bool {
			var p v1.Pod
			return m.Topic == e.podTopic(n) && json.Unmarshal(m.Payload, &p) == nil && p.Status.Phase == v1.PodRunning
		})
	}
	if reconciles(e.agent) <= runs {
		t.Fatal("restarted mqlet did not reconcile")
	}
	e.settle(names, before, 4*time.Second, "after kill -9 and restart")

	// 2. SIGKILL, broker down, restart: mqlet reconciles offline.
	e.agent.Kill9()
	e.broker.Stop()
	runs = reconciles(e.agent)
	e.agent.Restart()
	Eventually(t, 30*time.Second, "mqlet reconciles without a broker", func() bool { return reconciles(e.agent) > runs })
	// Workers sync every pod right after the reconcile; give them time to
	// (wrongly) touch something, then check nothing changed.
	e.settle(names, before, 5*time.Second, "after restart with the broker down")
	if !e.agent.Running() {
		t.Fatal("mqlet exited while the broker was down")
	}

	// 3. Broker back: mqlet comes online and reports the pods running.
	e.broker.Restart()
	e.mq = Connect(t, e.broker.URL()) // the old client's subscriptions died with the broker
	mark = e.mq.Mark()
	e.mq.Subscribe(prefix + "/" + e.node + "/#")
	e.mq.WaitState(mark, e.node, "online", 60*time.Second)
	for _, n := range names {
		e.waitStatus(n, 30*time.Second, "running after the broker came back", func(p *v1.Pod) bool {
			cs, ok := containerStatus(p, "main", false)
			return p.Status.Phase == v1.PodRunning && ok && strings.HasSuffix(cs.ContainerID, before[n].containers["main"])
		})
	}
	e.sameAs("alpha", before["alpha"], "after the broker came back")
	e.sameAs("beta", before["beta"], "after the broker came back")
}

// A pod removed from the persisted desired state while mqlet was down is
// removed from the runtime when mqlet starts.
func TestPodDeletedFromStoreWhileDownIsRemoved(t *testing.T) {
	e := newPodEnv(t, "")
	e.cleanupPods("keep")
	e.apply(e.pod("keep", "Always", "sleep 3600"), apiv1.Succeeded, podReadyTimeout)
	e.apply(e.pod("drop", "Always", "sleep 3600"), apiv1.Succeeded, podReadyTimeout)
	keep := e.snapshot("keep")

	e.agent.Stop()
	if n := len(e.cri.Running(e.ns, "drop")); n != 1 {
		t.Fatalf("a clean mqlet stop left %d running containers of drop, want pods kept running (1)", n)
	}
	st, err := store.Open(filepath.Join(e.stateDir, "state.db"))
	if err != nil {
		t.Fatalf("opening mqlet's store: %v", err)
	}
	existed, err := st.Delete("Pod", e.ns, "drop")
	if cerr := st.Close(); err == nil {
		err = cerr
	}
	if err != nil || !existed {
		t.Fatalf("deleting drop from the store: existed=%v err=%v", existed, err)
	}

	mark := e.mq.Mark()
	e.agent.Restart()
	e.mq.WaitState(mark, e.node, "online", 30*time.Second)
	restarted := time.Now()
	Eventually(t, podGoneTimeout, "drop removed from containerd", func() bool {
		return len(e.cri.Containers(e.ns, "drop")) == 0 && len(e.cri.Sandboxes(e.ns, "drop")) == 0
	})
	// The pod's own grace period (2 s) was recorded on its containers, so it
	// applies even though the spec is gone (not the runtime's 30 s default).
	took := time.Since(restarted)
	t.Logf("drop removed %v after mqlet started", took)
	if took > 20*time.Second {
		t.Fatalf("removal took %v: the pod's 2 s grace period was not used", took)
	}
	e.mq.WaitFor(mark, 30*time.Second, "drop's retained status cleared", func(m Msg) bool {
		return m.Topic == e.podTopic("drop") && len(m.Payload) == 0
	})
	e.sameAs("keep", keep, "after drop was removed")
}
