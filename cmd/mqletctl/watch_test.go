package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/mqlet/mqlet/mqtt/broker"
)

func TestWatchPodsPrintsRetainedAndDeleted(t *testing.T) {
	url := startBroker(t, broker.Options{})
	c := testClient(t, url, "publisher")
	pods := cannedPods()
	for _, p := range pods[:2] {
		b, _ := json.Marshal(p)
		mustPublish(t, c, scheme.Pod(p.Namespace, p.Name), true, b)
	}
	res := runCLI(t, url, "", "watch", "pods", "--count", "2")
	if res.code != 0 {
		t.Fatalf("watch: %v", res)
	}
	for _, want := range []string{
		"pod     default/web 2/2 Running restarts=0 age=3h\n",
		"pod     edge/crasher 0/1 CrashLoopBackOff restarts=7 (42s ago) age=25m\n",
	} {
		if !strings.Contains(res.stdout, want) {
			t.Errorf("watch output lacks %q:\n%v", want, res)
		}
	}
	if n := strings.Count(res.stdout, "\n"); n != 2 {
		t.Errorf("watch --count 2 printed %d lines", n)
	}
}

// TestWatchEventsUntilCancelled publishes events until the watch has seen
// them, then cancels it like Ctrl-C does.
func TestWatchEventsUntilCancelled(t *testing.T) {
	url := startBroker(t, broker.Options{})
	c := testClient(t, url, "publisher")
	ev := v1.Event{
		ObjectMeta:     metav1.ObjectMeta{Name: "web.1", Namespace: "default"},
		InvolvedObject: v1.ObjectReference{Kind: "Pod", Namespace: "default", Name: "web"},
		Reason:         "BackOff", Message: "Back-off restarting failed container", Type: v1.EventTypeWarning, Count: 3,
		LastTimestamp: metav1.NewTime(testNow),
	}
	payload, _ := json.Marshal(ev)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out, errOut syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"--node", "n1", "--broker", url, "watch", "events"},
			env{getenv: func(string) string { return "" }, stdout: &out, stderr: &errOut, now: func() time.Time { return testNow }})
	}()
	want := "event   2026-03-01T12:00:00Z Warning BackOff Pod/default/web: Back-off restarting failed container (x3)\n"
	deadline := time.After(15 * time.Second)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for !strings.Contains(out.String(), want) {
		select {
		case <-tick.C:
			mustPublish(t, c, scheme.Events(), false, payload) // until the watch has subscribed
		case code := <-done:
			t.Fatalf("watch ended early with %d:\n%s\n%s", code, out.String(), errOut.String())
		case <-deadline:
			t.Fatalf("watch did not print the event:\n%s\n%s", out.String(), errOut.String())
		}
	}
	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Errorf("watch ended by Ctrl-C exited %d: %s", code, errOut.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("watch did not stop when cancelled")
	}
}

func TestWatchAllJSONAndPodDeletion(t *testing.T) {
	url := startBroker(t, broker.Options{})
	publishNode(t, url, "online")
	res := runCLI(t, url, "", "watch", "all", "--count", "2", "-o", "json")
	if res.code != 0 {
		t.Fatalf("watch all: %v", res)
	}
	topics := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(res.stdout), "\n") {
		var m struct {
			Topic    string          `json:"topic"`
			Retained bool            `json:"retained"`
			Payload  json.RawMessage `json:"payload"`
		}
		if err := json.Unmarshal([]byte(line), &m); err != nil || !m.Retained || len(m.Payload) < 2 {
			t.Errorf("line %q: %+v %v", line, m, err)
		}
		topics[m.Topic] = true
	}
	if !topics[scheme.State()] || !topics[scheme.NodeTopic()] {
		t.Errorf("watch all saw %v, want state and node", topics)
	}

	w := watchPrinter{cfg: &globalConfig{Prefix: "mqlet/v1", Node: "n1"}, p: printer{now: func() time.Time { return testNow }}}
	line, err := w.describe(message{Topic: scheme.Pod("default", "web")})
	if err != nil || line != "pod     default/web deleted" {
		t.Errorf("empty pod payload described as %q, %v", line, err)
	}
}
