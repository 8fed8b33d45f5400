package e2e

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	apiv1 "github.com/mqlet/mqlet/api/v1"
)

// The live settings of the config verb take effect without a restart.

// liveEnv is a verbs env whose config file is changed by edit.
func liveEnv(t *testing.T, edit func(string) string, args ...string) *podEnv {
	t.Helper()
	return startPodEnv(t, func(logDir string) string { return edit(verbsConfig(logDir, false)) }, args...)
}

// setConfig sends a config patch and returns the view, failing unless it succeeded.
func (e *podEnv) setConfig(patch any) apiv1.ConfigView {
	e.t.Helper()
	f := final(e.t, e.command("config", patch, verbsTimeout), apiv1.Succeeded)
	var view apiv1.ConfigView
	if err := json.Unmarshal(f.RawResult(), &view); err != nil {
		e.t.Fatal(err)
	}
	return view
}

// arrivals waits for n messages on topic after from and returns when each came.
func (e *podEnv) arrivals(topic string, n int, timeout time.Duration) []time.Time {
	e.t.Helper()
	from := e.mq.Mark()
	var at []time.Time
	for len(at) < n {
		e.mq.WaitFor(from, timeout, topic, func(m Msg) bool { return m.Topic == topic })
		at = append(at, time.Now())
		from = e.mq.Mark()
	}
	return at
}

// nodeStatusInterval 2s: heartbeats every ~2 s (the file says 1h, and the
// change checks run every 10 s); get {"kind":"Node"} answers the node
// published; null resets the setting.
func TestConfigLiveNodeStatusIntervalAndGetNode(t *testing.T) {
	e := liveEnv(t, func(c string) string {
		return strings.Replace(c, "metricsInterval: 0s", "metricsInterval: 0s\n  nodeStatusInterval: 1h", 1)
	})
	topic := prefix + "/" + e.node + "/node"
	view := e.setConfig(map[string]string{"nodeStatusInterval": "2s"})
	if v := view.Settings["telemetry.nodeStatusInterval"]; v.Source != apiv1.SourceRemote || string(v.Value) != `"2s"` {
		t.Fatalf("config reply: %+v", v)
	}
	at := e.arrivals(topic, 3, 30*time.Second)
	if gap := at[2].Sub(at[0]); gap > 8*time.Second {
		t.Fatalf("3 node statuses took %v at a 2s interval", gap)
	}

	f := final(t, e.command("get", map[string]string{"kind": "Node"}, verbsTimeout), apiv1.Succeeded)
	var nodes apiv1.NodeList
	if err := json.Unmarshal(f.RawResult(), &nodes); err != nil {
		t.Fatal(err)
	}
	if len(nodes.Nodes) != 1 || nodes.Nodes[0].Name != e.node || nodes.Nodes[0].Kind != "Node" {
		t.Fatalf("get Node: %s", dump(nodes))
	}
	var published v1.Node
	for _, m := range e.mq.Messages() {
		if m.Topic == topic {
			_ = json.Unmarshal(m.Payload, &published)
		}
	}
	if got, want := nodes.Nodes[0].Status.NodeInfo.KubeletVersion, published.Status.NodeInfo.KubeletVersion; got == "" || got != want {
		t.Fatalf("get Node says version %q, the node topic %q", got, want)
	}
	if f := final(t, e.command("get", map[string]string{"kind": "Node", "name": "other"}, verbsTimeout), apiv1.Failed); !strings.Contains(f.Message, "not found") {
		t.Fatalf("another node's name: %q", f.Message)
	}

	view = e.setConfig(map[string]any{"nodeStatusInterval": nil})
	if v := view.Settings["telemetry.nodeStatusInterval"]; v.Source == apiv1.SourceRemote || string(v.Value) != `"1h0m0s"` {
		t.Fatalf("after null: %+v", v)
	}
}

// logLevel debug makes mqlet write debug lines (here those of its shutdown);
// the level survives a restart; null goes back to the flag's info.
func TestConfigLiveLogLevel(t *testing.T) {
	e := liveEnv(t, func(c string) string { return c }, "--log-level", "info")
	debugLines := func(from int) int { return strings.Count(e.agent.Logs()[from:], `"level":"debug"`) }
	if n := debugLines(0); n != 0 {
		t.Fatalf("%d debug lines at level info", n)
	}
	view := e.setConfig(map[string]string{"logLevel": "debug"})
	if v := view.Settings["logLevel"]; v.Source != apiv1.SourceRemote || string(v.Value) != `"debug"` {
		t.Fatalf("config reply: %+v", v)
	}
	mark := len(e.agent.Logs())
	e.agent.Stop()
	if logs := e.agent.Logs()[mark:]; debugLines(mark) == 0 || !strings.Contains(logs, `"part":"intake"`) {
		t.Fatalf("no debug lines after logLevel debug:\n%s", tail(logs, 20))
	}

	online := e.mq.Mark()
	mark = len(e.agent.Logs())
	e.agent.Restart()
	e.mq.WaitState(online, e.node, "online", 30*time.Second)
	// The CRI calls of the start are logged at debug.
	Eventually(t, 30*time.Second, "debug lines after a restart (logLevel debug kept)", func() bool { return debugLines(mark) > 0 })
	view = e.setConfig(map[string]any{"logLevel": nil})
	if v := view.Settings["logLevel"]; v.Source != apiv1.SourceFlag || string(v.Value) != `"info"` {
		t.Fatalf("after null: %+v", v)
	}
	mark = len(e.agent.Logs())
	e.agent.Stop()
	if n := debugLines(mark); n != 0 {
		t.Fatalf("%d debug lines after logLevel was reset to info", n)
	}
}

// podStatusResync 5s: the retained status of a pod is published again
// every ~5 s (the file says 1h).
func TestConfigLivePodStatusResync(t *testing.T) {
	e := liveEnv(t, func(c string) string {
		return strings.Replace(c, "metricsInterval: 0s", "metricsInterval: 0s\n  podStatusResync: 1h", 1)
	})
	e.cleanupPods("still")
	e.apply(e.pod("still", "Always", "sleep 3600"), apiv1.Succeeded, podReadyTimeout)
	e.setConfig(map[string]string{"podStatusResync": "5s"})
	at := e.arrivals(e.podTopic("still"), 3, 30*time.Second)
	if gap := at[2].Sub(at[0]); gap > 16*time.Second {
		t.Fatalf("3 statuses of an unchanged pod took %v at a 5s resync", gap)
	}
}

// plegPeriod 200ms: a container's exit shows in the pod status within a
// few seconds, where the file's 1m relist (containerd 1.6 has no event
// stream) would take up to a minute.
func TestConfigLivePLEGPeriod(t *testing.T) {
	e := liveEnv(t, func(c string) string {
		// Without exit events only the relist sees the exit.
		c = strings.Replace(c, "plegPeriod: 500ms", "plegPeriod: 1m\n  exitEvents: false", 1)
		return strings.Replace(c, "pods:\n", "pods:\n  resync: 0s\n", 1)
	})
	e.cleanupPods("brief")
	view := e.setConfig(map[string]string{"plegPeriod": "200ms"})
	if v := view.Settings["runtime.plegPeriod"]; v.Source != apiv1.SourceRemote {
		t.Fatalf("config reply: %+v", v)
	}
	e.apply(e.pod("brief", "Never", "sleep 4"), apiv1.Succeeded, podReadyTimeout)
	running := time.Now()
	e.waitStatus("brief", 30*time.Second, "Succeeded", func(p *v1.Pod) bool { return p.Status.Phase == v1.PodSucceeded })
	if took := time.Since(running); took > 12*time.Second {
		t.Fatalf("exit → status took %v at plegPeriod 200ms", took)
	}
	if f := final(t, e.command("config", map[string]string{"plegPeriod": "10ms"}, verbsTimeout), apiv1.Failed); !strings.Contains(f.Message, "from 100ms to 1m0s") {
		t.Fatalf("out of bounds: %q", f.Message)
	}
}
