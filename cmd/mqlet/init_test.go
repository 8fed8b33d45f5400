package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mqlet/mqlet/config"
)

func noEnv(string) string { return "" }

func TestInitWritesAConfigThatLoads(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "mqlet.yaml")
	// The package's stanza: a CRI endpoint, no broker.
	if err := os.WriteFile(file, []byte("# installed\nruntime:\n  criEndpoint: unix:///run/mqlet/containerd/containerd.sock\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	if code := runInit([]string{"--config", file, "--node", "gw-7", "--broker", "tcp://broker.example:1883"}, &out, &errb); code != 0 {
		t.Fatalf("init exit %d: %s", code, errb.String())
	}
	flags, err := config.ParseFlags("mqlet", []string{"--config", file}, &errb)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(flags, noEnv)
	if err != nil {
		t.Fatalf("written config does not load: %v", err)
	}
	if cfg.Node != "gw-7" || cfg.MQTT.Broker != "tcp://broker.example:1883" || cfg.Runtime.CRIEndpoint != "unix:///run/mqlet/containerd/containerd.sock" {
		t.Fatalf("config = node %q broker %q cri %q", cfg.Node, cfg.MQTT.Broker, cfg.Runtime.CRIEndpoint)
	}
	if fi, _ := os.Stat(file); fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v, want 0600", fi.Mode().Perm())
	}
	// A second init must not silently replace a configured node.
	if code := runInit([]string{"--config", file, "--node", "other", "--broker", "tcp://x:1"}, &out, &errb); code == 0 {
		t.Fatal("init replaced a config that names a broker without --force")
	}
	if code := checkConfig(flags, checkFlags{check: true, requireBroker: true}, noEnv, &out, &errb); code != exitConfigOK {
		t.Fatalf("check-config exit %d: %s", code, errb.String())
	}
}

func TestInitRefusesWhatTheAgentWouldRefuse(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "mqlet.yaml")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--broker", "tcp://b:1883"}, "--node is required"},
		{[]string{"--node", "gw1"}, "--broker is required"},
		{[]string{"--node", "a/b", "--broker", "tcp://b:1883"}, `"a/b" must not contain`},
		{[]string{"--node", "gw1", "--broker", "gopher://b"}, "scheme"},
		{[]string{"--node", "gw1", "--broker", "ssl://b:8883", "--ca", filepath.Join(dir, "missing.crt")}, "--ca"},
	} {
		var out, errb bytes.Buffer
		code := runInit(append([]string{"--config", file}, tc.args...), &out, &errb)
		if code == 0 || !strings.Contains(errb.String(), tc.want) {
			t.Errorf("init %v: exit %d, stderr %q; want failure naming %q", tc.args, code, errb.String(), tc.want)
		}
		if _, err := os.Stat(file); err == nil {
			t.Fatalf("init %v left a config behind", tc.args)
		}
	}
}

func TestCheckConfigExitCodes(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, tc := range []struct {
		file          string
		requireBroker bool
		want          int
	}{
		{write("empty.yaml", "# nothing yet\n"), false, exitConfigOK},
		{write("empty2.yaml", "# nothing yet\n"), true, exitConfigNoBroker},
		{write("embedded.yaml", "node: n\nembeddedBroker:\n  enabled: true\n"), true, exitConfigOK},
		{write("bad.yaml", "node: n\npods:\n  workers: 0\n"), false, exitConfigInvalid},
		{write("unknown.yaml", "node: n\nnoSuchKey: 1\n"), false, exitConfigInvalid},
		// Refused by the session or the topic scheme at start (exit 1 there):
		// the check must refuse them too.
		{write("tls.yaml", "node: n\nmqtt:\n  broker: tls://x:8883\n"), false, exitConfigInvalid},
		{write("mqtts.yaml", "node: n\nmqtt:\n  broker: mqtts://x:8883\n"), false, exitConfigInvalid},
		{write("prefix.yaml", "node: n\nmqtt:\n  topicPrefix: a//b\n"), false, exitConfigInvalid},
	} {
		var out, errb bytes.Buffer
		flags, err := config.ParseFlags("mqlet", []string{"--config", tc.file, "--node", "n"}, &errb)
		if err != nil {
			t.Fatal(err)
		}
		if got := checkConfig(flags, checkFlags{check: true, requireBroker: tc.requireBroker}, noEnv, &out, &errb); got != tc.want {
			t.Errorf("%s (requireBroker %v): exit %d, want %d; stderr %q", filepath.Base(tc.file), tc.requireBroker, got, tc.want, errb.String())
		}
	}
}

func TestSplitCheckFlags(t *testing.T) {
	cf, rest := splitCheckFlags([]string{"--config", "f", "--check-config", "-require-broker", "--node", "check-config"})
	if !cf.check || !cf.requireBroker || strings.Join(rest, " ") != "--config f --node check-config" {
		t.Fatalf("got %+v %q", cf, rest)
	}
}

func TestCheckConfigNamesTheYAMLPath(t *testing.T) {
	file := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(file, []byte("node: n\nmqtt:\n  brokr: tcp://x:1\n  KeepAlive: 5s\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	flags, err := config.ParseFlags("mqlet", []string{"--config", file}, &errb)
	if err != nil {
		t.Fatal(err)
	}
	if got := checkConfig(flags, checkFlags{check: true}, noEnv, &out, &errb); got != exitConfigInvalid {
		t.Fatalf("exit %d, want %d", got, exitConfigInvalid)
	}
	for _, want := range []string{"mqtt.brokr: unknown field", "mqtt.KeepAlive: unknown field (did you mean \"keepAlive\"?"} {
		if !strings.Contains(errb.String(), want) {
			t.Errorf("stderr does not say %q:\n%s", want, errb.String())
		}
	}
	if out.Len() != 0 {
		t.Errorf("an invalid config printed on stdout: %q", out.String())
	}
}
