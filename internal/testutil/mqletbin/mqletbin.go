// Package mqletbin finds the mqlet binary for tests that run it as a
// process: $MQLET_TEST_BIN_DIR/mqlet when set (make test builds it once for
// every package), else one built once per test binary.
package mqletbin

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

// EnvDir names the directory that holds a prebuilt mqlet.
const EnvDir = "MQLET_TEST_BIN_DIR"

var (
	once sync.Once
	path string
	err  error
)

// Path returns the mqlet binary, failing t when there is none and it cannot
// be built.
func Path(t testing.TB) string {
	t.Helper()
	once.Do(func() { path, err = locate() })
	if err != nil {
		t.Fatalf("mqlet binary: %v", err)
	}
	return path
}

func locate() (string, error) {
	if dir := os.Getenv(EnvDir); dir != "" {
		p := filepath.Join(dir, "mqlet")
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("prebuilt mqlet: %w", err)
		}
		return p, nil
	}
	dir, err := os.MkdirTemp("", "mqlet-test-bin")
	if err != nil {
		return "", fmt.Errorf("making a dir for the mqlet build: %w", err)
	}
	p := filepath.Join(dir, "mqlet")
	if out, err := exec.Command("go", "build", "-tags", "grpcnotrace", "-o", p, "github.com/mqlet/mqlet/cmd/mqlet").CombinedOutput(); err != nil {
		return "", fmt.Errorf("building mqlet: %w: %s", err, out)
	}
	return p, nil
}
