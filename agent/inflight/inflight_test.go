package inflight

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
)

func TestMarksSurviveReopenUntilReset(t *testing.T) {
	path := filepath.Join(t.TempDir(), "marks")
	f, err := Open(path, 3)
	if err != nil {
		t.Fatal(err)
	}
	if len(f.Left()) != 0 {
		t.Fatalf("a new file has leftovers: %v", f.Left())
	}
	if err := f.Reset(); err != nil {
		t.Fatal(err)
	}
	must(t, f.Set(0, "apply req-1"))
	must(t, f.Set(2, "ns/web"))
	must(t, f.Set(1, "ns/done"))
	must(t, f.Clear(1))
	// The process "dies": the file is reopened without clearing anything.
	must(t, f.Close())
	g, err := Open(path, 2)
	if err != nil {
		t.Fatal(err)
	}
	if got := g.Left(); !slices.Equal(got, []string{"apply req-1", "ns/web"}) {
		t.Fatalf("leftovers %q, want the two marks not cleared", got)
	}
	// Not reset yet: a second crash finds them again.
	must(t, g.Close())
	g, err = Open(path, 2)
	if err != nil {
		t.Fatal(err)
	}
	if len(g.Left()) != 2 {
		t.Fatalf("leftovers lost before Reset: %q", g.Left())
	}
	must(t, g.Reset())
	must(t, g.Close())
	h, err := Open(path, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if len(h.Left()) != 0 {
		t.Fatalf("leftovers after Reset: %q", h.Left())
	}
}

func TestTornOrForeignSlotsReadAsEmpty(t *testing.T) {
	path := filepath.Join(t.TempDir(), "marks")
	f, err := Open(path, 2)
	if err != nil {
		t.Fatal(err)
	}
	must(t, f.Set(0, "apply good"))
	must(t, f.Set(1, "apply torn"))
	must(t, f.Close())
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	raw[SlotSize+5] ^= 0xff // a byte of slot 1's value changed, as a torn write would
	must(t, os.WriteFile(path, raw, 0o600))
	g, err := Open(path, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if got := g.Left(); !slices.Equal(got, []string{"apply good"}) {
		t.Fatalf("leftovers %q, want only the intact slot", got)
	}
	if err := g.Set(0, strings.Repeat("x", MaxValue+1)); err == nil {
		t.Fatal("a value longer than a slot was accepted")
	}
	if err := g.Set(2, "x"); err == nil {
		t.Fatal("a slot out of range was accepted")
	}
}

// TestMarkSurvivesSIGKILL kills a real process right after it sets a mark
// (no fsync, no close) and checks that the next open sees it.
func TestMarkSurvivesSIGKILL(t *testing.T) {
	if path := os.Getenv("INFLIGHT_TEST_CHILD"); path != "" {
		f, err := Open(path, 1)
		if err != nil {
			os.Exit(3)
		}
		if err := f.Set(0, "apply killed"); err != nil {
			os.Exit(4)
		}
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {}
	}
	path := filepath.Join(t.TempDir(), "marks")
	cmd := exec.Command(os.Args[0], "-test.run", "^TestMarkSurvivesSIGKILL$")
	cmd.Env = append(os.Environ(), "INFLIGHT_TEST_CHILD="+path)
	err := cmd.Run()
	ee, ok := err.(*exec.ExitError)
	if !ok || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("child did not die of SIGKILL: %v", err)
	}
	f, err := Open(path, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if got := f.Left(); !slices.Equal(got, []string{"apply killed"}) {
		t.Fatalf("after SIGKILL the mark reads %q", got)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// BenchmarkMark measures one mark and clear (a command's cost), as shipped
// (pwrite only) and with an fsync after each write for comparison.
func BenchmarkMark(b *testing.B) {
	for _, sync := range []bool{false, true} {
		name := "pwrite"
		if sync {
			name = "pwrite+fsync"
		}
		b.Run(name, func(b *testing.B) {
			f, err := Open(filepath.Join(b.TempDir(), "marks"), 4)
			if err != nil {
				b.Fatal(err)
			}
			defer f.Close()
			for b.Loop() {
				if err := f.Set(1, "apply req-0123456789"); err != nil {
					b.Fatal(err)
				}
				if sync {
					_ = f.f.Sync()
				}
				if err := f.Clear(1); err != nil {
					b.Fatal(err)
				}
				if sync {
					_ = f.f.Sync()
				}
			}
		})
	}
}
