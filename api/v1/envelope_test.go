package apiv1

import (
	"testing"
	"time"
)

func TestEnvelopeRoundTripAndBounds(t *testing.T) {
	exp := time.Date(2026, 1, 1, 0, 10, 0, 0, time.UTC)
	b, err := WrapEnvelope([]byte("kind: Pod\n"), exp)
	if err != nil {
		t.Fatal(err)
	}
	body, got, err := OpenEnvelope(b)
	if err != nil || string(body) != "kind: Pod\n" || !got.Equal(exp) {
		t.Fatalf("OpenEnvelope = %q, %s, %v", body, got, err)
	}
	plain := []byte(`{"apiVersion":"v1","kind":"Pod"}`)
	if body, got, err := OpenEnvelope(plain); err != nil || string(body) != string(plain) || !got.IsZero() {
		t.Fatalf("a manifest: %q, %s, %v; want it back unchanged", body, got, err)
	}
	for _, bad := range []string{
		`{"apiVersion":"mqlet.io/v1","kind":"CommandEnvelope","body":"eA=="}`,
		`{"apiVersion":"mqlet.io/v1","kind":"CommandEnvelope","expires":"2026-01-01T00:00:00Z","body":"eA==","x":1}`,
		`{"apiVersion":"mqlet.io/v1","kind":"CommandEnvelope","expires":"soon","body":"eA=="}`,
		`{"apiVersion":"mqlet.io/v1","kind":"CommandEnvelope","expires":"2026-01-01T00:00:00Z","body":"eA=="} {}`,
	} {
		if _, _, err := OpenEnvelope([]byte(bad)); err == nil {
			t.Errorf("OpenEnvelope(%s): want an error", bad)
		}
	}
}
