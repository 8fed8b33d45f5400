package e2e

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	apiv1 "github.com/mqlet/mqlet/api/v1"
)

// The operator verbs over a real mosquitto and containerd.

const verbsTimeout = 60 * time.Second

// verbsConfig: no log rotation (a big log stays in one file), a fast
// publish rate for the big-log test, exec as asked.
func newVerbsEnv(t *testing.T, execEnabled bool) *podEnv {
	t.Helper()
	return startPodEnv(t, func(logDir string) string { return verbsConfig(logDir, execEnabled) })
}

func verbsConfig(logDir string, execEnabled bool) string {
	return fmt.Sprintf(`runtime:
  plegPeriod: 500ms
  podLogDir: %s
  containerLogMaxBytes: 0
pods:
  backoffBase: 1s
  backoffMax: 4s
telemetry:
  metricsInterval: 0s
mqtt:
  outboxMaxBytes: 67108864
logs:
  maxBytesPerSecond: 67108864
exec:
  enabled: %v
`, logDir, execEnabled)
}

// command sends verb with args and returns every reply up to the final one.
func (e *podEnv) command(verb string, args any, timeout time.Duration) []apiv1.Reply {
	e.t.Helper()
	payload, err := json.Marshal(args)
	if err != nil {
		e.t.Fatal(err)
	}
	id := e.nextID(verb)
	e.mq.Command(e.node, verb, id, payload)
	e.waitFinalAny(id, timeout)
	return e.replies(id)
}

// replies are the replies recorded for id, in order, results kept raw.
func (e *podEnv) replies(id string) []apiv1.Reply {
	var out []apiv1.Reply
	for _, m := range e.mq.Messages() {
		if m.Topic == prefix+"/"+e.node+"/reply/"+id {
			if r, err := apiv1.DecodeReply(m.Payload); err == nil {
				out = append(out, r)
			}
		}
	}
	return out
}

func final(t testing.TB, rs []apiv1.Reply, phase string) apiv1.Reply {
	t.Helper()
	f := rs[len(rs)-1]
	if f.Phase != phase {
		t.Fatalf("%s ended %s (%s), want %s; errors %v", f.Verb, f.Phase, f.Message, phase, f.Errors)
	}
	return f
}

// logLines joins the lines of a logs request's replies: its chunks in seq
// order (checked), then the final reply's own lines.
func logLines(t testing.TB, rs []apiv1.Reply) ([]string, apiv1.LogsResult) {
	t.Helper()
	var lines []string
	seq := 0
	for _, r := range rs[:len(rs)-1] {
		if r.Phase != apiv1.InProgress {
			continue
		}
		seq++
		if r.Seq != seq {
			t.Fatalf("chunk %d arrived as number %d", r.Seq, seq)
		}
		var c apiv1.LogsChunk
		if err := json.Unmarshal(r.RawResult(), &c); err != nil {
			t.Fatalf("chunk %d: %v", r.Seq, err)
		}
		lines = append(lines, c.Lines...)
	}
	var res apiv1.LogsResult
	if err := json.Unmarshal(final(t, rs, apiv1.Succeeded).RawResult(), &res); err != nil {
		t.Fatal(err)
	}
	if res.Chunks != seq {
		t.Fatalf("final reply counts %d chunks, %d arrived", res.Chunks, seq)
	}
	return append(lines, res.Lines...), res
}

func TestLogsTailPreviousUnknownAndChunks(t *testing.T) {
	e := newVerbsEnv(t, false)
	e.cleanupPods("printer", "crasher", "big")
	e.apply(e.pod("printer", "Always", "for i in 1 2 3 4 5 6 7 8 9 10; do echo line $i; done; sleep 3600"), apiv1.Succeeded, podReadyTimeout)
	e.apply(e.pod("crasher", "Always", "echo attempt started at $(date +%s%N); sleep 1; exit 1"), apiv1.Succeeded, podReadyTimeout)
	// 20 MB of numbered lines.
	e.apply(e.pod("big", "Always", "seq 1 2500000; sleep 3600"), apiv1.Succeeded, podReadyTimeout)

	tail := int64(3)
	var got []string
	Eventually(t, verbsTimeout, "the printer's 10 lines in its log", func() bool {
		got, _ = logLines(t, e.command("logs", apiv1.LogsRequest{Namespace: e.ns, Name: "printer", TailLines: &tail}, verbsTimeout))
		return len(got) == 3 && got[2] == "line 10"
	})
	if strings.Join(got, ",") != "line 8,line 9,line 10" {
		t.Fatalf("tailLines 3: %q", got)
	}

	// An unknown pod or container is failed, naming it.
	f := final(t, e.command("logs", apiv1.LogsRequest{Namespace: e.ns, Name: "nosuch"}, verbsTimeout), apiv1.Failed)
	if !strings.Contains(f.Message, "nosuch") {
		t.Fatalf("unknown pod: %q", f.Message)
	}
	f = final(t, e.command("logs", apiv1.LogsRequest{Namespace: e.ns, Name: "printer", Container: "sidecar"}, verbsTimeout), apiv1.Failed)
	if !strings.Contains(f.Message, `"sidecar"`) {
		t.Fatalf("unknown container: %q", f.Message)
	}

	// previous is the crashed attempt's output, not the current one's.
	e.waitStatus("crasher", podReadyTimeout, "restarted once", func(p *v1.Pod) bool {
		cs, ok := containerStatus(p, "main", false)
		return ok && cs.RestartCount >= 1
	})
	cur, _ := logLines(t, e.command("logs", apiv1.LogsRequest{Namespace: e.ns, Name: "crasher"}, verbsTimeout))
	prev, _ := logLines(t, e.command("logs", apiv1.LogsRequest{Namespace: e.ns, Name: "crasher", Previous: true}, verbsTimeout))
	if len(prev) != 1 || !strings.HasPrefix(prev[0], "attempt started at ") {
		t.Fatalf("previous: %q", prev)
	}
	if len(cur) == 1 && cur[0] == prev[0] {
		t.Fatalf("previous and current log are the same attempt: %q", cur)
	}

	// The big log arrives in chunks, complete and in order.
	Eventually(t, 3*verbsTimeout, "the big pod's last line in its log", func() bool {
		last := int64(1)
		l, _ := logLines(t, e.command("logs", apiv1.LogsRequest{Namespace: e.ns, Name: "big", TailLines: &last}, verbsTimeout))
		return len(l) == 1 && l[0] == "2500000"
	})
	start := time.Now()
	rs := e.command("logs", apiv1.LogsRequest{Namespace: e.ns, Name: "big"}, 3*verbsTimeout)
	took := time.Since(start)
	lines, res := logLines(t, rs)
	if len(lines) != 2500000 || res.LineCount != 2500000 {
		t.Fatalf("big log: %d lines (result counts %d), want 2500000", len(lines), res.LineCount)
	}
	for i, l := range lines {
		if l != strconv.Itoa(i+1) {
			t.Fatalf("big log line %d is %q", i+1, l)
		}
	}
	if res.Chunks < 2 {
		t.Fatalf("a %d-byte log came in %d chunks", res.Bytes, res.Chunks)
	}
	t.Logf("big log: %d bytes, %d chunks in %v (%.1f MB/s end to end through mosquitto)", res.Bytes, res.Chunks, took, float64(res.Bytes)/1e6/took.Seconds())
}

func TestLogsFollowSeesNewLinesAndStops(t *testing.T) {
	e := newVerbsEnv(t, false)
	e.cleanupPods("ticker")
	e.apply(e.pod("ticker", "Always", "i=0; while true; do i=$((i+1)); echo tick $i $(date +%s); sleep 0.2; done"), apiv1.Succeeded, podReadyTimeout)
	id := e.nextID("logs")
	tail := int64(0)
	payload, _ := json.Marshal(apiv1.LogsRequest{Namespace: e.ns, Name: "ticker", Follow: true, FollowSeconds: 6, TailLines: &tail})
	sent := time.Now()
	e.mq.Command(e.node, "logs", id, payload)
	// A line printed after the follow started arrives within a generous bound.
	first := e.mq.WaitFor(0, 30*time.Second, "a followed chunk", func(m Msg) bool {
		var r apiv1.Reply
		return m.Topic == prefix+"/"+e.node+"/reply/"+id && json.Unmarshal(m.Payload, &r) == nil && r.Phase == apiv1.InProgress
	})
	r, _ := apiv1.DecodeReply(first.Payload)
	var c apiv1.LogsChunk
	_ = json.Unmarshal(r.RawResult(), &c)
	if len(c.Lines) == 0 {
		t.Fatal("empty followed chunk")
	}
	fields := strings.Fields(c.Lines[0])
	printed, _ := strconv.ParseInt(fields[len(fields)-1], 10, 64)
	if printed < sent.Unix()-1 { // date prints whole seconds
		t.Fatalf("tailLines 0 follow sent an old line: %q (request at %v)", c.Lines[0], sent)
	}
	t.Logf("first followed line %v after the request", time.Since(sent))
	e.waitFinal(id, apiv1.Succeeded, 60*time.Second)
	f := final(t, e.replies(id), apiv1.Succeeded)
	var res apiv1.LogsResult
	_ = json.Unmarshal(f.RawResult(), &res)
	if res.Ended != "followSeconds" || res.LineCount < 5 {
		t.Fatalf("follow ended %q with %d lines: %s", res.Ended, res.LineCount, f.Message)
	}

	// A follow is cancelled by a cancel command naming its request id.
	id2 := e.nextID("logs")
	payload, _ = json.Marshal(apiv1.LogsRequest{Namespace: e.ns, Name: "ticker", Follow: true, FollowSeconds: 300})
	e.mq.Command(e.node, "logs", id2, payload)
	e.mq.WaitReply(e.node, id2, apiv1.InProgress, 30*time.Second)
	cancel := e.command("cancel", apiv1.CancelRequest{RequestID: id2}, verbsTimeout)
	final(t, cancel, apiv1.Succeeded)
	e.waitFinal(id2, apiv1.Succeeded, 30*time.Second)
	f = final(t, e.replies(id2), apiv1.Succeeded)
	_ = json.Unmarshal(f.RawResult(), &res)
	if res.Ended != "cancelled" {
		t.Fatalf("cancelled follow ended %q", res.Ended)
	}
}

func TestExecRefusedByDefault(t *testing.T) {
	e := newVerbsEnv(t, false)
	e.cleanupPods("sleeper")
	e.apply(e.pod("sleeper", "Always", "sleep 3600"), apiv1.Succeeded, podReadyTimeout)
	f := final(t, e.command("exec", apiv1.ExecRequest{Namespace: e.ns, Name: "sleeper", Command: []string{"true"}}, verbsTimeout), apiv1.Failed)
	if !strings.Contains(f.Message, "exec is disabled") {
		t.Fatalf("exec by default: %q", f.Message)
	}
}

func TestExecOutputExitCodeTimeoutAndEvent(t *testing.T) {
	e := newVerbsEnv(t, true)
	e.cleanupPods("sleeper")
	e.apply(e.pod("sleeper", "Always", "sleep 3600"), apiv1.Succeeded, podReadyTimeout)
	from := e.mq.Mark()
	f := final(t, e.command("exec", apiv1.ExecRequest{Namespace: e.ns, Name: "sleeper", Command: []string{"sh", "-c", "echo h''i; printf 'o%sps\\n' o >&2; exit 3"}}, verbsTimeout), apiv1.Succeeded)
	var res apiv1.ExecResult
	if err := json.Unmarshal(f.RawResult(), &res); err != nil {
		t.Fatal(err)
	}
	if res.Stdout != "hi\n" || res.Stderr != "oops\n" || res.ExitCode != 3 {
		t.Fatalf("exec: %+v", res)
	}
	// The Exec event names the request and the command, never the output.
	found := false
	for _, ev := range e.events(from) {
		if ev.Reason == "Exec" {
			found = true
			if !strings.Contains(ev.Message, "exit 3") || strings.Contains(ev.Message, "oops") || !strings.Contains(ev.Message, "request exec-") {
				t.Fatalf("Exec event: %q", ev.Message)
			}
		}
	}
	if !found {
		t.Fatal("no Exec event")
	}
	start := time.Now()
	f = final(t, e.command("exec", apiv1.ExecRequest{Namespace: e.ns, Name: "sleeper", Command: []string{"sleep", "30"}, TimeoutSeconds: 2}, verbsTimeout), apiv1.Failed)
	if !strings.Contains(f.Message, "timeoutSeconds") || time.Since(start) > 25*time.Second {
		t.Fatalf("exec past its timeout: %q after %v", f.Message, time.Since(start))
	}
	// Round trip of `true`.
	var ds []time.Duration
	for range 30 {
		s := time.Now()
		final(t, e.command("exec", apiv1.ExecRequest{Namespace: e.ns, Name: "sleeper", Command: []string{"true"}}, verbsTimeout), apiv1.Succeeded)
		ds = append(ds, time.Since(s))
	}
	t.Logf("exec true round trip: p50 %v p99 %v over %d", percentile(ds, 50), percentile(ds, 99), len(ds))
}

func TestRestartPodAndContainer(t *testing.T) {
	e := newVerbsEnv(t, false)
	e.cleanupPods("two", "never")
	e.apply([]byte(fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: two, namespace: %s}
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - {name: a, image: docker.io/mqlet/busybox:test, imagePullPolicy: Never, command: [sleep, "3600"]}
  - {name: b, image: docker.io/mqlet/busybox:test, imagePullPolicy: Never, command: [sleep, "3600"]}
`, e.ns)), apiv1.Succeeded, podReadyTimeout)
	before := e.runningIDs("two")
	sandboxes := e.sandboxIDs("two")
	from := e.mq.Mark()

	// One container: only that one changes.
	f := final(t, e.command("restart", apiv1.RestartRequest{Namespace: e.ns, Name: "two", Container: "b"}, verbsTimeout), apiv1.Succeeded)
	var res apiv1.RestartResult
	_ = json.Unmarshal(f.RawResult(), &res)
	after := e.runningIDs("two")
	if after["a"] != before["a"] || after["b"] == before["b"] || len(res.Containers) != 1 || res.Containers[0].ContainerID != after["b"] || res.Containers[0].RestartCount != 1 {
		t.Fatalf("restart of b: before %v after %v result %+v", before, after, res)
	}
	killing := 0
	for _, ev := range e.events(from) {
		if ev.Reason == "Killing" && strings.Contains(ev.Message, "restart requested (request restart-") {
			killing++
		}
	}
	if killing != 1 {
		t.Fatalf("%d Killing events naming the request, want 1", killing)
	}

	// The pod: every container anew, in a new sandbox.
	f = final(t, e.command("restart", apiv1.RestartRequest{Namespace: e.ns, Name: "two"}, verbsTimeout), apiv1.Succeeded)
	_ = json.Unmarshal(f.RawResult(), &res)
	again := e.runningIDs("two")
	if again["a"] == after["a"] || again["b"] == after["b"] || len(res.Containers) != 2 {
		t.Fatalf("pod restart: before %v after %v result %+v", after, again, res)
	}
	if len(e.sandboxIDs("two")) <= len(sandboxes) {
		t.Fatalf("pod restart made no new sandbox: %v then %v", sandboxes, e.sandboxIDs("two"))
	}
	e.waitStatus("two", podReadyTimeout, "restart counts 2 and 1", func(p *v1.Pod) bool {
		a, _ := containerStatus(p, "a", false)
		b, _ := containerStatus(p, "b", false)
		return a.RestartCount == 1 && b.RestartCount == 2 && a.State.Running != nil && b.State.Running != nil
	})

	// A finished restartPolicy Never pod runs again when asked.
	e.apply(e.pod("never", "Never", "echo done"), apiv1.Succeeded, podReadyTimeout)
	e.waitStatus("never", podReadyTimeout, "Succeeded", func(p *v1.Pod) bool { return p.Status.Phase == v1.PodSucceeded })
	final(t, e.command("restart", apiv1.RestartRequest{Namespace: e.ns, Name: "never"}, verbsTimeout), apiv1.Succeeded)
	e.waitStatus("never", podReadyTimeout, "run again", func(p *v1.Pod) bool {
		cs, _ := containerStatus(p, "main", false)
		return cs.RestartCount == 1
	})
	f = final(t, e.command("restart", apiv1.RestartRequest{Namespace: e.ns, Name: "two", Container: "nosuch"}, verbsTimeout), apiv1.Failed)
	if !strings.Contains(f.Message, `"nosuch"`) {
		t.Fatalf("unknown container: %q", f.Message)
	}

	// The event history has the pod's events, oldest first, and only its.
	f = final(t, e.command("get", apiv1.GetRequest{Kind: "Event", InvolvedObject: &apiv1.ObjectRef{Kind: "Pod", Namespace: e.ns, Name: "two"}}, verbsTimeout), apiv1.Succeeded)
	var hist apiv1.EventList
	if err := json.Unmarshal(f.RawResult(), &hist); err != nil {
		t.Fatal(err)
	}
	restarts := 0
	for i, ev := range hist.Events {
		if ev.InvolvedObject.Name != "two" {
			t.Fatalf("event of %s in the history of two", ev.InvolvedObject.Name)
		}
		if i > 0 && ev.LastTimestamp.Before(&hist.Events[i-1].LastTimestamp) {
			t.Fatalf("history not oldest first at %d: %v after %v", i, ev.LastTimestamp, hist.Events[i-1].LastTimestamp)
		}
		if ev.Reason == "Killing" && strings.Contains(ev.Message, "restart requested") {
			restarts++
		}
	}
	if len(hist.Events) == 0 || hist.Events[0].Reason != "Scheduled" || restarts == 0 {
		t.Fatalf("history of two: %d events, first %q, %d restart kills", len(hist.Events), hist.Events[0].Reason, restarts)
	}
}

func TestConfigSetMetricsIntervalLiveAndAcrossRestart(t *testing.T) {
	e := startPodEnv(t, func(logDir string) string {
		return strings.Replace(verbsConfig(logDir, false), "metricsInterval: 0s", "metricsInterval: 1h", 1)
	})
	metrics := prefix + "/" + e.node + "/metrics"
	// Metrics every ~2 s, without a restart.
	f := final(t, e.command("config", map[string]string{"metricsInterval": "2s"}, verbsTimeout), apiv1.Succeeded)
	var view apiv1.ConfigView
	if err := json.Unmarshal(f.RawResult(), &view); err != nil {
		t.Fatal(err)
	}
	if v := view.Settings["telemetry.metricsInterval"]; v.Source != apiv1.SourceRemote || string(v.Value) != `"2s"` {
		t.Fatalf("config reply: %+v", v)
	}
	waitMetrics := func(what string) {
		t.Helper()
		from := e.mq.Mark()
		var at []time.Time
		for len(at) < 3 {
			e.mq.WaitFor(from, 30*time.Second, what, func(m Msg) bool { return m.Topic == metrics })
			at = append(at, time.Now())
			from = e.mq.Mark()
		}
		// Two gaps of ~2 s: far below the file's hour, bounded generously.
		if gap := at[2].Sub(at[0]); gap > 20*time.Second {
			t.Fatalf("%s: 3 metrics messages took %v", what, gap)
		}
	}
	waitMetrics("metrics after config set")

	// The setting survives a restart and shows as remote.
	e.agent.Stop()
	mark := e.mq.Mark()
	e.agent.Restart()
	e.mq.WaitState(mark, e.node, "online", 30*time.Second)
	waitMetrics("metrics after a restart")
	id := e.nextID("get")
	e.mq.Command(e.node, "get", id, []byte(`{"kind":"Config"}`))
	e.waitFinal(id, apiv1.Succeeded, verbsTimeout)
	g := final(t, e.replies(id), apiv1.Succeeded)
	if err := json.Unmarshal(g.RawResult(), &view); err != nil {
		t.Fatal(err)
	}
	if v := view.Settings["telemetry.metricsInterval"]; v.Source != apiv1.SourceRemote || string(v.Value) != `"2s"` {
		t.Fatalf("get Config after a restart: %+v", v)
	}
	if v := view.Settings["runtime.podLogDir"]; v.Source != apiv1.SourceFile {
		t.Fatalf("a file setting: %+v", v)
	}

	// Security settings are refused, naming the key.
	f = final(t, e.command("config", map[string]any{"admission.allowPrivileged": true}, verbsTimeout), apiv1.Failed)
	if !strings.Contains(f.Message, "admission.allowPrivileged") {
		t.Fatalf("admission key: %q", f.Message)
	}
}

// mqletctl's operator verbs against a real agent.
func TestCtlLogsExecRestartConfig(t *testing.T) {
	e := startPodEnv(t, func(logDir string) string {
		return strings.Replace(verbsConfig(logDir, true), "metricsInterval: 0s", "metricsInterval: 1h", 1)
	})
	e.cleanupPods("printer")
	e.apply(e.pod("printer", "Always", "for i in 1 2 3 4 5 6 7 8 9 10; do echo line $i; done; sleep 3600"), apiv1.Succeeded, podReadyTimeout)
	base := []string{"--broker", e.broker.URL(), "--node", e.node, "--timeout", "60s"}
	run := func(args ...string) (int, string, string) {
		t.Helper()
		return ctl(t, append(append([]string(nil), base...), args...)...)
	}
	var out string
	Eventually(t, verbsTimeout, "mqletctl logs --tail 3 prints the last 3 lines", func() bool {
		_, out, _ = run("logs", "printer", "-n", e.ns, "--tail", "3")
		return out == "line 8\nline 9\nline 10\n"
	})
	code, out, errOut := run("exec", "printer", "-n", e.ns, "--", "sh", "-c", "echo hi; exit 3") // mqletctl exits with the command's code, as kubectl
	if code != 3 || out != "hi\n" || !strings.Contains(errOut, "exit code 3") {
		t.Fatalf("exec: code %d out %q err %q", code, out, errOut)
	}
	before := e.runningIDs("printer")["main"]
	if code, out, errOut := run("restart", "pod", "printer", "-n", e.ns); code != 0 || !strings.Contains(out, "restarted") {
		t.Fatalf("restart: code %d out %q err %q", code, out, errOut)
	}
	if after := e.runningIDs("printer")["main"]; after == before || after == "" {
		t.Fatalf("restart kept container %s (now %q)", before, after)
	}
	if code, out, errOut := run("config", "set", "metricsInterval=2s"); code != 0 || !strings.Contains(out, "telemetry.metricsInterval") || !strings.Contains(out, "remote") {
		t.Fatalf("config set: code %d out %q err %q", code, out, errOut)
	}
	code, out, _ = run("config", "view")
	if code != 0 || !regexpMatch(`telemetry\.metricsInterval\s+remote\s+"2s"`, out) {
		t.Fatalf("config view: code %d\n%s", code, out)
	}
	if code, _, errOut := run("config", "set", "admission.allowPrivileged=true"); code != 1 || !strings.Contains(errOut, "admission.allowPrivileged") {
		t.Fatalf("config set admission: code %d err %q", code, errOut)
	}
}

func regexpMatch(pattern, s string) bool { return regexp.MustCompile(pattern).MatchString(s) }
