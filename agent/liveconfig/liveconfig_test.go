package liveconfig

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	apiv1 "github.com/mqlet/mqlet/api/v1"
	"github.com/mqlet/mqlet/config"
)

func open(t *testing.T, dir string) *Settings {
	t.Helper()
	cfg := config.Default()
	s, dropped, err := Open(&cfg, map[string]string{"telemetry.podStatusResync": config.SourceFile}, dir)
	if err != nil || len(dropped) > 0 {
		t.Fatalf("open: %v, dropped %v", err, dropped)
	}
	return s
}

func TestPatchPersistsSignalsAndResets(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	changes := s.Changes()
	if _, err := s.Patch([]byte(`{"metricsInterval":"2s"}`)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-changes:
	default:
		t.Fatal("no change signalled")
	}
	if d := s.Duration("telemetry.metricsInterval"); d != 2*time.Second {
		t.Fatalf("metricsInterval %v after the patch", d)
	}
	view, err := s.View()
	if err != nil {
		t.Fatal(err)
	}
	if v := view.Settings["telemetry.metricsInterval"]; v.Source != apiv1.SourceRemote || string(v.Value) != `"2s"` {
		t.Fatalf("view: %+v", v)
	}
	if v := view.Settings["telemetry.podStatusResync"]; v.Source != apiv1.SourceFile {
		t.Fatalf("a file setting shows source %q", v.Source)
	}
	if v := view.Settings["gc.interval"]; v.Source != apiv1.SourceDefault {
		t.Fatalf("a default setting shows source %q", v.Source)
	}

	// A restart reads it back; nested merge-patch form and null reset.
	s = open(t, dir)
	if d := s.Duration("metricsInterval"); d != 2*time.Second {
		t.Fatalf("after reopening: %v", d)
	}
	if _, err := s.Patch([]byte(`{"telemetry":{"metricsInterval":null},"gc":{"interval":"30s"}}`)); err != nil {
		t.Fatal(err)
	}
	if d := s.Duration("metricsInterval"); d != 30*time.Second {
		t.Fatalf("null did not reset to the file's value: %v", d)
	}
	if d := open(t, dir).Duration("gcInterval"); d != 30*time.Second {
		t.Fatalf("gc.interval after reopening: %v", d)
	}
}

func TestPatchRefusesSecurityUnknownAndBadValuesWhole(t *testing.T) {
	s := open(t, t.TempDir())
	for patch, want := range map[string]string{
		`{"admission.allowPrivileged":true}`:               "admission.allowPrivileged: governs security",
		`{"admission":{"allowPrivileged":true}}`:           "admission.allowPrivileged: governs security",
		`{"exec":{"enabled":true}}`:                        "exec.enabled: governs security",
		`{"mqtt.password":"x"}`:                            "mqtt.password: governs security",
		`{"nosuch":"1s"}`:                                  "nosuch: not tunable",
		`{"metricsInterval":"1ms"}`:                        "not a duration from 1s",
		`{"metricsInterval":5}`:                            "want a duration string",
		`{"metricsInterval":"5s","security.commands":"x"}`: "security.commands",
		`[]`: "JSON object",
	} {
		_, err := s.Patch([]byte(patch))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", patch, err, want)
		}
	}
	if d := s.Duration("metricsInterval"); d != 30*time.Second {
		t.Fatalf("a refused patch changed metricsInterval to %v", d)
	}
}

func TestLogLevelAndPeriodsAreLiveWithBounds(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	if _, err := s.Patch([]byte(`{"logLevel":"debug","plegPeriod":"200ms","nodeStatusInterval":"2s","podStatusResync":"5s"}`)); err != nil {
		t.Fatal(err)
	}
	if s.LogLevel() != "debug" || s.Duration("runtime.plegPeriod") != 200*time.Millisecond ||
		s.Period("nodeStatusInterval").Period() != 2*time.Second || s.Duration("podStatusResync") != 5*time.Second {
		t.Fatalf("after the patch: %s %v %v %v", s.LogLevel(), s.Duration("plegPeriod"), s.Duration("nodeStatusInterval"), s.Duration("podStatusResync"))
	}
	view, err := s.View()
	if err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]string{"logLevel": `"debug"`, "runtime.plegPeriod": `"200ms"`, "telemetry.nodeStatusInterval": `"2s"`, "telemetry.podStatusResync": `"5s"`} {
		if v := view.Settings[path]; v.Source != apiv1.SourceRemote || string(v.Value) != want {
			t.Errorf("%s: %+v", path, v)
		}
	}
	if eff := s.Effective(); eff.LogLevel != "debug" || eff.Runtime.PLEGPeriod.Duration != 200*time.Millisecond {
		t.Fatalf("effective: %s %v", eff.LogLevel, eff.Runtime.PLEGPeriod)
	}
	// Kept across a restart; null resets to the file's value.
	s = open(t, dir)
	if s.LogLevel() != "debug" || s.Duration("plegPeriod") != 200*time.Millisecond {
		t.Fatalf("after reopening: %s %v", s.LogLevel(), s.Duration("plegPeriod"))
	}
	if _, err := s.Patch([]byte(`{"logLevel":null,"runtime":{"plegPeriod":null}}`)); err != nil {
		t.Fatal(err)
	}
	if s.LogLevel() != "info" || s.Duration("plegPeriod") != time.Second {
		t.Fatalf("null did not reset: %s %v", s.LogLevel(), s.Duration("plegPeriod"))
	}
	for patch, want := range map[string]string{
		`{"plegPeriod":"10ms"}`:           "plegPeriod: \"10ms\" is not a duration from 100ms to 1m0s",
		`{"plegPeriod":"2m"}`:             "from 100ms to 1m0s",
		`{"nodeStatusInterval":"100ms"}`:  "from 1s to 1h0m0s",
		`{"podStatusResync":"1s"}`:        "from 5s to 24h0m0s",
		`{"logLevel":"loud"}`:             `logLevel: "loud" is not one of trace, debug, info, warn, error`,
		`{"logLevel":1}`:                  "want one of trace",
		`{"logLevel":"debug","gc":"bad"}`: "gc: not tunable",
	} {
		if _, err := s.Patch([]byte(patch)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", patch, err, want)
		}
	}
	if s.LogLevel() != "info" {
		t.Fatalf("a refused patch changed logLevel to %s", s.LogLevel())
	}
}

// The view, which any broker login may read, does not reveal who the node
// logs in as, where its credentials lie, nor which host paths pods may mount.
func TestViewHidesCredentialsAndHostPaths(t *testing.T) {
	cfg := config.Default()
	cfg.MQTT.Username = "gw-user-7"
	cfg.MQTT.PasswordFile = "/etc/mqlet/secret-pw"
	cfg.MQTT.KeyFile = "/etc/mqlet/client.key"
	cfg.EmbeddedBroker.PasswordFile = "/etc/mqlet/broker-pw"
	cfg.Admission.AllowedHostPaths = []string{"/srv/private-data"}
	cfg.Images.CredentialsFile = "/etc/mqlet/registry.json"
	s, _, err := Open(&cfg, map[string]string{"mqtt.username": apiv1.SourceFile}, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	view, err := s.View()
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := json.Marshal(view)
	for _, leak := range []string{"gw-user-7", "secret-pw", "client.key", "broker-pw", "private-data", "registry.json"} {
		if strings.Contains(string(raw), leak) {
			t.Errorf("the view reveals %q", leak)
		}
	}
	for _, path := range []string{"mqtt.username", "mqtt.passwordFile", "admission.allowedHostPaths", "embeddedBroker.passwordFile", "images.credentialsFile"} {
		if v, ok := view.Settings[path]; !ok || string(v.Value) != Hidden {
			t.Errorf("%s: %+v, want it listed as %s", path, v, Hidden)
		}
	}
	if v := view.Settings["mqtt.username"]; v.Source != apiv1.SourceFile {
		t.Errorf("a hidden setting keeps its source: %+v", v)
	}
	if v := view.Settings["gc.interval"]; string(v.Value) == Hidden {
		t.Error("an ordinary setting is hidden")
	}
}

func TestGroupsAreLive(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	if g := s.Groups(); len(g) != 0 {
		t.Fatalf("default groups %v", g)
	}
	if _, err := s.Patch([]byte(`{"groups":["line-2","line-1"]}`)); err != nil {
		t.Fatal(err)
	}
	if g := strings.Join(s.Groups(), ","); g != "line-1,line-2" {
		t.Fatalf("groups %q", g)
	}
	if g := strings.Join(open(t, dir).Groups(), ","); g != "line-1,line-2" {
		t.Fatalf("groups after a restart %q", g)
	}
	for _, bad := range []string{`{"groups":["a/b"]}`, `{"groups":["a+"]}`, `{"groups":["#"]}`, `{"groups":["a","a"]}`, `{"groups":[1]}`, `{"groups":"-x"}`} {
		if _, err := s.Patch([]byte(bad)); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
	if _, err := s.Patch([]byte(`{"groups":null}`)); err != nil || len(s.Groups()) != 0 {
		t.Fatalf("reset: %v %v", err, s.Groups())
	}
}

// nodeLabels are live: an object or a "k=v,..." string is the whole new
// set (keys with dots and slashes stay whole), kept across a restart,
// checked as the file's are (a group's label or a well-known one
// refused), null back to the file's.
func TestNodeLabelsAreLive(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	if l := s.NodeLabels(); len(l) != 0 {
		t.Fatalf("default labels %v", l)
	}
	if _, err := s.Patch([]byte(`{"nodeLabels":{"site":"plant-4","example.com/tier":"edge"}}`)); err != nil {
		t.Fatal(err)
	}
	if l := s.NodeLabels(); len(l) != 2 || l["site"] != "plant-4" || l["example.com/tier"] != "edge" {
		t.Fatalf("labels %v", l)
	}
	if l := open(t, dir).NodeLabels(); l["example.com/tier"] != "edge" {
		t.Fatalf("labels after a restart %v", l)
	}
	if _, err := s.Patch([]byte(`{"nodeLabels":"site=plant-5"}`)); err != nil {
		t.Fatal(err)
	}
	if l := s.NodeLabels(); len(l) != 1 || l["site"] != "plant-5" {
		t.Fatalf("labels from a string: %v (the set given replaces the one before)", l)
	}
	if c := s.Effective(); c.NodeLabels["site"] != "plant-5" {
		t.Fatalf("effective labels %v", c.NodeLabels)
	}
	for _, bad := range []string{`{"nodeLabels":{"group.mqlet.io/x":"true"}}`, `{"nodeLabels":{"kubernetes.io/hostname":"h"}}`, `{"nodeLabels":{"a":1}}`,
		`{"nodeLabels":{"a b":"c"}}`, `{"nodeLabels":{"a":"b,c=d"}}`, `{"nodeLabels":"a"}`, `{"nodeLabels":"a=1,a=2"}`, `{"nodeLabels":["a=b"]}`, `{"nodeLabels":{"a":"` + strings.Repeat("x", 64) + `"}}`} {
		if _, err := s.Patch([]byte(bad)); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
	if l := s.NodeLabels(); len(l) != 1 || l["site"] != "plant-5" {
		t.Fatalf("a refused patch changed the labels: %v", l)
	}
	if _, err := s.Patch([]byte(`{"nodeLabels":null}`)); err != nil || len(s.NodeLabels()) != 0 {
		t.Fatalf("reset: %v %v", err, s.NodeLabels())
	}
}
