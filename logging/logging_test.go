package logging

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	"github.com/rs/zerolog"
	v1 "k8s.io/api/core/v1"

	"github.com/mqlet/mqlet/internal/redact"
)

func TestKlogSinkWritesStructuredJSON(t *testing.T) {
	var buf bytes.Buffer
	log := logr.New(&klogSink{log: zerolog.New(&buf).Level(zerolog.InfoLevel)})
	log.Info("hello", "pod", "web")
	log.V(2).Info("hidden at info level")
	log.Error(errors.New("boom"), "failed", "n", 3)
	lines := bytes.Split(bytes.TrimSpace(buf.Bytes()), []byte("\n"))
	if len(lines) != 2 {
		t.Fatalf("want 2 lines (V(2) suppressed), got %d: %s", len(lines), buf.String())
	}
	var first, second map[string]any
	if err := json.Unmarshal(lines[0], &first); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(lines[1], &second); err != nil {
		t.Fatal(err)
	}
	if first["message"] != "hello" || first["pod"] != "web" || first["level"] != "info" {
		t.Fatalf("info line wrong: %v", first)
	}
	if second["error"] != "boom" || second["level"] != "error" || second["n"] != float64(3) {
		t.Fatalf("error line wrong: %v", second)
	}
}

func TestNewRejectsBadLevel(t *testing.T) {
	if _, err := New(nil, "loud", "json", nil); err == nil {
		t.Fatal("bad level accepted")
	}
}

type secretList struct {
	version uint64
	secrets []*v1.Secret
}

func (s *secretList) SecretsVersion() uint64             { return s.version }
func (s *secretList) ListSecrets() ([]*v1.Secret, error) { return s.secrets, nil }

// A secret value never reaches the log, in JSON or console form, through
// mqlet's own lines or klog's, and a secret stored later counts at once.
func TestLogLinesAreScrubbedOfSecretValues(t *testing.T) {
	for _, format := range []string{"json", "console"} {
		var buf bytes.Buffer
		src := &secretList{version: 1, secrets: []*v1.Secret{{StringData: map[string]string{"pw": "hunter2-first"}}}}
		var live redact.Live
		live.Bind(src)
		log, err := New(&buf, "info", format, live.Current)
		if err != nil {
			t.Fatal(err)
		}
		log.Info().Str("command", `exec: "hunter2-first": executable file not found`).Msg("start failed hunter2-first")
		src.secrets = append(src.secrets, &v1.Secret{Data: map[string][]byte{"tok": []byte(`tok"en-second`)}})
		src.version++
		log.Warn().Err(errors.New(`bad tok"en-second`)).Msg("pull")
		logr.New(&klogSink{log: log}).Info("klog says hunter2-first")
		out := buf.String()
		if strings.Contains(out, "hunter2-first") || strings.Contains(out, `tok"en-second`) || strings.Contains(out, `tok\"en-second`) {
			t.Fatalf("%s log holds a secret value:\n%s", format, out)
		}
		if strings.Count(out, redact.Placeholder) != 4 {
			t.Fatalf("%s log: want 4 placeholders, got:\n%s", format, out)
		}
		if format == "json" {
			for _, line := range bytes.Split(bytes.TrimSpace(buf.Bytes()), []byte("\n")) {
				if !json.Valid(line) {
					t.Fatalf("scrubbed line is not JSON: %s", line)
				}
			}
		}
	}
}

func TestLiveLevelChangesEveryDerivedLogger(t *testing.T) {
	var buf bytes.Buffer
	lvl, err := NewLevel("info")
	if err != nil {
		t.Fatal(err)
	}
	log := NewLive(&buf, lvl, "json", nil).With().Str("component", "x").Logger()
	log.Debug().Msg("hidden")
	if Enabled(&log, zerolog.DebugLevel) {
		t.Fatal("debug enabled at info")
	}
	if err := lvl.Set("debug"); err != nil {
		t.Fatal(err)
	}
	log.Debug().Msg("shown")
	if !Enabled(&log, zerolog.DebugLevel) {
		t.Fatal("debug not enabled at debug")
	}
	_ = lvl.Set("warn")
	log.Info().Msg("hidden too")
	log.Warn().Msg("warned")
	out := buf.String()
	if strings.Contains(out, "hidden") || !strings.Contains(out, `"message":"shown"`) || !strings.Contains(out, `"message":"warned"`) {
		t.Fatalf("log: %s", out)
	}
	if err := lvl.Set("loud"); err == nil {
		t.Fatal("a bad level was taken")
	}
	if err := lvl.Set(""); err == nil || lvl.Get() != zerolog.WarnLevel {
		t.Fatalf("empty level: %v, level %v", err, lvl.Get())
	}
}
