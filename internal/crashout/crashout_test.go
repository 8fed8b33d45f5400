package crashout

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

func TestGoroutines(t *testing.T) {
	for name, tc := range map[string]struct {
		text string
		want []uint64
	}{
		"none":                         {"", nil},
		"panic in a started goroutine": {"panic: boom\n\ngoroutine 35 [running]:\nmain.f()\n\t/x.go:3 +0x1\ncreated by main.g in goroutine 18\n\t/x.go:9 +0x2\n", []uint64{35, 18}},
		"fatal error, main goroutine":  {"fatal error: concurrent map writes\n\ngoroutine 1 [running]:\nmain.main()\n\t/x.go:3 +0x1\n\ngoroutine 7 [chan receive]:\ncreated by main.h in goroutine 1\n", []uint64{1}},
		"stack overflow":               {"runtime: goroutine stack exceeds 1000000000-byte limit\nfatal error: stack overflow\n\nruntime stack:\nruntime.throw()\n\ngoroutine 42 [running]:\nmain.r()\ncreated by main.s in goroutine 40\n", []uint64{42, 40}},
	} {
		t.Run(name, func(t *testing.T) {
			if got := (Report{Text: tc.text}).Goroutines(); !slices.Equal(got, tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
		})
	}
}

// TestArmKeepsTheCrashForTheNextStart runs this test binary as a child
// that arms the crash output and panics in a goroutine started by a
// goroutine whose id it prints; the next Arm reads the report, naming
// both, and empties the file.
func TestArmKeepsTheCrashForTheNextStart(t *testing.T) {
	path := os.Getenv("CRASHOUT_PATH")
	if os.Getenv("CRASHOUT_CHILD") == "1" {
		if _, err := Arm(path); err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() {
			os.Stdout.WriteString(strconv.FormatUint(CurrentGoroutine(), 10) + "\n")
			go func() { panic("crash for the test") }()
			<-done
		}()
		<-done
		return
	}
	path = filepath.Join(t.TempDir(), "crash")
	first, err := Arm(path)
	if err != nil {
		t.Fatal(err)
	}
	if first.Crashed() {
		t.Fatalf("a new file reads as a crash: %q", first.Text)
	}
	cmd := exec.Command(os.Args[0], "-test.run", "^TestArmKeepsTheCrashForTheNextStart$")
	cmd.Env = append(os.Environ(), "CRASHOUT_CHILD=1", "CRASHOUT_PATH="+path)
	out, err := cmd.Output()
	if _, ok := err.(*exec.ExitError); !ok {
		t.Fatalf("child did not crash: err %v, output %q", err, out)
	}
	creator, err := strconv.ParseUint(strings.TrimSpace(string(out)), 10, 64)
	if err != nil {
		t.Fatalf("child printed %q", out)
	}
	// Arming here also makes the file this test binary's crash output
	// (besides stderr), which is harmless.
	report, err := Arm(path)
	if err != nil {
		t.Fatal(err)
	}
	ids := report.Goroutines()
	if !report.Crashed() || len(ids) != 2 || ids[1] != creator || !strings.Contains(report.Text, "crash for the test") {
		t.Fatalf("report names goroutines %v (creator %d): %q", ids, creator, report.Text)
	}
	again, err := Arm(path)
	if err != nil {
		t.Fatal(err)
	}
	if again.Crashed() {
		t.Fatalf("the report was not cleared: %q", again.Text)
	}
	if last, err := os.ReadFile(path + ".last"); err != nil || string(last) != report.Text {
		t.Fatalf("the last report was not kept aside: %v", err)
	}
}

// BenchmarkCurrentGoroutine is the cost each pod sync pays to name its
// goroutine in its mark.
func BenchmarkCurrentGoroutine(b *testing.B) {
	for b.Loop() {
		if CurrentGoroutine() == 0 {
			b.Fatal("no goroutine id")
		}
	}
}
