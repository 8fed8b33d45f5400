package logging

import (
	"bytes"
	"encoding/json"
	"errors"
	"testing"

	"github.com/go-logr/logr"
	"github.com/rs/zerolog"
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
	if _, err := New(nil, "loud", "json"); err == nil {
		t.Fatal("bad level accepted")
	}
}
