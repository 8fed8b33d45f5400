package liveconfig

import (
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
