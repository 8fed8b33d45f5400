// Package crashout keeps the Go runtime's crash report (an unrecovered
// panic or a fatal error such as a concurrent map write or a stack
// overflow) in a file, so that the next start can tell a crash of mqlet's
// own code from an external SIGKILL (an operator's kill -9, the OOM
// killer, a power loss), which leaves no report, and can name the
// goroutine that crashed.
package crashout

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
)

// maxReport bounds what is read of a previous report: the header and the
// crashing goroutine come first.
const maxReport = 1 << 20

// Report is what the previous process left in the crash file.
type Report struct {
	// Text is the start of the report; empty when the previous process
	// did not crash (it stopped, or was killed from outside).
	Text string
}

// Crashed reports whether the previous process died of a Go crash.
func (r Report) Crashed() bool { return strings.TrimSpace(r.Text) != "" }

// Goroutines returns the id of the goroutine that crashed and of the one
// that created it (the Go traceback's "created by ... in goroutine N"),
// which is how a crash in a goroutine a pod's sync started is traced back
// to that sync. Ids that cannot be read are left out.
func (r Report) Goroutines() []uint64 {
	var ids []uint64
	sc := bufio.NewScanner(strings.NewReader(r.Text))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	inFirst := false
	for sc.Scan() {
		line := sc.Text()
		if id, ok := goroutineHeader(line); ok {
			if inFirst {
				break // the next goroutine's trace: the first one ended without a creator
			}
			ids, inFirst = append(ids, id), true
			continue
		}
		if !inFirst {
			continue
		}
		if rest, ok := strings.CutPrefix(line, "created by "); ok {
			if _, n, ok := strings.Cut(rest, " in goroutine "); ok {
				if id, err := strconv.ParseUint(strings.TrimSpace(n), 10, 64); err == nil {
					ids = append(ids, id)
				}
			}
			break
		}
		if line == "" {
			break // a goroutine's trace ends with a blank line
		}
	}
	return ids
}

// goroutineHeader reads "goroutine 17 [running]:".
func goroutineHeader(line string) (uint64, bool) {
	rest, ok := strings.CutPrefix(line, "goroutine ")
	if !ok {
		return 0, false
	}
	n, state, ok := strings.Cut(rest, " ")
	if !ok || !strings.HasPrefix(state, "[") {
		return 0, false
	}
	id, err := strconv.ParseUint(n, 10, 64)
	return id, err == nil
}

// Arm reads the report a previous process left at path (a copy stays at
// path+".last" for the operator), empties the file and makes it this
// process's crash output (runtime/debug.SetCrashOutput, which keeps its own
// descriptor; the report still goes to stderr too). Call it once, early.
func Arm(path string) (Report, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return Report{}, fmt.Errorf("open crash output %s: %w", path, err)
	}
	defer f.Close()
	raw, err := io.ReadAll(io.LimitReader(f, maxReport))
	if err != nil {
		return Report{}, fmt.Errorf("read crash output %s: %w", path, err)
	}
	r := Report{Text: string(raw)}
	if r.Crashed() {
		if err := os.WriteFile(path+".last", raw, 0o600); err != nil {
			return Report{}, fmt.Errorf("keep the last crash report: %w", err)
		}
	}
	if err := f.Truncate(0); err != nil {
		return Report{}, fmt.Errorf("empty crash output %s: %w", path, err)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return Report{}, fmt.Errorf("rewind crash output %s: %w", path, err)
	}
	if err := debug.SetCrashOutput(f, debug.CrashOptions{}); err != nil {
		return Report{}, fmt.Errorf("set crash output %s: %w", path, err)
	}
	return r, nil
}

// CurrentGoroutine returns the id of the calling goroutine, as tracebacks
// print it (Go offers no other way to read it; about a microsecond).
func CurrentGoroutine() uint64 {
	var buf [64]byte
	n := runtime.Stack(buf[:], false)
	id, _ := goroutineHeader(string(bytes.TrimSpace(buf[:n])))
	return id
}
