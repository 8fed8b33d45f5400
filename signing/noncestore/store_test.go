package noncestore

import (
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/mqlet/mqlet/signing"
)

var t0 = time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)

func TestNoncesArePrunedAfterTheirTimeAndBounded(t *testing.T) {
	path := filepath.Join(t.TempDir(), "nonces.db")
	s, err := Open(path, 2)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Use("k", "n1", t0.Add(time.Minute), t0); err != nil {
		t.Fatal(err)
	}
	if err := s.Use("k", "n1", t0.Add(time.Minute), t0); !errors.Is(err, signing.ErrReplayed) {
		t.Fatalf("second use: %v, want ErrReplayed", err)
	}
	if err := s.Use("other", "n1", t0.Add(time.Minute), t0); err != nil {
		t.Fatalf("same nonce of another key: %v", err)
	}
	// Full: two unexpired nonces kept; a third is refused, not evicting one.
	if err := s.Use("k", "n3", t0.Add(time.Minute), t0); !errors.Is(err, ErrFull) {
		t.Fatalf("third nonce with max 2: %v, want ErrFull", err)
	}
	if err := s.Use("k", "n1", t0.Add(time.Minute), t0); !errors.Is(err, signing.ErrReplayed) {
		t.Fatalf("a full store forgot n1: %v", err)
	}
	// After their keep-until, both are pruned and room is made.
	later := t0.Add(2 * time.Minute)
	if err := s.Use("k", "n3", later.Add(time.Minute), later); err != nil {
		t.Fatalf("after expiry: %v", err)
	}
	if s.Count() != 1 {
		t.Fatalf("count %d after pruning, want 1", s.Count())
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, err = Open(path, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.Count() != 1 {
		t.Fatalf("count %d after reopening, want 1", s.Count())
	}
	if err := s.Use("k", "n3", later.Add(time.Minute), later); !errors.Is(err, signing.ErrReplayed) {
		t.Fatalf("n3 after reopening: %v, want ErrReplayed", err)
	}
	if n, err := s.Prune(later.Add(time.Hour)); err != nil || n != 1 || s.Count() != 0 {
		t.Fatalf("prune: %d, %v, count %d", n, err, s.Count())
	}
}
