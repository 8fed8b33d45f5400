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

	"github.com/mqlet/mqlet/agent/manifest"
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

// A refusal the agent's message already states (one object) is printed
// once, not again as an error line.
func TestApplyRefusalPrintedOnce(t *testing.T) {
	url := startBroker(t, broker.Options{})
	refusal := `Pod default/p: violates PodSecurity "baseline:latest": privileged (container "c" must not set securityContext.privileged=true); 1 error: spec.containers[0].securityContext.privileged: Forbidden: privileged`
	startFakeAgent(t, url, func(r received) []fakeReply {
		return []fakeReply{{Phase: "failed", Message: "1 object(s) rejected, nothing applied: " + refusal, Errors: []string{refusal}}}
	})
	res := runCLI(t, url, podManifest, "apply", "-f", "-")
	if res.code != 1 || strings.Count(res.stderr, `must not set securityContext.privileged=true`) != 1 {
		t.Fatalf("want the refusal printed once and exit 1: %v", res)
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

func TestApplyToUnknownNodeFailsAfterRetainedWait(t *testing.T) {
	url := startBroker(t, broker.Options{})
	start := time.Now()
	res := runCLI(t, url, podManifest, "apply", "-f", "-", "--timeout", "30s", "--retained-wait", "300ms")
	if res.code != 1 || !strings.Contains(res.stderr, `no node named "n1" under prefix mqlet/v1`) {
		t.Fatalf("apply to a node that never published state: %v", res)
	}
	if took := time.Since(start); took > 15*time.Second {
		t.Errorf("gave up after %v; --retained-wait is 300ms and --timeout 30s", took)
	}
}

// Every command is listed by name in `mqletctl help`, and its own help
// gives its usage line and an example.
func TestHelpOfEveryCommand(t *testing.T) {
	top := runCLIEnv(t, map[string]string{}, "", "help")
	for _, c := range commands() {
		if !strings.Contains(top.stdout, "\n  "+c.name+" ") {
			t.Errorf("mqletctl help does not list %s by name:\n%s", c.name, top.stdout)
		}
		res := runCLIEnv(t, map[string]string{}, "", "help", c.name)
		if res.code != 0 || !strings.Contains(res.stdout, "Usage:\n  mqletctl "+c.name) || !strings.Contains(res.stdout, "Example:\n  mqletctl "+c.name) {
			t.Errorf("help %s: want its usage line and an example: %v", c.name, res)
		}
	}
}

// A bad flag is named as it was typed, as kubectl does.
func TestFlagErrorsQuoteTheFlagAsTyped(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"get", "pods", "-x"}, "error: unknown shorthand flag: 'x' in -x\n"},
		{[]string{"get", "pods", "--bogus"}, "error: unknown flag: --bogus\n"},
		{[]string{"-x", "get"}, "error: unknown shorthand flag: 'x' in -x\n"},
		{[]string{"logs", "web", "-c"}, "error: flag needs an argument: -c\n"},
		{[]string{"logs", "web", "--container"}, "error: flag needs an argument: --container\n"},
	} {
		res := runCLIEnv(t, map[string]string{envNode: "n1"}, "", c.args...)
		if res.code != 2 || !strings.HasPrefix(res.stderr, c.want) {
			t.Errorf("%v: want exit 2 and %q first: %v", c.args, c.want, res)
		}
	}
}

// -n says what each command takes when it is not given.
func TestNamespaceHelpSaysEachCommandsDefault(t *testing.T) {
	for cmd, want := range map[string]string{"get": "every namespace", "top": "every namespace", "describe": "default",
		"logs": "default", "exec": "default", "restart": "default", "delete": "default"} {
		res := runCLIEnv(t, map[string]string{}, "", "help", cmd)
		line := ""
		for _, l := range strings.Split(res.stdout, "\n") {
			if strings.Contains(l, "-n, --namespace") {
				line = l
			}
		}
		if !strings.HasSuffix(line, "(default: "+want+")") || strings.Contains(line, " for ") {
			t.Errorf("help %s: -n reads %q, want its default %q", cmd, line, want)
		}
	}
}

func TestHelpAndBadUsage(t *testing.T) {
	for _, args := range [][]string{{"help", "get"}, {"get", "--help"}, {"get", "-h"}, {"help", "certs"}, {"keys", "--help"}, {"version", "--help"}} {
		res := runCLIEnv(t, map[string]string{}, "", args...)
		name := args[0]
		if name == "help" {
			name = args[1]
		}
		if res.code != 0 || !strings.Contains(res.stdout, "Usage:\n  mqletctl "+name) || !strings.Contains(res.stdout, "Example:\n  mqletctl ") || res.stderr != "" {
			t.Errorf("%v: want the command's help on stdout and exit 0: %v", args, res)
		}
	}
	res := runCLIEnv(t, map[string]string{}, "", "help", "get")
	if !strings.Contains(res.stdout, "\n  mqletctl get events [--for pod/NAME|node/NAME] [-n NS] [-o json|yaml]\n") || !strings.Contains(res.stdout, "--for string") {
		t.Errorf("help get does not show get events: %v", res)
	}
	res = runCLIEnv(t, map[string]string{}, "", "help", "delete")
	if !strings.Contains(res.stdout, "-f, --filename FILE") || !strings.Contains(res.stdout, "--grace-period int") || strings.Contains(res.stdout, "--broker string") {
		t.Errorf("help delete lists its own flags, not the global ones: %v", res)
	}
	for _, args := range [][]string{{"get", "--bogus"}, {"--bogus"}, {"help", "nope"}, {"get", "pods", "-n"}} {
		res := runCLIEnv(t, map[string]string{envNode: "n1"}, "", args...)
		if res.code != 2 || res.stdout != "" || strings.Count(res.stderr, "\n") > 3 || !strings.Contains(res.stderr, "See 'mqletctl help") {
			t.Errorf("%v: want exit 2 and a short message: %v", args, res)
		}
	}
}

// The agent's own decoder reads what apply -f DIR and delete -f … -f send.
func TestManifestsFromADirectoryAndSeveralFiles(t *testing.T) {
	url := startBroker(t, broker.Options{})
	agent := startFakeAgent(t, url, func(r received) []fakeReply { return []fakeReply{{Phase: "succeeded"}} })
	dir := t.TempDir()
	cm := `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"cfg","namespace":"edge"},"data":{"a":"1"}}`
	two := "apiVersion: v1\nkind: Secret\nmetadata:\n  name: s1\n---\n" + strings.Replace(podManifest, "name: web\nspec", "name: api\nspec", 1)
	for name, content := range map[string]string{"b-pod.yaml": podManifest, "a-cm.json": cm, "c-two.yml": two, "notes.txt": "not a manifest", "d.yaml.bak": "kind: Pod"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "sub"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "sub", "x.yaml"), []byte(podManifest), 0o600); err != nil {
		t.Fatal(err)
	}
	refsOf := func(payload []byte) string {
		t.Helper()
		refs, _, err := manifest.DecodeRef(payload)
		if err != nil {
			t.Fatalf("the agent's decoder refuses %q: %v", payload, err)
		}
		var s []string
		for _, r := range refs {
			s = append(s, r.String())
		}
		return strings.Join(s, "; ")
	}
	res := runCLI(t, url, "", "apply", "-f", dir)
	if res.code != 0 {
		t.Fatalf("apply -f DIR: %v", res)
	}
	want := "ConfigMap edge/cfg; Pod default/web; Secret default/s1; Pod default/api"
	if got := refsOf(agent.only(t).Payload); got != want {
		t.Errorf("apply -f DIR sent %s, want %s (name order, no subdirectory, no other files)", got, want)
	}
	other := writeFile(t, "other.yaml", strings.Replace(podManifest, "name: web\nspec", "name: db\nspec", 1))
	res = runCLI(t, url, "", "delete", "-f", filepath.Join(dir, "b-pod.yaml"), "-f", other)
	if res.code != 0 {
		t.Fatalf("delete -f A -f B: %v", res)
	}
	<-agent.got
	last := <-agent.got
	if got := refsOf(last.Payload); got != "Pod default/web; Pod default/db" {
		t.Errorf("delete -f A -f B sent %s", got)
	}
	res = runCLI(t, url, "", "apply", "-f", filepath.Join(dir, "sub", "none"))
	if res.code != 1 || !strings.Contains(res.stderr, "reading manifest") {
		t.Errorf("apply -f of a missing file: %v", res)
	}
	empty := t.TempDir()
	res = runCLI(t, url, "", "apply", "-f", empty)
	if res.code != 1 || !strings.Contains(res.stderr, "has no .yaml, .yml or .json file") {
		t.Errorf("apply -f of an empty directory: %v", res)
	}
}
