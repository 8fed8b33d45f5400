package e2e

import (
	"fmt"
	"testing"
	"time"
)

// mqlet reaches a broker over MQTT-over-WebSockets (ws://), as gateways
// behind HTTP-only firewalls do: it comes online and answers commands.
func TestWebSocketBroker(t *testing.T) {
	tcpPort, wsPort := freeLoopbackPort(t), freeLoopbackPort(t)
	runMosquitto(t, fmt.Sprintf("per_listener_settings false\nallow_anonymous true\nlistener %d 127.0.0.1\nlistener %d 127.0.0.1\nprotocol websockets\n", tcpPort, wsPort), tcpPort, wsPort)

	const node = "gw-ws"
	op := Connect(t, fmt.Sprintf("tcp://127.0.0.1:%d", tcpPort))
	op.Subscribe(prefix + "/" + node + "/#")
	a := StartAgent(t, AgentOpts{Node: node, Broker: fmt.Sprintf("ws://127.0.0.1:%d/mqtt", wsPort)})
	op.WaitState(0, node, "online", 15*time.Second)
	op.Command(node, "get", "ws-1", []byte(`{}`))
	op.WaitReply(node, "ws-1", "succeeded", 10*time.Second)
	if !a.Running() {
		t.Fatal("mqlet stopped")
	}
}
