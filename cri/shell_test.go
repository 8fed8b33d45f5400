package cri

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
)

// syncBuffer is a bytes.Buffer safe for one writer and one reader.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) write(p []byte) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf.Write(p)
	return nil
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestExecInteractiveTerminal runs a shell with a terminal through the
// runtime's streaming server: input reaches it, its output comes back, a
// resize shows in stty size, and its exit code is returned.
func TestExecInteractiveTerminal(t *testing.T) {
	e := newEnv(t)
	pod := e.newPod(v1.RestartPolicyAlways, sleeper("c"))
	e.syncUntil(pod, 30*time.Second, "running", isRunning("c"))
	stdin := make(chan []byte, 4)
	resize := make(chan TermSize, 1)
	var out syncBuffer
	ctx, cancel := context.WithTimeout(e.ctx, 30*time.Second)
	defer cancel()
	type result struct {
		code int
		err  error
	}
	done := make(chan result, 1)
	go func() {
		code, err := e.m.ExecInteractive(ctx, PodKey{UID: string(pod.UID), Name: pod.Name, Namespace: pod.Namespace}, "c", []string{"sh"}, TermSize{Cols: 80, Rows: 24}, ShellIO{Stdin: stdin, Resize: resize, Stdout: out.write})
		done <- result{code, err}
	}()
	waitFor := func(what string) {
		t.Helper()
		for !strings.Contains(out.String(), what) {
			select {
			case r := <-done:
				t.Fatalf("ended (%d, %v) before %q; output %q", r.code, r.err, what, out.String())
			case <-ctx.Done():
				t.Fatalf("no %q in the output: %q", what, out.String())
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	stdin <- []byte("echo hel''lo; stty size\n")
	waitFor("hello")
	waitFor("24 80")
	resize <- TermSize{Cols: 100, Rows: 40}
	stdin <- []byte("stty size\n")
	waitFor("40 100")
	stdin <- []byte("exit 3\n")
	r := <-done
	if r.err != nil || r.code != 3 {
		t.Fatalf("ExecInteractive = %d, %v; want 3, nil (output %q)", r.code, r.err, out.String())
	}
}
