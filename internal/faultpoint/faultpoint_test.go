package faultpoint

import (
	"os"
	"os/exec"
	"syscall"
	"testing"
)

func TestParse(t *testing.T) {
	got := parse(" a, b@3 ,c@0,d@x,,e@1,f!panic,g@2!panic")
	want := map[string]int64{"a": 1, "b": 3, "e": 1, "f": 1, "g": 2}
	if len(got) != len(want) {
		t.Fatalf("parsed %d points, want %d: %v", len(got), len(want), got)
	}
	for name, at := range want {
		if p, ok := got[name]; !ok || p.at != at || p.panic != (name == "f" || name == "g") {
			t.Fatalf("point %s: got %+v, want at %d", name, p, at)
		}
	}
}

// TestHitKillsAtTheNthTime runs this test binary as a child that hits a
// point three times with the point armed at its second hit: the child must
// die of SIGKILL after printing exactly one line.
func TestHitKillsAtTheNthTime(t *testing.T) {
	if os.Getenv("FAULTPOINT_CHILD") == "1" {
		for i := 1; i <= 3; i++ {
			Hit("p")
			os.Stdout.WriteString("survived " + string(rune('0'+i)) + "\n")
		}
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run", "^TestHitKillsAtTheNthTime$")
	cmd.Env = append(os.Environ(), "FAULTPOINT_CHILD=1", Env+"=other,p@2")
	out, err := cmd.Output()
	ee, ok := err.(*exec.ExitError)
	if !ok {
		t.Fatalf("child did not die: err %v, output %q", err, out)
	}
	ws := ee.Sys().(syscall.WaitStatus)
	if !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("child ended with %v, want SIGKILL", ws)
	}
	if string(out) != "survived 1\n" {
		t.Fatalf("child printed %q, want only the first hit's line", out)
	}
}

func TestUnarmedHitReturns(t *testing.T) {
	Hit("not-listed") // must return
	if Armed() && os.Getenv(Env) == "" {
		t.Fatal("armed without the variable")
	}
}
