package e2e

import (
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/mqlet/mqlet/internal/testutil/mosquitto"
)

// TestCommandExpiresWhileNodeOffline: a command sent with --expires to a
// node that is offline waits at the broker (mqletctl says queued, exit 3);
// the node, back after the expiry, answers it failed "expired" and does
// not run it, while a command queued beside it without an expiry runs.
// Real mosquitto (the node's persistent session keeps both) and a real
// mqlet.
func TestCommandExpiresWhileNodeOffline(t *testing.T) {
	_, endpoint := ConnectCRI(t)
	b := mosquitto.Start(t)
	obs := Connect(t, b.URL())
	node := fmt.Sprintf("expires-%d", time.Now().UnixNano()%1e6)
	obs.Subscribe(prefix+"/+/state", prefix+"/"+node+"/reply/#")
	mark := obs.Mark()
	a := StartAgent(t, AgentOpts{Node: node, Broker: b.URL(), CRI: endpoint, Config: "telemetry:\n  metricsInterval: 0s\n"})
	obs.WaitState(mark, node, "online", 30*time.Second)
	mark = obs.Mark()
	a.Stop()
	obs.WaitState(mark, node, "offline", 30*time.Second)

	queuedID := regexp.MustCompile(`request (ctl-\S+) waits at the broker`)
	apply := func(name string, extra ...string) string {
		t.Helper()
		file := t.TempDir() + "/cm.yaml"
		if err := os.WriteFile(file, configMapYAML(name), 0o600); err != nil {
			t.Fatal(err)
		}
		args := append([]string{"--broker", b.URL(), "--node", node}, extra...)
		args = append(args, "apply", "-f", file)
		code, out, errOut := ctl(t, args...)
		m := queuedID.FindStringSubmatch(errOut)
		if code != 3 || m == nil {
			t.Fatalf("mqletctl %v to an offline node: exit %d, want 3 (queued)\n%s%s", args, code, out, errOut)
		}
		return m[1]
	}
	expiring := apply("late", "--expires", "2s")
	lasting := apply("timely")
	time.Sleep(3 * time.Second) // the node stays offline past the expiry
	a.Restart()
	r := obs.WaitReply(node, expiring, "failed", 60*time.Second)
	if !strings.HasPrefix(r.Message, "expired") {
		t.Fatalf("the expired command was answered %q, want failed: expired...", r.Message)
	}
	obs.WaitReply(node, lasting, "succeeded", 60*time.Second)
	// The expired one did not run: its ConfigMap is not there.
	code, out, errOut := ctl(t, "--broker", b.URL(), "--node", node, "get", "configmaps")
	if code != 0 || !strings.Contains(out, "timely") || strings.Contains(out, "late") {
		t.Fatalf("get configmaps: exit %d, want timely and not late:\n%s%s", code, out, errOut)
	}
}
