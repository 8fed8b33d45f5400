package crilog

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func ptr(n int64) *int64 { return &n }

// A log as containerd writes it: a split line (P then F), both streams.
const criLog = `2026-12-06T10:00:00.000000001Z stdout F one
2026-12-06T10:00:01.000000000Z stderr F two
2026-12-06T10:00:02.5Z stdout P thr
2026-12-06T10:00:02.6Z stdout F ee
2026-12-06T10:00:03Z stdout F four
`

func writeLog(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "0.log")
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestRead(t *testing.T) {
	since := time.Date(2026, 12, 6, 10, 0, 2, 0, time.UTC)
	for _, tc := range []struct {
		name       string
		log        string
		opts       Options
		out, err   string
		noStderr   bool
		wantErrMsg string
	}{
		{name: "all", log: criLog, opts: Options{}, out: "one\nthree\nfour\n", err: "two\n"},
		{name: "tail 2 (a split line is two records)", log: criLog, opts: Options{TailLines: ptr(2)}, out: "ee\nfour\n"},
		{name: "tail 0", log: criLog, opts: Options{TailLines: ptr(0)}},
		{name: "tail beyond the file", log: criLog, opts: Options{TailLines: ptr(100)}, out: "one\nthree\nfour\n", err: "two\n"},
		{name: "limit bytes cuts a line", log: criLog, opts: Options{LimitBytes: ptr(9)}, out: "one\nt", err: "two\n"},
		{name: "since", log: criLog, opts: Options{Since: since}, out: "three\nfour\n"},
		{name: "timestamps once per line", log: criLog, opts: Options{Timestamps: true, TailLines: ptr(3)},
			out: "2026-12-06T10:00:02.500000000Z three\n2026-12-06T10:00:03.000000000Z four\n"},
		{name: "stderr not asked", log: criLog, opts: Options{}, out: "one\nthree\nfour\n", noStderr: true},
		{name: "last line without newline", log: criLog + "2026-12-06T10:00:04Z stdout P five", opts: Options{}, out: "one\nthree\nfour\nfive", err: "two\n"},
		{name: "tags after the P/F", log: "2026-12-06T10:00:00Z stdout F:x:y hello\n", opts: Options{}, out: "hello\n"},
		{name: "bad records are skipped", log: "2026-12-06T10:00:00Z stdout F a\nnot a record\n2026-12-06T10:00:01Z stdin F b\n2026-12-06T10:00:02Z stdout F c\n", opts: Options{}, out: "a\nc\n"},
		{name: "docker json", log: `{"log":"a\n","stream":"stdout","time":"2026-12-06T10:00:00Z"}` + "\n" + `{"log":"b\n","stream":"stderr","time":"2026-12-06T10:00:01Z"}` + "\n", opts: Options{}, out: "a\n", err: "b\n"},
		{name: "unknown format", log: "hello world\n", wantErrMsg: "unsupported format"},
		{name: "empty", log: "", opts: Options{TailLines: ptr(5)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			var stderr io.Writer = &errOut
			if tc.noStderr {
				stderr = nil
			}
			err := Read(context.Background(), writeLog(t, tc.log), tc.opts, nil, &out, stderr)
			if tc.wantErrMsg != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErrMsg) {
					t.Fatalf("err = %v, want %q", err, tc.wantErrMsg)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if out.String() != tc.out || errOut.String() != tc.err {
				t.Errorf("stdout %q stderr %q, want %q and %q", out.String(), errOut.String(), tc.out, tc.err)
			}
		})
	}
}

func TestReadMissingFile(t *testing.T) {
	err := Read(context.Background(), filepath.Join(t.TempDir(), "none.log"), Options{}, nil, &bytes.Buffer{}, &bytes.Buffer{})
	if !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("err = %v, want not exist", err)
	}
}

// A record over MaxRecordBytes is skipped whole; the reader holds no more
// than that bound of it.
func TestReadSkipsOverlongRecord(t *testing.T) {
	long := "2026-12-06T10:00:00Z stdout F " + strings.Repeat("x", MaxRecordBytes) + "\n"
	log := "2026-12-06T10:00:00Z stdout F a\n" + long + "2026-12-06T10:00:01Z stdout F b\n"
	var out bytes.Buffer
	if err := Read(context.Background(), writeLog(t, log), Options{}, nil, &out, nil); err != nil {
		t.Fatal(err)
	}
	if out.String() != "a\nb\n" {
		t.Fatalf("out = %.40q, want a, b", out.String())
	}
}

// syncBuffer is a bytes.Buffer the follower writes while the test reads.
type syncBuffer struct {
	ch chan string
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.ch <- string(p)
	return len(p), nil
}

// Follow: lines written while the container runs arrive; a half-written
// record arrives once whole; once the container stops, what is left is
// read and the follow ends by itself.
func TestReadFollow(t *testing.T) {
	p := writeLog(t, "2026-12-06T10:00:00Z stdout F before\n")
	var running atomic.Bool
	running.Store(true)
	var asked atomic.Int32
	out := &syncBuffer{ch: make(chan string, 16)}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- Read(ctx, p, Options{Follow: true, TailLines: ptr(1)}, func(context.Context) (bool, error) {
			asked.Add(1)
			return running.Load(), nil
		}, out, out)
	}()
	expect := func(want string) {
		t.Helper()
		select {
		case got := <-out.ch:
			if got != want {
				t.Fatalf("got %q, want %q", got, want)
			}
		case <-ctx.Done():
			t.Fatalf("no %q", want)
		}
	}
	expect("before\n")
	f, err := os.OpenFile(p, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fmt.Fprint(f, "2026-12-06T10:00:01Z stdout F af")
	fmt.Fprint(f, "ter\n")
	expect("after\n")
	running.Store(false)
	fmt.Fprint(f, "2026-12-06T10:00:02Z stderr F last\n")
	expect("last\n")
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-ctx.Done():
		t.Fatal("the follow did not end after the container stopped")
	}
	if asked.Load() == 0 {
		t.Fatal("the follow never asked whether the container runs")
	}
}

// A follow ends with ctx, with ctx's error.
func TestReadFollowEndsWithContext(t *testing.T) {
	p := writeLog(t, criLog)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	var out bytes.Buffer
	err := Read(ctx, p, Options{Follow: true}, func(context.Context) (bool, error) { return true, nil }, &out, &out)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want the deadline", err)
	}
	if !strings.HasPrefix(out.String(), "one\ntwo\n") {
		t.Fatalf("out = %q", out.String())
	}
}

// A file of the log's name made anew (rotation by create) is followed.
func TestReadFollowReopens(t *testing.T) {
	p := writeLog(t, "2026-12-06T10:00:00Z stdout F old\n")
	out := &syncBuffer{ch: make(chan string, 16)}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	go func() {
		_ = Read(ctx, p, Options{Follow: true}, func(context.Context) (bool, error) { return true, nil }, out, out)
	}()
	if got := <-out.ch; got != "old\n" {
		t.Fatalf("got %q", got)
	}
	tmp := p + ".new"
	if err := os.WriteFile(tmp, []byte("2026-12-06T10:00:01Z stdout F new\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// Replacing the file is a Create of the log's name in its directory;
	// one made before the reader watches is found by its periodic look.
	if err := os.Rename(tmp, p); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-out.ch:
		if got != "new\n" {
			t.Fatalf("got %q, want the new file's line", got)
		}
	case <-ctx.Done():
		t.Fatal("the new file was not followed")
	}
}
