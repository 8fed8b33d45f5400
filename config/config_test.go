package config

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	apiv1 "github.com/mqlet/mqlet/api/v1"
)

func noEnv(string) string { return "" }

func TestSampleFileDocumentsTheDefaults(t *testing.T) {
	f := &Flags{ConfigFile: filepath.Join("..", "configs", "mqlet.yaml"), set: map[string]string{"node": "gw1"}}
	got, err := Load(f, noEnv)
	if err != nil {
		t.Fatalf("loading configs/mqlet.yaml: %v", err)
	}
	want := Default()
	want.Node = "gw1"
	if !reflect.DeepEqual(*got, want) {
		t.Fatalf("configs/mqlet.yaml differs from Default():\n got %+v\nwant %+v", *got, want)
	}
}

func TestPrecedenceFlagOverEnvOverFile(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "c.yaml")
	if err := os.WriteFile(file, []byte("node: fromfile\nstateDir: /file\nlogLevel: debug\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := ParseFlags("mqlet", []string{"--config", file, "--node", "fromflag", "--metrics-interval", "2s"}, os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"MQLET_NODE": "fromenv", "MQLET_STATE_DIR": "/env", "MQLET_MQTT_PASSWORD": "s3cret"}
	cfg, err := Load(f, func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Node != "fromflag" || cfg.StateDir != "/env" || cfg.LogLevel != "debug" {
		t.Fatalf("precedence wrong: node=%q stateDir=%q logLevel=%q", cfg.Node, cfg.StateDir, cfg.LogLevel)
	}
	if cfg.Telemetry.MetricsInterval.Duration != 2*time.Second {
		t.Fatalf("metrics interval %v", cfg.Telemetry.MetricsInterval)
	}
	if cfg.MQTT.Password != "s3cret" {
		t.Fatal("password from env not taken")
	}
}

func TestInvalidConfigNamesTheField(t *testing.T) {
	cases := map[string]struct{ yaml, field string }{
		"unknown field":   {"nodee: x\n", "nodee"},
		"bad broker":      {"mqtt:\n  broker: http://x:1\n", "mqtt.broker"},
		"bad duration":    {"mqtt:\n  keepAlive: soon\n", "soon"},
		"zero workers":    {"pods:\n  workers: 0\n", "pods.workers"},
		"bad log level":   {"logLevel: loud\n", "logLevel"},
		"bad go gc":       {"goGC: 5\n", "goGC"},
		"wildcard prefix": {"mqtt:\n  topicPrefix: a/+/b\n", "mqtt.topicPrefix"},
		"cert w/o key":    {"mqtt:\n  certFile: /x\n", "mqtt.certFile"},
		"duplicate key":   {"node: a\nnode: b\n", "node"},
		"unknown profile": {"admission:\n  profile: lax\n", "admission.profile"},
		"empty profile":   {"admission:\n  profile: \"\"\n", "admission.profile"},
		"bad ns profile":  {"admission:\n  namespaces: {kube-system: root}\n", "admission.namespaces.kube-system"},
		"bad ns name":     {"admission:\n  namespaces: {Kube_System: privileged}\n", "admission.namespaces"},
		"bad host port":   {"admission:\n  allowedHostPorts: [\"8080\", \"70000\"]\n", "admission.allowedHostPorts[1]"},
		"reversed range":  {"admission:\n  allowedHostPorts: [\"9000-8000\"]\n", "admission.allowedHostPorts[0]"},
		"relative path":   {"admission:\n  allowedHostPaths: [data]\n", "admission.allowedHostPaths[0]"},
		// The YAML path of the problem, not just the key's last level.
		"nested unknown":  {"mqtt:\n  brokr: tcp://x:1\n", "mqtt.brokr: unknown field"},
		"case mismatch":   {"mqtt:\n  Broker: tcp://x:1\n", `mqtt.Broker: unknown field (did you mean "broker"?`},
		"top-level case":  {"LogLevel: debug\n", "LogLevel: unknown field"},
		"duration path":   {"mqtt:\n  keepAlive: soon\n", "mqtt.keepAlive"},
		"type path":       {"pods:\n  workers: many\n", "pods.workers"},
		"list item field": {"security:\n  trustedKeys:\n  - keyid: x\n", "security.trustedKeys[0].keyid: unknown field"},
		// Schemes and prefixes the session and topic scheme refuse at start.
		"tls scheme":         {"mqtt:\n  broker: tls://x:8883\n", "mqtt.broker"},
		"mqtt scheme":        {"mqtt:\n  broker: mqtt://x:1883\n", "mqtt.broker"},
		"mqtts scheme":       {"mqtt:\n  broker: mqtts://x:8883\n", "mqtt.broker"},
		"no port":            {"mqtt:\n  broker: tcp://x\n", "mqtt.broker"},
		"empty level":        {"mqtt:\n  topicPrefix: a//b\n", "mqtt.topicPrefix"},
		"bad label key":      {"nodeLabels: {\"a b\": x}\n", "nodeLabels[a b]"},
		"class handler":      {"runtime:\n  classes:\n  - {name: fast, handler: Runc_B}\n", "runtime.classes[0].handler"},
		"class twice":        {"runtime:\n  classes:\n  - {name: a, handler: runc}\n  - {name: a, handler: runc}\n", "runtime.classes[1].name"},
		"class overhead":     {"runtime:\n  classes:\n  - {name: a, handler: runc, overhead: {cpu: lots}}\n", "runtime.classes[0].overhead.cpu"},
		"class storage":      {"runtime:\n  classes:\n  - {name: a, handler: runc, overhead: {ephemeral-storage: 1Gi}}\n", "runtime.classes[0].overhead.ephemeral-storage"},
		"bad label value":    {"nodeLabels: {site: \"-x-\"}\n", "nodeLabels[site]"},
		"well-known label":   {"nodeLabels: {kubernetes.io/hostname: other}\n", "nodeLabels[kubernetes.io/hostname]"},
		"bad broker in list": {"mqtt:\n  brokers: [tcp://a:1, http://b:2]\n", "mqtt.brokers[1]"},
		"repeated broker":    {"mqtt:\n  brokers: [tcp://a:1, tcp://u:p@a:1]\n", "mqtt.brokers[1]: repeats mqtt.brokers[0]"},
		"broker and list":    {"mqtt:\n  broker: tcp://x:1\n  brokers: [tcp://a:1, tcp://b:2]\n", "mqtt.broker"},
		"eviction signal":    {"eviction:\n  hard: {disk.free: 1Gi}\n", "eviction.hard.disk.free: unknown signal"},
		"eviction percent":   {"eviction:\n  hard: {imagefs.available: 150%}\n", "eviction.hard.imagefs.available"},
		"eviction moved":     {"eviction:\n  hard: {nodefs.available: 5%}\n", "eviction.hard.nodefs.available: set in telemetry.diskAvailablePercent"},
		"soft without grace": {"eviction:\n  soft: {memory.available: 300Mi}\n", "eviction.softGracePeriod.memory.available"},
		"grace without soft": {"eviction:\n  softGracePeriod: {pid.available: 1m}\n", "eviction.softGracePeriod.pid.available: no soft threshold"},
		"bad reserve":        {"eviction:\n  reservedStorage: lots\n", "eviction.reservedStorage"},
		"bad memory avail":   {"telemetry:\n  memoryAvailable: lots\n", "telemetry.memoryAvailable"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			file := filepath.Join(t.TempDir(), "c.yaml")
			if err := os.WriteFile(file, []byte(tc.yaml), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := Load(&Flags{ConfigFile: file, set: map[string]string{}}, noEnv)
			if err == nil {
				t.Fatal("invalid config accepted")
			}
			if !strings.Contains(err.Error(), tc.field) {
				t.Fatalf("error %q does not name %q", err, tc.field)
			}
		})
	}
}

// The thresholds of the file, the three under telemetry first, then the
// other hard ones, then the soft ones with their grace periods.
func TestEvictionThresholds(t *testing.T) {
	file := filepath.Join(t.TempDir(), "c.yaml")
	yaml := "telemetry:\n  pidAvailablePercent: 0\neviction:\n  hard: {imagefs.inodesFree: \"0\"}\n  soft: {memory.available: 300Mi}\n  softGracePeriod: {memory.available: 90s}\n"
	if err := os.WriteFile(file, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := Load(&Flags{ConfigFile: file, set: map[string]string{"node": "gw1"}}, noEnv)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, th := range cfg.EvictionThresholds() {
		got = append(got, fmt.Sprintf("%s<%s/%s", th.Signal, th.Value, th.GracePeriod))
	}
	want := "memory.available<100Mi/0s nodefs.available<10%/0s imagefs.available<15%/0s nodefs.inodesFree<5%/0s memory.available<300Mi/1m30s"
	if strings.Join(got, " ") != want {
		t.Fatalf("thresholds\n got %s\nwant %s", strings.Join(got, " "), want)
	}
	if Reserved(cfg.Eviction.ReservedStorage) != 64<<20 {
		t.Fatalf("reserved storage %q", cfg.Eviction.ReservedStorage)
	}
}

func TestBrokersListAndItsOneElementCase(t *testing.T) {
	file := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(file, []byte("mqtt:\n  brokers: [tcp://a:1, ssl://b:8883]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := Load(&Flags{ConfigFile: file, set: map[string]string{}}, noEnv)
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.MQTT.BrokerList(); !reflect.DeepEqual(got, []string{"tcp://a:1", "ssl://b:8883"}) || cfg.MQTT.Broker != "tcp://a:1" {
		t.Fatalf("brokers %v, broker %s", got, cfg.MQTT.Broker)
	}
	// A flag (or MQLET_BROKER) replaces the file's list, as flags replace the file.
	cfg, err = Load(&Flags{ConfigFile: file, set: map[string]string{"broker": "tcp://c:3"}}, noEnv)
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.MQTT.BrokerList(); !reflect.DeepEqual(got, []string{"tcp://c:3"}) {
		t.Fatalf("brokers with --broker: %v", got)
	}
	if got := Default().MQTT.BrokerList(); !reflect.DeepEqual(got, []string{"tcp://127.0.0.1:1883"}) {
		t.Fatalf("default brokers: %v", got)
	}
}

func TestFieldErrorIsTyped(t *testing.T) {
	cfg := Default()
	cfg.Pods.Workers = 0
	var fe *FieldError
	if err := cfg.Validate(); !errors.As(err, &fe) || fe.Field != "pods.workers" {
		t.Fatalf("want FieldError for pods.workers, got %v", err)
	}
}

func TestBadFlagValue(t *testing.T) {
	f, err := ParseFlags("mqlet", []string{"--node-status-interval", "often"}, os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Load(f, noEnv); err == nil || !strings.Contains(err.Error(), "--node-status-interval") {
		t.Fatalf("want error naming the flag, got %v", err)
	}
}

func TestSecuritySection(t *testing.T) {
	const key = "l9wVHcGWqbiEFwUPy6NmRn4mcbVtSwt8FzHUVPxtYcQ="
	load := func(t *testing.T, yaml string) (*Config, error) {
		t.Helper()
		file := filepath.Join(t.TempDir(), "c.yaml")
		if err := os.WriteFile(file, []byte(yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		return Load(&Flags{ConfigFile: file, set: map[string]string{"node": "gw1"}}, noEnv)
	}
	cfg, err := load(t, "security:\n  commands: off\n")
	if err != nil || cfg.Security.Commands != CommandsOff {
		t.Fatalf("unquoted off (YAML false): %v, %q", err, cfg.Security.Commands)
	}
	cfg, err = load(t, "security:\n  commands: signed-only\n  signedVerbs: [exec]\n  groups: [lab]\n  trustedKeys:\n  - publicKey: "+key+"\n    verbs: [apply, get]\n    maxProfile: baseline\n  - keyId: ci\n    publicKeyFile: /etc/mqlet/ci.pub\n    verbs: ['*']\n")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Security.Commands != CommandsSignedOnly || len(cfg.Security.TrustedKeys) != 2 || cfg.Security.TrustedKeys[0].MaxProfile != "baseline" || cfg.Security.Groups[0] != "lab" {
		t.Fatalf("security %+v", cfg.Security)
	}
	// The entry `mqletctl keys generate` prints: every verb, cancel too.
	every := "[" + strings.Join(apiv1.Verbs(), ", ") + "]"
	if _, err := load(t, "security:\n  signedVerbs: "+every+"\n  trustedKeys:\n  - publicKey: "+key+"\n    verbs: "+every+"\n"); err != nil {
		t.Fatalf("a key trusted with every verb of the contract: %v", err)
	}
	cases := map[string]struct{ yaml, field string }{
		"bad mode":               {"security:\n  commands: on\n", "security.commands"},
		"unknown mode":           {"security:\n  commands: sometimes\n", "security.commands"},
		"required, no keys":      {"security:\n  commands: signed-only\n", "security.trustedKeys"},
		"verb required, no keys": {"security:\n  signedVerbs: [exec]\n", "security.trustedKeys"},
		"unknown verb":           {"security:\n  signedVerbs: [reboot]\n  trustedKeys:\n  - publicKey: " + key + "\n    verbs: [get]\n", "security.signedVerbs[0]"},
		"short key":              {"security:\n  trustedKeys:\n  - publicKey: AAAA\n    verbs: [get]\n", "security.trustedKeys[0].publicKey"},
		"two key sources":        {"security:\n  trustedKeys:\n  - publicKey: " + key + "\n    publicKeyFile: /k.pub\n    verbs: [get]\n", "security.trustedKeys[0]"},
		"relative key file":      {"security:\n  trustedKeys:\n  - publicKeyFile: k.pub\n    verbs: [get]\n", "security.trustedKeys[0].publicKeyFile"},
		"no verbs":               {"security:\n  trustedKeys:\n  - publicKey: " + key + "\n", "security.trustedKeys[0].verbs"},
		"bad key verb":           {"security:\n  trustedKeys:\n  - publicKey: " + key + "\n    verbs: [all]\n", "security.trustedKeys[0].verbs[0]"},
		"bad profile":            {"security:\n  trustedKeys:\n  - publicKey: " + key + "\n    verbs: [get]\n    maxProfile: root\n", "security.trustedKeys[0].maxProfile"},
		"duplicate key id":       {"security:\n  trustedKeys:\n  - {keyId: a, publicKey: " + key + ", verbs: [get]}\n  - {keyId: a, publicKey: " + key + ", verbs: [get]}\n", "security.trustedKeys[1].keyId"},
		"bad key id":             {"security:\n  trustedKeys:\n  - {keyId: a/b, publicKey: " + key + ", verbs: [get]}\n", "security.trustedKeys[0].keyId"},
		"lifetime too long":      {"security:\n  maxLifetime: 48h\n", "security.maxLifetime"},
		"negative skew":          {"security:\n  clockSkew: -1s\n", "security.clockSkew"},
		"tiny nonce store":       {"security:\n  maxNonces: 1\n", "security.maxNonces"},
		"bad group":              {"security:\n  groups: [a/b]\n", "security.groups[0]"},
		"unknown key field":      {"security:\n  trustedKeys:\n  - {publicKey: " + key + ", verbs: [get], profile: x}\n", "profile"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := load(t, tc.yaml)
			if err == nil {
				t.Fatal("invalid security config accepted")
			}
			if !strings.Contains(err.Error(), tc.field) {
				t.Fatalf("error %q does not name %q", err, tc.field)
			}
		})
	}
}

func TestAdmissionFromFile(t *testing.T) {
	file := filepath.Join(t.TempDir(), "c.yaml")
	yaml := "admission:\n  profile: restricted\n  namespaces: {kube-system: privileged}\n  allowedHostPorts: [\"8080\", \"30000-32767\"]\n"
	if err := os.WriteFile(file, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := Load(&Flags{ConfigFile: file, set: map[string]string{"node": "gw1"}}, noEnv)
	if err != nil {
		t.Fatal(err)
	}
	a := cfg.Admission
	if a.Profile != "restricted" || a.Namespaces["kube-system"] != "privileged" || len(a.AllowedHostPorts) != 2 {
		t.Fatalf("admission loaded wrongly: %+v", a)
	}
}

func TestNodeLabelsFromFile(t *testing.T) {
	file := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(file, []byte("nodeLabels: {site: plant-3, example.com/tier: edge}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := Load(&Flags{ConfigFile: file, set: map[string]string{"node": "gw1"}}, noEnv)
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.NodeLabels) != 2 || cfg.NodeLabels["site"] != "plant-3" || cfg.NodeLabels["example.com/tier"] != "edge" {
		t.Fatalf("nodeLabels loaded wrongly: %v", cfg.NodeLabels)
	}
}

func TestParsePortRange(t *testing.T) {
	for in, want := range map[string][2]int32{"8080": {8080, 8080}, "30000-32767": {30000, 32767}, "1-65535": {1, 65535}} {
		first, last, err := ParsePortRange(in)
		if err != nil || first != want[0] || last != want[1] {
			t.Errorf("ParsePortRange(%q) = %d, %d, %v; want %v", in, first, last, err, want)
		}
	}
	for _, in := range []string{"", "0", "65536", "80-", "-80", "a", "90-80", " 80", "80-90-100"} {
		if _, _, err := ParsePortRange(in); err == nil {
			t.Errorf("ParsePortRange(%q) accepted", in)
		}
	}
}

// The runtime bind-mounts pod files from under the state dir and would
// resolve a relative path against its own directory, so Load makes it
// absolute.
func TestLoadMakesARelativeStateDirAbsolute(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	f, err := ParseFlags("mqlet", []string{"--state-dir", "state", "--node", "n1"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := Load(f, func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(dir, "state"); cfg.StateDir != want {
		t.Fatalf("stateDir = %q, want %q", cfg.StateDir, want)
	}
}

// Group labels come from the node's groups: a configured one would fake
// a membership to -L selectors and nodeSelectors.
func TestNodeLabelsRefuseGroupLabels(t *testing.T) {
	file := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(file, []byte("nodeLabels: {group.mqlet.io/line-1: \"true\"}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := Load(&Flags{ConfigFile: file, set: map[string]string{"node": "gw1"}}, noEnv)
	if err == nil || !strings.Contains(err.Error(), "set by mqlet itself from the node's groups") {
		t.Fatalf("a configured group label: %v", err)
	}
}
