// Package eventlog keeps the node's last events in the state dir, for
// get {"kind":"Event"}: an append-only file of JSON lines, compacted to the
// newest Max when it holds twice as many. A repeated event (the recorder
// counts repeats under one name) replaces its earlier entry.
package eventlog

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync"

	"github.com/rs/zerolog"
	v1 "k8s.io/api/core/v1"
)

// maxLineBytes bounds one stored event (the recorder bounds messages far
// below it); longer lines are skipped when reading.
const maxLineBytes = 256 << 10

// Log is the persisted event history.
type Log struct {
	path string
	max  int
	log  zerolog.Logger

	mu    sync.Mutex
	f     *os.File
	lines int // lines in the file
	ring  []*v1.Event
}

// Open reads the history at path, keeping the newest max events.
func Open(path string, max int, log zerolog.Logger) (*Log, error) {
	l := &Log{path: path, max: max, log: log}
	if max <= 0 {
		return l, nil
	}
	f, err := os.Open(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return nil, fmt.Errorf("reading event history: %w", err)
	default:
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 64<<10), maxLineBytes)
		for sc.Scan() {
			var ev v1.Event
			if json.Unmarshal(sc.Bytes(), &ev) == nil {
				l.keep(&ev)
			}
		}
		f.Close()
		if err := sc.Err(); err != nil {
			log.Warn().Err(err).Msg("event history partly unreadable; keeping what was read")
		}
	}
	if err := l.compactLocked(); err != nil {
		return nil, err
	}
	return l, nil
}

// keep puts ev last, replacing an earlier entry of the same name.
func (l *Log) keep(ev *v1.Event) {
	for i, e := range l.ring {
		if e.Name == ev.Name && e.Namespace == ev.Namespace {
			l.ring = append(l.ring[:i], l.ring[i+1:]...)
			break
		}
	}
	l.ring = append(l.ring, ev)
	if len(l.ring) > l.max {
		l.ring = l.ring[len(l.ring)-l.max:]
	}
}

// Add records one event (as published).
func (l *Log) Add(ev *v1.Event) {
	if l.max <= 0 {
		return
	}
	b, err := json.Marshal(ev)
	if err != nil || len(b) >= maxLineBytes {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.keep(ev.DeepCopy())
	if l.f == nil {
		return
	}
	// Not synced: losing the last events in a power cut is acceptable;
	// an fsync per event in a storm is not.
	if _, err := l.f.Write(append(b, '\n')); err != nil {
		l.log.Warn().Err(err).Msg("writing event history")
		return
	}
	l.lines++
	if l.lines > 2*l.max {
		if err := l.compactLocked(); err != nil {
			l.log.Warn().Err(err).Msg("compacting event history")
		}
	}
}

// compactLocked rewrites the file with the ring only and reopens it for
// appending.
func (l *Log) compactLocked() error {
	if l.f != nil {
		l.f.Close()
		l.f = nil
	}
	tmp := l.path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("writing event history: %w", err)
	}
	w := bufio.NewWriter(f)
	for _, ev := range l.ring {
		b, err := json.Marshal(ev)
		if err == nil {
			w.Write(append(b, '\n'))
		}
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return fmt.Errorf("writing event history: %w", err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("writing event history: %w", err)
	}
	f.Close()
	if err := os.Rename(tmp, l.path); err != nil {
		return fmt.Errorf("writing event history: %w", err)
	}
	l.f, err = os.OpenFile(l.path, os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("opening event history: %w", err)
	}
	l.lines = len(l.ring)
	return nil
}

// List returns the kept events that match (nil: all), oldest first.
func (l *Log) List(match func(*v1.Event) bool) []*v1.Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := []*v1.Event{}
	for _, ev := range l.ring {
		if match == nil || match(ev) {
			out = append(out, ev.DeepCopy())
		}
	}
	return out
}

// Close closes the file.
func (l *Log) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return nil
	}
	err := l.f.Close()
	l.f = nil
	return err
}
