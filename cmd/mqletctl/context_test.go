package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mqlet/mqlet/mqtt/broker"
)

func TestContextsFromTheConfigFile(t *testing.T) {
	const secret = "ctx-Passw0rd"
	url := startBroker(t, broker.Options{PasswordFile: writeFile(t, "users", "op:"+secret+"\n")})
	xdg := t.TempDir()
	dir := filepath.Join(xdg, "mqletctl")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "op.pass"), []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := "currentContext: lab\ncontexts:\n" +
		"- name: lab\n  broker: " + url + "\n  node: n1\n  username: op\n  passwordFile: op.pass\n" +
		"- name: dead\n  broker: tcp://127.0.0.1:1\n  node: n1\n"
	if err := os.WriteFile(filepath.Join(dir, "config.yaml"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	// The password comes only from the context's file (relative to it).
	c := testClientAuth(t, url, "op", secret)
	publishNodeWith(t, c, "online")
	vars := map[string]string{"XDG_CONFIG_HOME": xdg}

	res := runCLIEnv(t, vars, "", "status", "--retained-wait", "5s")
	if res.code != 0 || !strings.Contains(res.stdout, "State:") || !strings.Contains(res.stdout, "online") {
		t.Fatalf("status in the current context: %v", res)
	}
	res = runCLIEnv(t, vars, "", "--context", "dead", "status", "--timeout", "5s")
	if res.code != 1 || !strings.Contains(res.stderr, "cannot reach broker tcp://127.0.0.1:1") {
		t.Fatalf("status in context dead: %v", res)
	}
	// A flag beats the context; the context still gives node and login.
	res = runCLIEnv(t, vars, "", "status", "--context", "dead", "--broker", url, "--username", "op", "--password-file", filepath.Join(dir, "op.pass"))
	if res.code != 0 {
		t.Fatalf("--broker over context dead: %v", res)
	}
	// The environment beats the context too.
	res = runCLIEnv(t, map[string]string{"XDG_CONFIG_HOME": xdg, envContext: "dead", envBroker: url}, "", "status", "--username", "op", "--password-file", filepath.Join(dir, "op.pass"))
	if res.code != 0 {
		t.Fatalf("%s over context dead: %v", envBroker, res)
	}
	res = runCLIEnv(t, vars, "", "status", "--context", "nope")
	if res.code != 2 || !strings.Contains(res.stderr, `context "nope" is not in `) {
		t.Fatalf("unknown context: %v", res)
	}
	res = runCLIEnv(t, map[string]string{}, "", "status", "--config", filepath.Join(xdg, "missing.yaml"))
	if res.code != 1 || !strings.Contains(res.stderr, "reading config file") {
		t.Fatalf("a named config file that is missing: %v", res)
	}
	if strings.Contains(res.stdout+res.stderr, secret) {
		t.Errorf("output shows the password: %v", res)
	}
}
