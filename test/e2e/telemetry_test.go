package e2e

import (
	"encoding/json"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	apiv1 "github.com/mqlet/mqlet/api/v1"
)

// Every message on every topic of a busy node decodes strictly into the type
// the contract names: no unknown field, no topic outside the contract.
func TestTelemetryStrictDecoding(t *testing.T) {
	e := newTelEnv(t)
	e.cleanupPods("run", "crash")
	e.apply(e.pod("run", "Always", "sleep 3600"), apiv1.Succeeded, podReadyTimeout)
	crashID := e.nextID("apply")
	e.mq.Command(e.node, "apply", crashID, e.pod("crash", "Always", "exit 3"))
	e.mq.WaitReply(e.node, crashID, apiv1.Accepted, 30*time.Second)
	e.apply(e.pod("gone", "Always", "sleep 3600"), apiv1.Succeeded, podReadyTimeout)
	e.deletePod("gone")

	// ~10 s of a running, a crash-looping and a deleted pod with 2 s metrics
	// and node status.
	watchFrom, watchStart := e.mq.Mark(), time.Now()
	e.mq.WaitFor(watchFrom, 30*time.Second, "10 s of telemetry", func(m Msg) bool {
		return m.At.Sub(watchStart) >= 10*time.Second
	})

	counts := map[string]int{}
	emptyPods := 0
	for _, m := range e.mq.Messages() {
		kind, err := decodeTelemetry(e.node, m)
		if err != nil {
			t.Errorf("%s (%d bytes) does not decode strictly: %v\n%s", m.Topic, len(m.Payload), err, m.Payload)
			continue
		}
		counts[kind]++
		if kind == "pods" && len(m.Payload) == 0 {
			emptyPods++
		}
	}
	t.Logf("decoded strictly by kind: %v (empty pod payloads: %d)", counts, emptyPods)
	// Each kind must really have been seen, or the test proves nothing.
	for _, kind := range []string{"state", "node", "pods", "events", "metrics", "reply"} {
		if counts[kind] == 0 {
			t.Errorf("no %s message seen", kind)
		}
	}
	if emptyPods == 0 {
		t.Error("the deleted pod's topic was never cleared")
	}
	// 2 s intervals over >= 10 s: several of each periodic kind.
	since := map[string]int{}
	for _, m := range e.mq.Messages()[watchFrom:] {
		since[topicKind(e.node, m.Topic)]++
	}
	if since["metrics"] < 3 || since["node"] < 3 {
		t.Errorf("in the 10 s window: %d metrics and %d node messages, want >= 3 of each at 2 s intervals", since["metrics"], since["node"])
	}
}

// A subscriber that joins late gets the node and every live pod at once,
// as retained messages, and nothing for a deleted pod.
func TestTelemetryLateSubscriberGetsRetained(t *testing.T) {
	e := newTelEnv(t)
	e.cleanupPods("run", "done")
	e.apply(e.pod("run", "Always", "sleep 3600"), apiv1.Succeeded, podReadyTimeout)
	e.apply(e.pod("done", "Never", "exit 0"), apiv1.Succeeded, podReadyTimeout)
	e.apply(e.pod("gone", "Always", "sleep 3600"), apiv1.Succeeded, podReadyTimeout)
	e.waitStatus("done", 30*time.Second, "Succeeded", func(p *v1.Pod) bool { return p.Status.Phase == v1.PodSucceeded })
	e.deletePod("gone")
	Eventually(t, 30*time.Second, "gone cleared", func() bool { p, seen := e.status("gone"); return seen && p == nil })

	late := Connect(t, e.broker.URL())
	subscribed := time.Now()
	late.Subscribe(prefix + "/" + e.node + "/#")
	want := map[string]bool{
		prefix + "/" + e.node + "/node":  false,
		prefix + "/" + e.node + "/state": false,
		e.podTopic("run"):                false,
		e.podTopic("done"):               false,
	}
	Eventually(t, 2*time.Second, "retained node, state and pods", func() bool {
		for _, m := range late.Messages() {
			if _, ok := want[m.Topic]; ok && m.Retained && len(m.Payload) > 0 {
				want[m.Topic] = true
			}
		}
		for _, seen := range want {
			if !seen {
				return false
			}
		}
		return true
	})
	t.Logf("late subscriber had node, state and both pods %v after subscribing", time.Since(subscribed))
	for _, m := range late.Messages() {
		if m.Topic == e.podTopic("gone") && len(m.Payload) > 0 {
			t.Errorf("late subscriber got a status of deleted pod gone: %s", m.Payload)
		}
		if m.Topic == e.podTopic("run") && m.Retained {
			var p v1.Pod
			if err := decodeStrict(m.Payload, &p); err != nil || p.Status.Phase != v1.PodRunning {
				t.Errorf("retained status of run: phase %q, err %v", p.Status.Phase, err)
			}
		}
		if m.Topic == e.podTopic("done") && m.Retained {
			var p v1.Pod
			if err := decodeStrict(m.Payload, &p); err != nil || p.Status.Phase != v1.PodSucceeded {
				t.Errorf("retained status of done: phase %q, err %v", p.Status.Phase, err)
			}
		}
	}
}

// A crash loop shows in the statuses (growing restartCount, CrashLoopBackOff
// between runs, the last exit as lastState) and as ONE BackOff event whose
// count grows.
func TestTelemetryCrashLoop(t *testing.T) {
	e := newTelEnv(t)
	e.cleanupPods("crash")
	from := e.mq.Mark()
	id := e.nextID("apply")
	e.mq.Command(e.node, "apply", id, e.pod("crash", "Always", "exit 3"))
	e.mq.WaitReply(e.node, id, apiv1.Accepted, 30*time.Second)

	e.waitStatus("crash", 90*time.Second, "restartCount >= 4", func(p *v1.Pod) bool {
		cs, ok := containerStatus(p, "main", false)
		return ok && cs.RestartCount >= 4
	})

	prev, sawBackOff := int32(-1), false
	var counts []int32
	for _, p := range e.podStatuses("crash") {
		cs, ok := containerStatus(&p, "main", false)
		if !ok {
			continue
		}
		if cs.RestartCount < prev {
			t.Errorf("restartCount went down: %d after %d", cs.RestartCount, prev)
		}
		if cs.RestartCount != prev {
			counts = append(counts, cs.RestartCount)
		}
		prev = cs.RestartCount
		if w := cs.State.Waiting; w != nil && w.Reason == "CrashLoopBackOff" {
			sawBackOff = true
			last := cs.LastTerminationState.Terminated
			if last == nil || last.ExitCode != 3 || last.Reason != "Error" {
				t.Errorf("CrashLoopBackOff status with lastState %s, want terminated exit 3 reason Error", dump(cs.LastTerminationState))
			}
		}
	}
	t.Logf("restartCounts published: %v", counts)
	if len(counts) < 3 {
		t.Errorf("restartCount took %d distinct values, want it to grow through several", len(counts))
	}
	if !sawBackOff {
		t.Error("no status showed Waiting/CrashLoopBackOff between runs")
	}

	// BackOff events: deduplicated into one event (same name) with a growing
	// count. Polled, not waited on fatally, so a failure shows what came.
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) && !backOffCounted(e.events(from), 3) {
		e.mq.WaitFor(e.mq.Mark(), time.Until(deadline)+5*time.Second, "any message", func(Msg) bool { return true })
	}
	byName := map[string][]int32{}
	for _, ev := range e.events(from) {
		if ev.Reason != "BackOff" || ev.InvolvedObject.Name != "crash" {
			continue
		}
		byName[ev.Name] = append(byName[ev.Name], ev.Count)
		t.Logf("BackOff %s count %d: %s", ev.Name, ev.Count, ev.Message)
		if ev.Type != v1.EventTypeWarning || ev.FirstTimestamp.IsZero() || ev.LastTimestamp.Before(&ev.FirstTimestamp) {
			t.Errorf("BackOff event %s: type %s, first %v, last %v", ev.Name, ev.Type, ev.FirstTimestamp, ev.LastTimestamp)
		}
	}
	t.Logf("BackOff events by name (counts as published): %v", byName)
	total, grown := 0, false
	for _, cs := range byName {
		total += len(cs)
		for i := 1; i < len(cs); i++ {
			if cs[i] <= cs[i-1] {
				t.Errorf("BackOff event re-published without a growing count: %v", cs)
			}
		}
		if len(cs) >= 3 {
			grown = true
		}
	}
	if !grown || len(byName)*2 > total {
		t.Errorf("BackOff events: %d names for %d publications, want one event re-published with a growing count", len(byName), total)
	}
}

// Never: exit 0 ends Succeeded/Completed, exit 2 ends Failed/Error.
func TestTelemetryCompletedAndFailed(t *testing.T) {
	e := newTelEnv(t)
	e.cleanupPods("ok", "bad")
	e.apply(e.pod("ok", "Never", "exit 0"), apiv1.Succeeded, podReadyTimeout)
	badID := e.nextID("apply")
	e.mq.Command(e.node, "apply", badID, e.pod("bad", "Never", "exit 2"))
	e.mq.WaitReply(e.node, badID, apiv1.Accepted, 30*time.Second)

	ok := e.waitStatus("ok", 30*time.Second, "phase Succeeded", func(p *v1.Pod) bool { return p.Status.Phase == v1.PodSucceeded })
	cs, _ := containerStatus(ok, "main", false)
	if term := cs.State.Terminated; term == nil || term.ExitCode != 0 || term.Reason != "Completed" || term.FinishedAt.IsZero() {
		t.Errorf("ok/main state %s, want terminated exit 0 reason Completed with finishedAt", dump(cs.State))
	}
	bad := e.waitStatus("bad", 30*time.Second, "phase Failed", func(p *v1.Pod) bool { return p.Status.Phase == v1.PodFailed })
	cs, _ = containerStatus(bad, "main", false)
	if term := cs.State.Terminated; term == nil || term.ExitCode != 2 || term.Reason != "Error" {
		t.Errorf("bad/main state %s, want terminated exit 2 reason Error", dump(cs.State))
	}
	// Neither phase may be left once reached.
	for _, name := range []string{"ok", "bad"} {
		final := false
		for _, p := range e.podStatuses(name) {
			if p.Status.Phase == v1.PodSucceeded || p.Status.Phase == v1.PodFailed {
				final = true
			} else if final {
				b, _ := json.Marshal(p.Status)
				t.Errorf("%s left its final phase: %s", name, b)
			}
		}
	}
}

// backOffCounted reports whether a BackOff event of pod crash reached count n.
func backOffCounted(evs []v1.Event, n int32) bool {
	for _, ev := range evs {
		if ev.Reason == "BackOff" && ev.InvolvedObject.Name == "crash" && ev.Count >= n {
			return true
		}
	}
	return false
}
