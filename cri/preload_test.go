package cri

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

type nodeEvents []string

func (n *nodeEvents) NodeEvent(eventType, reason, message string) {
	*n = append(*n, reason+": "+message)
}

func TestPreloaderImportsEachFileOnceWhenSettled(t *testing.T) {
	dir := t.TempDir()
	var ev nodeEvents
	p := NewPreloader(PreloadConfig{Dir: dir}, &ev, zerolog.Nop())
	var calls []string
	p.run = func(ctx context.Context, name string, args ...string) ([]byte, error) {
		file := args[len(args)-1]
		calls = append(calls, filepath.Base(file))
		if strings.HasSuffix(file, "bad.tar") {
			return []byte("ctr: unrecognized image format"), errors.New("exit status 1")
		}
		return []byte("unpacking docker.io/x/" + filepath.Base(file) + ":1 (sha256:abc)...done\n"), nil
	}
	old := time.Now().Add(-time.Minute)
	for _, n := range []string{"a.tar", "b.tar.gz", "bad.tar", "notes.txt"} {
		f := filepath.Join(dir, n)
		if err := os.WriteFile(f, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
		_ = os.Chtimes(f, old, old)
	}
	if err := os.Symlink("/etc/passwd", filepath.Join(dir, "link.tar")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "fresh.tar"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	p.scan(context.Background(), "/run/c.sock", now)
	p.scan(context.Background(), "/run/c.sock", now) // nothing changed: nothing again
	if got := strings.Join(calls, ","); got != "a.tar,b.tar.gz,bad.tar" {
		t.Fatalf("imported %s", got)
	}
	p.scan(context.Background(), "/run/c.sock", now.Add(time.Minute)) // fresh.tar has settled
	if got := strings.Join(calls, ","); got != "a.tar,b.tar.gz,bad.tar,fresh.tar" {
		t.Fatalf("imported %s", got)
	}
	if len(ev) != 4 || !strings.HasPrefix(ev[0], "ImagePreloaded: Imported docker.io/x/a.tar:1 from ") || !strings.HasPrefix(ev[2], "ImagePreloadFailed: ") {
		t.Fatalf("events %q", ev)
	}
}
