package main

import (
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	apiv1 "github.com/mqlet/mqlet/api/v1"
	"github.com/mqlet/mqlet/mqtt/broker"
)

const podManifest = `apiVersion: v1
kind: Pod
metadata:
  name: web
spec:
  containers:
  - name: web
    image: nginx
`

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

var requestIDPattern = regexp.MustCompile(`^[A-Za-z0-9._-]+$`)

func TestApplySucceeded(t *testing.T) {
	url := startBroker(t, broker.Options{})
	agent := startFakeAgent(t, url, func(r received) []fakeReply {
		return []fakeReply{
			{Phase: "accepted", Message: "stored: Pod default/web created"},
			{Phase: "in_progress", Message: "waiting for default/web"},
			{Phase: "succeeded", Message: "default/web running"},
		}
	})
	file := writeFile(t, "pod.yaml", podManifest)
	res := runCLI(t, url, "", "apply", "-f", file)
	if res.code != 0 {
		t.Fatalf("apply: %v", res)
	}
	want := "accepted    stored: Pod default/web created\n" +
		"in_progress waiting for default/web\n" +
		"succeeded   default/web running\n"
	if res.stdout != want {
		t.Errorf("stdout:\n%s\nwant:\n%s", res.stdout, want)
	}
	cmd := agent.only(t)
	if cmd.Verb != "apply" || string(cmd.Payload) != podManifest {
		t.Errorf("agent got verb %q payload %q", cmd.Verb, cmd.Payload)
	}
	if !requestIDPattern.MatchString(cmd.RequestID) || apiv1.ValidateRequestID(cmd.RequestID) != nil {
		t.Errorf("request id %q is not a safe topic level", cmd.RequestID)
	}
}

func TestApplyFailedPrintsMessageAndErrors(t *testing.T) {
	url := startBroker(t, broker.Options{})
	startFakeAgent(t, url, func(r received) []fakeReply {
		return []fakeReply{{Phase: "failed", Message: "2 object(s) rejected, nothing applied",
			Errors: []string{"Pod default/a: spec.containers: Required value", "Pod default/b: privileged is denied"}}}
	})
	res := runCLI(t, url, podManifest, "apply", "-f", "-")
	if res.code != 1 {
		t.Fatalf("apply of a rejected manifest: want exit 1, got %v", res)
	}
	for _, want := range []string{
		"failed      2 object(s) rejected, nothing applied\n",
		"  - Pod default/a: spec.containers: Required value\n",
		"  - Pod default/b: privileged is denied\n",
	} {
		if !strings.Contains(res.stderr, want) {
			t.Errorf("stderr lacks %q:\n%v", want, res)
		}
	}
}

func TestApplyJSONOutputPrintsEachReply(t *testing.T) {
	url := startBroker(t, broker.Options{})
	startFakeAgent(t, url, func(r received) []fakeReply {
		return []fakeReply{{Phase: "accepted", Result: []map[string]string{{"kind": "Pod", "key": "default/web", "action": "created"}}}, {Phase: "succeeded"}}
	})
	res := runCLI(t, url, podManifest, "apply", "-f", "-", "-o", "json")
	if res.code != 0 {
		t.Fatalf("apply -o json: %v", res)
	}
	lines := strings.Split(strings.TrimSpace(res.stdout), "\n")
	if len(lines) != 2 {
		t.Fatalf("want 2 JSON lines, got %v", res)
	}
	first, err := apiv1.DecodeReply([]byte(lines[0]))
	if err != nil {
		t.Fatalf("line 1 is not a reply: %v", err)
	}
	if first.Phase != "accepted" || !strings.Contains(string(first.RawResult()), `"default/web"`) || !strings.HasPrefix(first.RequestID, "ctl-") {
		t.Errorf("first reply = %+v", first)
	}
}

func TestApplyNoWaitStopsAtAccepted(t *testing.T) {
	url := startBroker(t, broker.Options{})
	// The agent never sends a final reply: without --no-wait this would time out.
	startFakeAgent(t, url, func(r received) []fakeReply {
		return []fakeReply{{Phase: "accepted", Message: "stored"}}
	})
	start := time.Now()
	res := runCLI(t, url, podManifest, "apply", "-f", "-", "--no-wait", "--timeout", "20s")
	if res.code != 0 || res.stdout != "accepted    stored\n" {
		t.Fatalf("apply --no-wait: %v", res)
	}
	if time.Since(start) > 10*time.Second {
		t.Errorf("--no-wait took %v; it should return at accepted", time.Since(start))
	}
}

func TestApplyTimesOutWhenNoAgent(t *testing.T) {
	url := startBroker(t, broker.Options{})
	res := runCLI(t, url, podManifest, "apply", "-f", "-", "--timeout", "500ms")
	if res.code != 1 {
		t.Fatalf("apply with no agent: want exit 1, got %v", res)
	}
	if !regexp.MustCompile(`timed out waiting for a reply to request ctl-[0-9a-f]+ .*may be offline`).MatchString(res.stderr) {
		t.Errorf("stderr does not name the request and a likely offline agent:\n%v", res)
	}
}

func TestApplyTimesOutAfterAccepted(t *testing.T) {
	url := startBroker(t, broker.Options{})
	startFakeAgent(t, url, func(r received) []fakeReply {
		return []fakeReply{{Phase: "accepted", Message: "stored"}, {Phase: "in_progress", Message: "pulling"}}
	})
	res := runCLI(t, url, podManifest, "apply", "-f", "-", "--timeout", "1s")
	if res.code != 1 || !strings.Contains(res.stdout, "in_progress pulling") ||
		!strings.Contains(res.stderr, "(last phase: in_progress)") {
		t.Fatalf("apply that never finishes: %v", res)
	}
}

func TestBrokerUnreachable(t *testing.T) {
	// Nothing listens on port 1 of loopback.
	res := runCLIEnv(t, map[string]string{envNode: "n1"}, podManifest, "--broker", "tcp://127.0.0.1:1", "apply", "-f", "-", "--timeout", "5s")
	if res.code != 1 || !strings.Contains(res.stderr, "cannot reach broker tcp://127.0.0.1:1") {
		t.Fatalf("unreachable broker: %v", res)
	}
}

func TestSilentBrokerTimesOut(t *testing.T) {
	// A listener that accepts and never answers CONNECT.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		var held []net.Conn
		defer func() {
			for _, c := range held {
				_ = c.Close()
			}
		}()
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			held = append(held, conn)
		}
	}()
	start := time.Now()
	res := runCLIEnv(t, map[string]string{envNode: "n1"}, "", "--broker", "tcp://"+ln.Addr().String(), "status", "--timeout", "1s")
	if res.code != 1 || !strings.Contains(res.stderr, "cannot reach broker tcp://"+ln.Addr().String()) {
		t.Fatalf("silent broker: %v", res)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("giving up on a silent broker took %v with --timeout 1s", took)
	}
}

func TestSyncSendsTheFile(t *testing.T) {
	url := startBroker(t, broker.Options{})
	agent := startFakeAgent(t, url, func(r received) []fakeReply { return []fakeReply{{Phase: "succeeded", Message: "nothing to do"}} })
	list := `{"apiVersion":"v1","kind":"List","items":[]}`
	res := runCLI(t, url, "", "sync", "-f", writeFile(t, "all.json", list))
	if res.code != 0 {
		t.Fatalf("sync: %v", res)
	}
	if cmd := agent.only(t); cmd.Verb != "sync" || string(cmd.Payload) != list {
		t.Errorf("agent got %q %q", cmd.Verb, cmd.Payload)
	}
}

func TestDeleteShortForm(t *testing.T) {
	url := startBroker(t, broker.Options{})
	agent := startFakeAgent(t, url, func(r received) []fakeReply {
		return []fakeReply{{Phase: "accepted", Message: "deleted from desired state: Pod prod/web"}, {Phase: "succeeded", Message: "gone"}}
	})
	res := runCLI(t, url, "", "delete", "pod", "web", "-n", "prod", "--grace-period", "5")
	if res.code != 0 || !strings.Contains(res.stdout, "succeeded   gone") {
		t.Fatalf("delete: %v", res)
	}
	cmd := agent.only(t)
	var got map[string]any
	if err := json.Unmarshal(cmd.Payload, &got); err != nil {
		t.Fatalf("delete payload %q: %v", cmd.Payload, err)
	}
	if cmd.Verb != "delete" || got["kind"] != "Pod" || got["name"] != "web" || got["namespace"] != "prod" || got["gracePeriodSeconds"] != float64(5) {
		t.Errorf("delete sent %q %v", cmd.Verb, got)
	}
}

func TestDeleteFromFile(t *testing.T) {
	url := startBroker(t, broker.Options{})
	agent := startFakeAgent(t, url, func(r received) []fakeReply {
		return []fakeReply{{Phase: "failed", Message: "not found: Pod default/web"}}
	})
	res := runCLI(t, url, "", "delete", "-f", writeFile(t, "pod.yaml", podManifest))
	if res.code != 1 || !strings.Contains(res.stderr, "not found: Pod default/web") {
		t.Fatalf("delete of a missing pod: %v", res)
	}
	if cmd := agent.only(t); string(cmd.Payload) != podManifest {
		t.Errorf("delete -f sent %q", cmd.Payload)
	}
}

func TestUsageErrors(t *testing.T) {
	cases := []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{"no node", map[string]string{}, []string{"get", "pods"}, "no node given"},
		{"no file", nil, []string{"apply"}, "-f FILE"},
		{"bad output", nil, []string{"get", "pods", "-o", "xml"}, "unknown output format"},
		{"grace with file", nil, []string{"delete", "-f", "x.yaml", "--grace-period", "3"}, "--grace-period works only"},
		{"bad kind", nil, []string{"get", "deployments"}, "unknown kind"},
		{"bad broker", nil, []string{"--broker", "http://x:1", "status"}, "not supported"},
		{"unknown command", nil, []string{"frobnicate"}, "unknown command"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			vars := c.env
			if vars == nil {
				vars = map[string]string{envNode: "n1"}
			}
			res := runCLIEnv(t, vars, "", c.args...)
			if res.code != 2 || !strings.Contains(res.stderr, c.want) {
				t.Errorf("want exit 2 and %q: %v", c.want, res)
			}
		})
	}
}

func TestPasswordFromEnvAndFileNeverPrinted(t *testing.T) {
	const secret = "s3cr3t-Passw0rd"
	pwFile := writeFile(t, "users", "op:"+secret+"\n")
	url := startBroker(t, broker.Options{PasswordFile: pwFile})

	// Right password from the environment: status connects (and finds no state).
	res := runCLIEnv(t, map[string]string{envBroker: url, envNode: "n1", envPassword: secret}, "", "status", "--username", "op", "--retained-wait", "100ms")
	if res.code != 1 || !strings.Contains(res.stdout, "State:") {
		t.Fatalf("status with the right password: %v", res)
	}
	// Right password from a file.
	res = runCLIEnv(t, map[string]string{envBroker: url, envNode: "n1"}, "", "status", "--username", "op", "--password-file", writeFile(t, "pw", secret+"\n"), "--retained-wait", "100ms")
	if res.code != 1 || !strings.Contains(res.stdout, "State:") {
		t.Fatalf("status with the password file: %v", res)
	}
	// Wrong password: a clear error that does not echo any password.
	res = runCLIEnv(t, map[string]string{envBroker: url, envNode: "n1", envPassword: "wrong-" + secret}, "", "status", "--username", "op")
	if res.code != 1 || !strings.Contains(res.stderr, "cannot reach broker") {
		t.Fatalf("status with a wrong password: %v", res)
	}
	if strings.Contains(res.stdout+res.stderr, secret) {
		t.Errorf("output contains the password: %v", res)
	}
}
