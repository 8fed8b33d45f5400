// Package crilog reads a container's log file as CRI runtimes write it
// (one record a line: "<RFC 3339 time> <stdout|stderr> <P|F>[:tags] <text>",
// P marking a line the runtime split, F its last part; Docker's JSON lines
// are read too): the last N lines, from a time on, at most N bytes, with or
// without the time prefixed, and following the file while the container
// runs.
//
// It does what the kubelet's reader (k8s.io/cri-client/pkg/logs) does for
// mqlet. That package is not used because it imports the cri-client's
// remote runtime client, and with it OpenTelemetry and otelgrpc, which
// mqlet otherwise no longer links. One difference: a record longer than
// MaxRecordBytes (runtimes split lines at 16 KiB) is skipped, not held
// whole in memory.
package crilog

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"time"

	"github.com/fsnotify/fsnotify"
)

// MaxRecordBytes bounds one record (one line of the file) that is read; a
// longer one is skipped whole.
const MaxRecordBytes = 1 << 20

// recheck is how often a follow that saw no change of the file looks again
// (and asks whether the container still runs).
const recheck = time.Second

// Options selects what is read.
type Options struct {
	// TailLines: the last this many records (nil: all; 0: none).
	TailLines *int64
	// LimitBytes: stop after this many bytes written (nil: no limit).
	LimitBytes *int64
	// Since: records older than this are left out.
	Since time.Time
	// Timestamps prefixes each line with its time (RFC 3339, nanoseconds).
	Timestamps bool
	// Follow reads on past the end until the container stops or ctx ends.
	Follow bool
}

// Running says whether the container still runs; a follow asks it each
// time it reaches the end of the file, and stops after reading what is
// left once it says no.
type Running func(ctx context.Context) (bool, error)

const timeOut = "2006-01-02T15:04:05.000000000Z07:00"

type stream int

const (
	stdoutStream stream = iota
	stderrStream
)

type record struct {
	t      time.Time
	stream stream
	text   []byte
}

// parseCRI reads one CRI record; a partial (P) record loses its newline.
func parseCRI(line []byte, r *record) error {
	ts, rest, ok := bytes.Cut(line, []byte{' '})
	if !ok {
		return errors.New("no timestamp")
	}
	t, err := time.Parse(time.RFC3339Nano, string(ts))
	if err != nil {
		return fmt.Errorf("timestamp: %w", err)
	}
	name, rest, ok := bytes.Cut(rest, []byte{' '})
	if !ok {
		return errors.New("no stream")
	}
	switch string(name) {
	case "stdout":
		r.stream = stdoutStream
	case "stderr":
		r.stream = stderrStream
	default:
		return fmt.Errorf("unknown stream %q", name)
	}
	tags, text, ok := bytes.Cut(rest, []byte{' '})
	if !ok {
		return errors.New("no tag")
	}
	tag, _, _ := bytes.Cut(tags, []byte{':'})
	if string(tag) == "P" {
		text = bytes.TrimSuffix(text, []byte{'\n'})
	}
	r.t, r.text = t, text
	return nil
}

// parseJSON reads one record of Docker's json-file driver.
func parseJSON(line []byte, r *record) error {
	var l struct {
		Log    string    `json:"log"`
		Stream string    `json:"stream"`
		Time   time.Time `json:"time"`
	}
	if err := json.Unmarshal(line, &l); err != nil {
		return err
	}
	switch l.Stream {
	case "stdout":
		r.stream = stdoutStream
	case "stderr":
		r.stream = stderrStream
	default:
		return fmt.Errorf("unknown stream %q", l.Stream)
	}
	r.t, r.text = l.Time, []byte(l.Log)
	return nil
}

// writer applies Since, Timestamps and LimitBytes.
type writer struct {
	out       [2]io.Writer
	opts      *Options
	remain    int64
	lineStart bool // the next record begins a line (the last one ended with \n)
}

var errLimit = errors.New("byte limit reached")

func (w *writer) write(r *record) error {
	prefix := w.opts.Timestamps && w.lineStart
	w.lineStart = len(r.text) == 0 || r.text[len(r.text)-1] == '\n'
	if r.t.Before(w.opts.Since) {
		return nil
	}
	line := r.text
	if prefix {
		line = append(append([]byte(r.t.Format(timeOut)), ' '), line...)
	}
	if int64(len(line)) > w.remain {
		line = line[:w.remain]
	}
	out := w.out[r.stream]
	if out == nil {
		return nil
	}
	n, err := out.Write(line)
	w.remain -= int64(n)
	switch {
	case err != nil:
		return err
	case n < len(line):
		return io.ErrShortWrite
	case w.remain <= 0:
		return errLimit
	}
	return nil
}

// tailStart is the offset of the n-th record from the end of f (0 when n
// is negative or the file holds fewer); a last record without its newline
// does not count.
func tailStart(f io.ReadSeeker, n int64) (int64, error) {
	if n < 0 {
		return 0, nil
	}
	size, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		return 0, err
	}
	const block = 4096
	buf := make([]byte, block)
	var seen int64
	for end := size; end > 0; {
		start := max(end-block, 0)
		chunk := buf[:end-start]
		if _, err := f.Seek(start, io.SeekStart); err != nil {
			return 0, err
		}
		if _, err := io.ReadFull(f, chunk); err != nil {
			return 0, err
		}
		for i := len(chunk) - 1; i >= 0; i-- {
			if chunk[i] != '\n' {
				continue
			}
			seen++
			if seen > n {
				return start + int64(i) + 1, nil
			}
		}
		end = start
	}
	return 0, nil
}

// lineReader reads records of at most MaxRecordBytes, skipping longer ones.
type lineReader struct {
	r    *bufio.Reader
	line []byte
}

// next returns the next whole record (with its newline), or what is left
// at the end of the file with io.EOF.
func (l *lineReader) next() ([]byte, error) {
	l.line = l.line[:0]
	skipping := false
	for {
		frag, err := l.r.ReadSlice('\n')
		if !skipping {
			if len(l.line)+len(frag) > MaxRecordBytes {
				skipping, l.line = true, l.line[:0]
			} else {
				l.line = append(l.line, frag...)
			}
		}
		switch {
		case err == nil && skipping:
			skipping = false // the over-long record ended: read the next
		case err == nil:
			return l.line, nil
		case errors.Is(err, bufio.ErrBufferFull):
		default:
			if skipping {
				// An over-long record the runtime is still writing.
				return nil, err
			}
			return l.line, err
		}
	}
}

// Read writes the records of the log file at path to stdout and stderr by
// their stream (a nil writer leaves that stream out). running is asked
// only when opts.Follow.
func Read(ctx context.Context, path string, opts Options, running Running, stdout, stderr io.Writer) error {
	path, err := filepath.EvalSymlinks(path)
	if err != nil {
		return fmt.Errorf("resolve log file %q: %w", path, err)
	}
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("open log file %q: %w", path, err)
	}
	defer func() { f.Close() }()
	tail := int64(-1)
	if opts.TailLines != nil {
		tail = *opts.TailLines
	}
	start, err := tailStart(f, tail)
	if err != nil {
		return fmt.Errorf("find the last %d lines of log file %q: %w", tail, path, err)
	}
	if _, err := f.Seek(start, io.SeekStart); err != nil {
		return fmt.Errorf("seek log file %q: %w", path, err)
	}
	left := int64(math.MaxInt64) // records still wanted (TailLines without Follow)
	if opts.TailLines != nil && !opts.Follow {
		left = tail
	}
	w := &writer{out: [2]io.Writer{stdout, stderr}, opts: &opts, remain: math.MaxInt64, lineStart: true}
	if opts.LimitBytes != nil {
		w.remain = *opts.LimitBytes
	}
	lr := &lineReader{r: bufio.NewReaderSize(f, 64<<10)}
	var parse func([]byte, *record) error
	var watcher *fsnotify.Watcher
	defer func() {
		if watcher != nil {
			watcher.Close()
		}
	}()
	alive := true // the container ran at the last look
	var rec record
	for left > 0 {
		line, err := lr.next()
		last := false
		if err != nil {
			if !errors.Is(err, io.EOF) {
				return fmt.Errorf("read log file %q: %w", path, err)
			}
			if !opts.Follow {
				// What is left without a newline is the last record.
				if len(line) == 0 {
					return nil
				}
				last = true
			} else {
				if !alive {
					return nil
				}
				// An unfinished record is read again once it is whole.
				if _, err := f.Seek(-int64(len(line)), io.SeekCurrent); err != nil {
					return fmt.Errorf("seek log file %q: %w", path, err)
				}
				lr.r.Reset(f)
				if watcher == nil {
					if watcher, err = fsnotify.NewWatcher(); err != nil {
						return fmt.Errorf("watch log file %q: %w", path, err)
					}
					if err := watcher.Add(filepath.Dir(path)); err != nil {
						return fmt.Errorf("watch log directory of %q: %w", path, err)
					}
					continue // written before the watch began?
				}
				var reopen bool
				alive, reopen, err = wait(ctx, filepath.Base(path), watcher, running)
				if err != nil {
					return err
				}
				// A file made anew before the watch began sent no event.
				reopen = reopen || replaced(f, path)
				if reopen {
					nf, err := os.Open(path)
					switch {
					case errors.Is(err, os.ErrNotExist):
					case err != nil:
						return fmt.Errorf("open log file %q: %w", path, err)
					default:
						f.Close()
						f = nf
						lr.r.Reset(f)
					}
				}
				continue
			}
		}
		if parse == nil {
			switch {
			case parseCRI(line, &record{}) == nil:
				parse = parseCRI
			case parseJSON(line, &record{}) == nil:
				parse = parseJSON
			default:
				return fmt.Errorf("log file %q: unsupported format: %q", path, truncate(line))
			}
		}
		rec = record{}
		if err := parse(line, &rec); err == nil {
			if err := w.write(&rec); err != nil {
				if errors.Is(err, errLimit) {
					return nil
				}
				return fmt.Errorf("write log of %q: %w", path, err)
			}
			left--
		}
		if last {
			return nil
		}
	}
	return nil
}

// replaced says whether path now names another file than f.
func replaced(f *os.File, path string) bool {
	a, err := f.Stat()
	if err != nil {
		return false
	}
	b, err := os.Stat(path)
	return err == nil && !os.SameFile(a, b)
}

func truncate(b []byte) []byte {
	if len(b) > 80 {
		return b[:80]
	}
	return b
}

// wait waits for the log to change. alive is false when the container no
// longer runs (the caller reads what is left, then stops); reopen is true
// when a file of the log's name was created anew.
func wait(ctx context.Context, name string, w *fsnotify.Watcher, running Running) (alive, reopen bool, err error) {
	if running != nil {
		ok, err := running(ctx)
		if err != nil || !ok {
			return false, false, err
		}
	}
	timer := time.NewTimer(recheck)
	defer timer.Stop()
	tries := 5
	for {
		select {
		case <-ctx.Done():
			return false, false, ctx.Err()
		case e, ok := <-w.Events:
			if !ok {
				return false, false, errors.New("log watch closed")
			}
			if e.Has(fsnotify.Create) {
				return true, filepath.Base(e.Name) == name, nil
			}
			if e.Op != 0 {
				return true, false, nil
			}
		case err, ok := <-w.Errors:
			if !ok {
				return false, false, errors.New("log watch closed")
			}
			if tries == 0 {
				return false, false, fmt.Errorf("watch log: %w", err)
			}
			tries--
		case <-timer.C:
			return true, false, nil
		}
	}
}
