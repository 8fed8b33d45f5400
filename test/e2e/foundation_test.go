package e2e

import (
	"bytes"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mqlet/mqlet/internal/testutil/mosquitto"

	apiv1 "github.com/mqlet/mqlet/api/v1"
)

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func TestBirthWillAndSeqAcrossKill9(t *testing.T) {
	b := mosquitto.Start(t)
	obs := Connect(t, b.URL())
	obs.Subscribe(prefix + "/gw-birth/state")
	started := time.Now()
	a := StartAgent(t, AgentOpts{Node: "gw-birth", Broker: b.URL(), Args: []string{"--groups", "line-1"}})
	first := obs.WaitState(0, "gw-birth", "online", 10*time.Second)
	t.Logf("start to online: %v", time.Since(started))
	if first.Seq == 0 || first.BootID == "" {
		t.Fatalf("online state without seq/bootId: %+v", first)
	}

	mark := obs.Mark()
	a.Kill9()
	off := obs.WaitState(mark, "gw-birth", "offline", 10*time.Second)
	if off.BootID != first.BootID {
		t.Fatalf("will carries boot id %q, want %q", off.BootID, first.BootID)
	}
	// The will names the node's groups: without them a killed member left
	// its groups for every fleet command (a rollout started without it).
	if len(off.Groups) != 1 || off.Groups[0] != "line-1" {
		t.Fatalf("will carries groups %v, want [line-1]", off.Groups)
	}

	mark = obs.Mark()
	a.Restart()
	second := obs.WaitState(mark, "gw-birth", "online", 10*time.Second)
	if second.Seq <= first.Seq {
		t.Fatalf("seq did not increase across restart: %d then %d", first.Seq, second.Seq)
	}
	if second.BootID == first.BootID {
		t.Fatal("boot id must change with a new process")
	}

	// A late subscriber sees the retained online state.
	late := Connect(t, b.URL())
	late.Subscribe(prefix + "/gw-birth/state")
	late.WaitState(0, "gw-birth", "online", 5*time.Second)

	// SIGTERM: the agent says offline itself and exits 0.
	mark = obs.Mark()
	a.Stop()
	if code := a.ExitCode(time.Second); code != 0 {
		t.Fatalf("exit code after SIGTERM = %d", code)
	}
	obs.WaitState(mark, "gw-birth", "offline", 5*time.Second)
}

func TestCommandIntakeAnswersEveryCommand(t *testing.T) {
	b := mosquitto.Start(t)
	const node = "gw-intake"
	op := Connect(t, b.URL())
	op.Subscribe(prefix+"/"+node+"/reply/#", prefix+"/"+node+"/events", prefix+"/"+node+"/state")
	a := StartAgent(t, AgentOpts{Node: node, Broker: b.URL(), Config: "mqtt:\n  maxPayloadBytes: 8192\n"})
	op.WaitState(0, node, "online", 10*time.Second)

	op.Command(node, "apply", "r1", podYAML("web", "default", "Always", "sleep 3600"))
	acc := op.WaitReply(node, "r1", "accepted", 10*time.Second)
	if !strings.Contains(acc.Message, "Pod default/web created") {
		t.Fatalf("accepted message %q", acc.Message)
	}

	bad := []struct {
		id, verb, want string
		payload        []byte
	}{
		{"bad-yaml", "apply", "decoding manifest", []byte("apiVersion: v1\nkind: Pod\nmetadata: [unclosed\n")},
		{"upper", "apply", "metadata.name", podYAML("Web", "default", "Always", "sleep 1")},
		{"no-image", "apply", "spec.containers[0].image", []byte("apiVersion: v1\nkind: Pod\nmetadata: {name: noimg}\nspec:\n  containers:\n  - name: c\n")},
		{"priv", "apply", "privileged", []byte("apiVersion: v1\nkind: Pod\nmetadata: {name: priv}\nspec:\n  containers:\n  - name: c\n    image: busybox\n    securityContext: {privileged: true}\n")},
		{"other-node", "apply", "spec.nodeName", []byte("apiVersion: v1\nkind: Pod\nmetadata: {name: elsewhere}\nspec:\n  nodeName: gw-other\n  containers:\n  - name: c\n    image: busybox\n")},
		{"unknown-field", "apply", `unknown field "spec.containers[0].imagee"`, []byte("apiVersion: v1\nkind: Pod\nmetadata: {name: typo}\nspec:\n  containers:\n  - name: c\n    imagee: busybox\n")},
		{"huge", "apply", "exceeds the limit of 8192 bytes", bytes.Repeat([]byte("#"), 9000)},
		{"hostpath", "apply", "hostPath", []byte("apiVersion: v1\nkind: Pod\nmetadata: {name: hp}\nspec:\n  volumes:\n  - name: v\n    hostPath: {path: /etc}\n  containers:\n  - name: c\n    image: busybox\n")},
		{"exec-off", "exec", "exec is disabled on this node", []byte(`{"name":"web","command":["ls"]}`)},
		{"nonsense", "explode", "unknown verb", []byte(`{}`)},
		{"del-missing", "delete", "not found", []byte(`{"kind":"Pod","name":"nope"}`)},
	}
	for _, c := range bad {
		op.Command(node, c.verb, c.id, c.payload)
	}
	for _, c := range bad {
		r := op.WaitReply(node, c.id, "failed", 10*time.Second)
		if !strings.Contains(r.Message, c.want) {
			t.Errorf("%s: failed reply %q does not name %q", c.id, r.Message, c.want)
		}
	}
	// Rejections are visible as Warning events too.
	op.WaitFor(0, 5*time.Second, "FailedValidation event", func(m Msg) bool {
		return strings.HasSuffix(m.Topic, "/events") && bytes.Contains(m.Payload, []byte(`"reason":"FailedValidation"`)) && bytes.Contains(m.Payload, []byte(`"type":"Warning"`))
	})
	if !a.Running() {
		t.Fatal("mqlet died on bad input")
	}

	// Redelivery of a handled id is answered again, not executed again.
	mark := op.Mark()
	op.Command(node, "apply", "r1", podYAML("web", "default", "Always", "sleep 3600"))
	op.WaitFor(mark, 10*time.Second, "repeated answer to r1", func(m Msg) bool { return strings.HasSuffix(m.Topic, "/reply/r1") })
	if n := strings.Count(a.Logs(), `"requestId":"r1","verb":"apply","bytes"`); n != 1 {
		t.Fatalf("r1 executed %d times, want once", n)
	}
	if !strings.Contains(a.Logs(), "request already handled") {
		t.Fatal("redelivery not recognised")
	}

	// A command without a request id gets a derived one.
	mark = op.Mark()
	op.Command(node, "get", "", []byte(`{}`))
	op.WaitFor(mark, 10*time.Second, "reply to a derived request id", func(m Msg) bool {
		return strings.Contains(m.Topic, "/reply/auto-") && bytes.Contains(m.Payload, []byte(`"phase":"succeeded"`))
	})
}

func TestDesiredStateSurvivesRestartAndSyncEmpties(t *testing.T) {
	b := mosquitto.Start(t)
	const node = "gw-store"
	op := Connect(t, b.URL())
	op.Subscribe(prefix+"/"+node+"/reply/#", prefix+"/"+node+"/state")
	a := StartAgent(t, AgentOpts{Node: node, Broker: b.URL()})
	op.WaitState(0, node, "online", 10*time.Second)

	list := []byte(`{"apiVersion":"v1","kind":"List","items":[
	  {"apiVersion":"v1","kind":"Pod","metadata":{"name":"a","namespace":"edge"},"spec":{"containers":[{"name":"c","image":"busybox:1"}]}},
	  {"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"cfg","namespace":"edge"},"data":{"k":"v"}},
	  {"apiVersion":"v1","kind":"Secret","metadata":{"name":"creds","namespace":"edge"},"stringData":{"password":"hunter2-do-not-leak"}}]}`)
	op.Command(node, "apply", "put", list)
	op.WaitReply(node, "put", "accepted", 10*time.Second)

	a.Kill9()
	mark := op.Mark()
	a.Restart()
	op.WaitState(mark, node, "online", 10*time.Second)
	op.Command(node, "get", "g1", []byte(`{}`))
	r := op.WaitReply(node, "g1", "succeeded", 10*time.Second)
	raw, _ := json.Marshal(r.Result)
	var res apiv1.GetResult
	if err := json.Unmarshal(raw, &res); err != nil {
		t.Fatal(err)
	}
	if len(res.Pods) != 1 || res.Pods[0].Name != "a" || len(res.ConfigMaps) != 1 || len(res.Secrets) != 1 {
		t.Fatalf("get after restart returned %s", raw)
	}
	for _, m := range op.Messages() {
		if bytes.Contains(m.Payload, []byte("hunter2")) || bytes.Contains(m.Payload, []byte("aHVudGVyMi")) {
			t.Fatalf("secret value published on %s", m.Topic)
		}
	}
	if strings.Contains(a.Logs(), "hunter2") {
		t.Fatal("secret value logged")
	}

	op.Command(node, "sync", "empty", []byte(`{"apiVersion":"v1","kind":"List","items":[]}`))
	// Without a runtime the pod cannot be confirmed gone, so the reply stays
	// in progress; the desired state is emptied at once.
	op.WaitReply(node, "empty", "accepted", 10*time.Second)
	op.Command(node, "get", "g2", []byte(`{}`))
	r = op.WaitReply(node, "g2", "succeeded", 10*time.Second)
	raw, _ = json.Marshal(r.Result)
	res = apiv1.GetResult{}
	_ = json.Unmarshal(raw, &res)
	if len(res.Pods)+len(res.ConfigMaps)+len(res.Secrets) != 0 {
		t.Fatalf("sync with an empty List left %s", raw)
	}
}

func TestStartsOnlineWithoutARuntime(t *testing.T) {
	b := mosquitto.Start(t)
	const node = "gw-nocri"
	op := Connect(t, b.URL())
	op.Subscribe(prefix+"/"+node+"/reply/#", prefix+"/"+node+"/state")
	a := StartAgent(t, AgentOpts{Node: node, Broker: b.URL(), CRI: "unix:///run/mqlet-no-such-runtime.sock"})
	op.WaitState(0, node, "online", 10*time.Second)
	op.Command(node, "apply", "x1", podYAML("waits", "default", "Always", "sleep 1"))
	op.WaitReply(node, "x1", "accepted", 10*time.Second)
	Eventually(t, 10*time.Second, "runtime retry logged", func() bool {
		return strings.Count(a.Logs(), "container runtime unreachable") >= 2
	})
	if !a.Running() {
		t.Fatal("mqlet exited without a runtime")
	}
}

func TestEmbeddedBroker(t *testing.T) {
	const node = "gw-embedded"
	addr := freeAddr(t)
	a := StartAgent(t, AgentOpts{Node: node, Embedded: addr})
	var op *Client
	Eventually(t, 10*time.Second, "embedded broker listening", func() bool {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	op = Connect(t, "tcp://"+addr)
	op.Subscribe(prefix + "/" + node + "/#")
	op.WaitState(0, node, "online", 10*time.Second)
	op.Command(node, "apply", "e1", []byte(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"c"},"data":{"a":"b"}}`))
	op.WaitReply(node, "e1", "succeeded", 10*time.Second)
	if !a.Running() {
		t.Fatal("mqlet stopped")
	}
}

func TestBadConfigAndCorruptStoreFailClearly(t *testing.T) {
	dir := t.TempDir()
	a := StartAgent(t, AgentOpts{Node: "gw-cfg", StateDir: dir, Config: "pods:\n  workers: 0\n"})
	if code := a.ExitCode(10 * time.Second); code != 2 {
		t.Fatalf("bad config exit code %d, want 2", code)
	}
	if !strings.Contains(a.Logs(), "pods.workers") {
		t.Fatalf("message does not name the field:\n%s", a.Logs())
	}

	bad := t.TempDir()
	if err := os.WriteFile(filepath.Join(bad, "state.db"), bytes.Repeat([]byte("garbage!"), 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	c := StartAgent(t, AgentOpts{Node: "gw-corrupt", StateDir: bad, Broker: "tcp://127.0.0.1:1"})
	if code := c.ExitCode(10 * time.Second); code != 1 {
		t.Fatalf("corrupt store exit code %d, want 1", code)
	}
	if !strings.Contains(c.Logs(), filepath.Join(bad, "state.db")) {
		t.Fatalf("error does not name the store file:\n%s", c.Logs())
	}
	data, _ := os.ReadFile(filepath.Join(bad, "state.db"))
	if !bytes.Equal(data, bytes.Repeat([]byte("garbage!"), 4096)) {
		t.Fatal("a corrupt store must be left as it was")
	}
}

func TestVersionFlag(t *testing.T) {
	out, err := execOutput(mqletBin(t), "--version")
	if err != nil || !strings.HasPrefix(out, "mqlet ") {
		t.Fatalf("--version: %q %v", out, err)
	}
}

func execOutput(bin string, args ...string) (string, error) {
	var buf syncBuffer
	cmd := execCommand(bin, args...)
	cmd.Stdout, cmd.Stderr = &buf, &buf
	err := cmd.Run()
	return buf.String(), err
}
