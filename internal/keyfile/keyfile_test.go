package keyfile

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestCreateThenRead(t *testing.T) {
	path := filepath.Join(t.TempDir(), "k")
	if err := Create(path, "the test key file", []byte("secret")); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v (%v), want 0600", st.Mode().Perm(), err)
	}
	got, err := Read(path, "the test key file", 6)
	if err != nil || string(got) != "secret" {
		t.Fatalf("Read = %q, %v", got, err)
	}
	if err := Create(path, "the test key file", []byte("other")); err == nil {
		t.Fatal("Create replaced an existing key file")
	}
	if got, _ := Read(path, "the test key file", 6); string(got) != "secret" {
		t.Fatalf("the key file changed to %q", got)
	}
}

func TestReadRefuses(t *testing.T) {
	dir := t.TempDir()
	if _, err := Read(filepath.Join(dir, "none"), "the test key file", 8); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("missing file: %v, want fs.ErrNotExist", err)
	}
	loose := filepath.Join(dir, "loose")
	if err := os.WriteFile(loose, []byte("k"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Read(loose, "the test key file", 8); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Fatalf("a file others may read: %v, want refused", err)
	}
	big := filepath.Join(dir, "big")
	if err := os.WriteFile(big, []byte("123456789"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Read(big, "the test key file", 8); err == nil || !strings.Contains(err.Error(), "larger than 8") {
		t.Fatalf("an oversized file: %v, want refused", err)
	}
}
