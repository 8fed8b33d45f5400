package e2e

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/mqlet/mqlet/internal/testutil/mosquitto"
)

// While the broker is down the pod finishes; after the broker is back the
// agent reconnects by itself, re-subscribes, and delivers what it published
// offline: the latest status (retained, coalesced) and the events in order.
func TestBrokerOutageLosesNothing(t *testing.T) {
	cri, endpoint := ConnectCRI(t)
	b := mosquitto.Start(t)
	const node, ns = "gw-outage", "outage"
	op := Connect(t, b.URL())
	op.Subscribe(prefix + "/" + node + "/#")
	a := StartAgent(t, AgentOpts{Node: node, Broker: b.URL(), CRI: endpoint, Config: "runtime:\n  plegPeriod: 300ms\nmqtt:\n  reconnectMax: 2s\n"})
	op.WaitState(0, node, "online", 10*time.Second)

	op.Command(node, "apply", "blink", podYAML("blink", ns, "Never", "sleep 4; exit 0"))
	op.WaitReply(node, "blink", "succeeded", 60*time.Second)
	t.Cleanup(func() {
		op.Command(node, "delete", "cleanup", []byte(`{"kind":"Pod","namespace":"`+ns+`","name":"blink"}`))
	})

	b.Stop()
	Eventually(t, 30*time.Second, "the container exited while the broker was down", func() bool {
		cs := cri.Containers(ns, "blink")
		return len(cs) == 1 && cs[0].State == runtimeapi.ContainerState_CONTAINER_EXITED
	})
	Eventually(t, 10*time.Second, "mqlet published Succeeded while offline", func() bool {
		return strings.Contains(a.Logs(), `"pod":"`+ns+`/blink","phase":"Succeeded"`)
	})
	outageEnd := time.Now()
	b.Restart()

	// A subscriber joining now gets the latest status at once, retained.
	late := Connect(t, b.URL())
	late.Subscribe(prefix + "/" + node + "/pods/" + ns + "/blink")
	m := late.WaitFor(0, 30*time.Second, "retained status Succeeded", func(m Msg) bool {
		var p v1.Pod
		return json.Unmarshal(m.Payload, &p) == nil && p.Status.Phase == v1.PodSucceeded
	})
	if !m.Retained && m.At.Before(outageEnd) {
		t.Fatal("status not retained")
	}

	// The agent re-subscribed: a command after the outage is answered.
	op.Command(node, "get", "after-outage", []byte(`{"kind":"Pod","namespace":"`+ns+`"}`))
	op.WaitReply(node, "after-outage", "succeeded", 30*time.Second)

	// The long-lived subscriber's last status for the pod is the latest one.
	var last v1.Pod
	for _, m := range op.Messages() {
		if strings.HasSuffix(m.Topic, "/pods/"+ns+"/blink") && len(m.Payload) > 0 {
			_ = json.Unmarshal(m.Payload, &last)
		}
	}
	if last.Status.Phase != v1.PodSucceeded {
		t.Fatalf("last status seen is %q, want Succeeded (a stale value arrived last)", last.Status.Phase)
	}
	// Events arrive in the order they happened.
	var prev time.Time
	for _, m := range op.Messages() {
		if !strings.HasSuffix(m.Topic, "/events") {
			continue
		}
		var ev v1.Event
		if err := json.Unmarshal(m.Payload, &ev); err != nil {
			t.Fatalf("event does not decode: %v", err)
		}
		if ev.LastTimestamp.Time.Before(prev) {
			t.Fatalf("event %s (%s) arrived after a later one", ev.Reason, ev.LastTimestamp)
		}
		prev = ev.LastTimestamp.Time
	}
	if !strings.Contains(a.Logs(), `"reconnect":true`) {
		t.Fatal("no reconnect logged")
	}
}
