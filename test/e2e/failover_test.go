package e2e

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/mqlet/mqlet/internal/testutil/mosquitto"
)

// mqlet configured with two mosquittos: killing the one it uses moves it
// to the other; a dashboard on the second sees every retained topic of the
// node (state, node, pod statuses, and no status of a pod deleted while
// the node was on the first) within 5 s of the move; the final reply owed
// when the first died arrives on the second; commands sent there are
// answered.
func TestFailoverToTheSecondBroker(t *testing.T) {
	_, endpoint := ConnectCRI(t)
	first, second := mosquitto.Start(t), mosquitto.Start(t)
	const node, ns = "gw-failover", "failover"
	base := prefix + "/" + node
	gone := base + "/pods/" + ns + "/gone"

	// The second broker kept a status of pod "gone" from an earlier time.
	Connect(t, second.URL()).Publish(gone, []byte(`{"kind":"Pod","apiVersion":"v1","metadata":{"name":"gone","namespace":"failover"},"status":{"phase":"Running"}}`), true)

	onFirst, onSecond := Connect(t, first.URL()), Connect(t, second.URL())
	onFirst.Subscribe(base + "/#")
	onSecond.Subscribe(base + "/#")
	a := StartAgent(t, AgentOpts{Node: node, CRI: endpoint,
		Config: fmt.Sprintf("runtime:\n  plegPeriod: 300ms\nmqtt:\n  reconnectMin: 500ms\n  reconnectMax: 2s\n  brokers: [%s, %s]\n", first.URL(), second.URL())})
	birth := onFirst.WaitState(0, node, "online", 15*time.Second)
	t.Cleanup(func() {
		for _, name := range []string{"web", "blink"} {
			onSecond.Command(node, "delete", "cleanup-"+name, []byte(`{"kind":"Pod","namespace":"`+ns+`","name":"`+name+`"}`))
		}
		for _, name := range []string{"web", "blink"} {
			onSecond.WaitReply(node, "cleanup-"+name, "succeeded", 60*time.Second)
		}
	})

	onFirst.Command(node, "apply", "web", podYAML("web", ns, "Always", "sleep 3600"))
	onFirst.WaitReply(node, "web", "succeeded", 60*time.Second)
	onFirst.Command(node, "apply", "gone", podYAML("gone", ns, "Always", "sleep 3600"))
	onFirst.WaitReply(node, "gone", "succeeded", 60*time.Second)
	onFirst.Command(node, "delete", "gone-del", []byte(`{"kind":"Pod","namespace":"`+ns+`","name":"gone","gracePeriodSeconds":0}`))
	onFirst.WaitReply(node, "gone-del", "succeeded", 60*time.Second)

	// A job whose final reply is decided while the node moves.
	onFirst.Command(node, "apply", "blink", podYAML("blink", ns, "Never", "sleep 2; exit 0"))
	onFirst.WaitReply(node, "blink", "accepted", 30*time.Second)
	killed := time.Now()
	first.Kill()

	moved := onSecond.WaitState(0, node, "online", 30*time.Second)
	movedAt := time.Now()
	if moved.BootID != birth.BootID || moved.Seq <= birth.Seq {
		t.Fatalf("on the second broker: boot %s seq %d, want the same boot with a seq above %d", moved.BootID, moved.Seq, birth.Seq)
	}
	t.Logf("moved to the second broker %v after the first was killed", movedAt.Sub(killed).Round(time.Millisecond))
	// Two attempts (the first broker, then the second) with their jitter
	// below reconnectMax: far less than this on any machine.
	if d := movedAt.Sub(killed); d > 20*time.Second {
		t.Fatalf("moved after %v", d)
	}

	// A dashboard subscribing on the second broker now.
	dash := Connect(t, second.URL())
	dash.Subscribe(base + "/#")
	seen := func(topic string, ok func([]byte) bool) bool {
		var last []byte
		found := false
		for _, m := range dash.Messages() {
			if m.Topic == topic {
				last, found = m.Payload, true
			}
		}
		return found && ok(last)
	}
	Eventually(t, time.Until(movedAt.Add(5*time.Second)), "the node's retained state on the second broker within 5 s of the move", func() bool {
		return seen(base+"/state", func(p []byte) bool { return strings.Contains(string(p), `"online"`) }) &&
			seen(base+"/node", func(p []byte) bool {
				var n v1.Node
				return json.Unmarshal(p, &n) == nil && n.Name == node
			}) &&
			seen(base+"/pods/"+ns+"/web", func(p []byte) bool {
				var pod v1.Pod
				return json.Unmarshal(p, &pod) == nil && pod.Status.Phase == v1.PodRunning
			})
	})
	t.Logf("retained state seen on the second broker %v after the move", time.Since(movedAt).Round(time.Millisecond))
	if seen(gone, func(p []byte) bool { return len(p) > 0 }) {
		t.Fatal("the second broker still holds the status of a pod deleted while the node was on the first")
	}

	// Nothing owed was lost with the first broker.
	onSecond.WaitReply(node, "blink", "succeeded", 60*time.Second)
	// Commands sent to the second broker are answered.
	onSecond.Command(node, "get", "on-second", []byte(`{"kind":"Pod","namespace":"`+ns+`"}`))
	onSecond.WaitReply(node, "on-second", "succeeded", 30*time.Second)
	if !strings.Contains(a.Logs(), second.Addr()) {
		t.Fatalf("the agent's log does not name the second broker:\n%s", tail(a.Logs(), 20))
	}
}
