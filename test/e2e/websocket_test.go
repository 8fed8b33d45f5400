package e2e

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"testing"
	"time"
)

// mqlet reaches a broker over MQTT-over-WebSockets (ws://), as gateways
// behind HTTP-only firewalls do: it comes online and answers commands.
func TestWebSocketBroker(t *testing.T) {
	freePort := func() int {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		return l.Addr().(*net.TCPAddr).Port
	}
	tcpPort, wsPort := freePort(), freePort()
	self, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	conf := fmt.Sprintf("per_listener_settings false\nallow_anonymous true\nuser %s\nlistener %d 127.0.0.1\nlistener %d 127.0.0.1\nprotocol websockets\n", self.Username, tcpPort, wsPort)
	file := filepath.Join(t.TempDir(), "mosquitto.conf")
	if err := os.WriteFile(file, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("/usr/sbin/mosquitto", "-c", file)
	var logs syncBuffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting mosquitto: %v", err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("mosquitto log:\n%s", logs.String())
		}
	})
	Eventually(t, 10*time.Second, "mosquitto listening on both ports", func() bool {
		for _, p := range []int{tcpPort, wsPort} {
			c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", p))
			if err != nil {
				return false
			}
			c.Close()
		}
		return true
	})

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
