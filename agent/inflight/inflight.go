// Package inflight remembers what the agent is working on, in a small file
// of fixed-size slots, so that after the process dies the next start knows
// which command or pod sync was running: the one that may have killed it.
//
// A mark is one pwrite of one slot, without fsync. A command that kills the
// process (out of memory, a runtime panic) leaves the write in the page
// cache, which the next process reads; only a power loss can lose a mark, and
// then the worst case is one more crash before the mark catches it. An fsync
// per mark would cost milliseconds per command on flash storage (see
// BenchmarkMark); a plain write costs microseconds.
//
// Each slot holds a length, the value and a CRC-32 of both, so a slot torn
// by a power loss reads as empty instead of as garbage.
package inflight

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
)

// SlotSize is the bytes of one slot; a value may use SlotSize-8 of them
// (a pod key is at most 63+1+253 bytes).
const SlotSize = 512

// MaxValue is the longest value a slot holds.
const MaxValue = SlotSize - 8

// File is a mark file. Distinct slots may be written concurrently.
type File struct {
	f     *os.File
	slots int
	left  []string
}

// Open opens (or creates) the mark file at path with slots slots and reads
// the marks a previous process left. The file is not changed until Reset, so
// a process that dies before handling the leftovers finds them again.
func Open(path string, slots int) (*File, error) {
	if slots < 1 {
		return nil, fmt.Errorf("open mark file %s: need at least one slot", path)
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open mark file: %w", err)
	}
	left, err := readAll(f)
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("read mark file %s: %w", path, err)
	}
	return &File{f: f, slots: slots, left: left}, nil
}

// readAll returns the value of every valid non-empty slot in the file,
// whatever slot count the previous process used.
func readAll(f *os.File) ([]string, error) {
	var out []string
	buf := make([]byte, SlotSize)
	for off := int64(0); ; off += SlotSize {
		n, err := f.ReadAt(buf, off)
		if err != nil && !errors.Is(err, io.EOF) {
			return nil, err
		}
		// The last slot may be short: a write covers only its used bytes.
		clear(buf[n:])
		if v, ok := decode(buf); n > 0 && ok && v != "" {
			out = append(out, v)
		}
		if n < SlotSize {
			return out, nil
		}
	}
}

// Left returns the marks found at Open: what was running when the previous
// process stopped without clearing them.
func (f *File) Left() []string { return append([]string(nil), f.left...) }

// Reset empties every slot; call it once the leftovers are dealt with.
func (f *File) Reset() error {
	if err := f.f.Truncate(0); err != nil {
		return fmt.Errorf("reset mark file: %w", err)
	}
	if err := f.f.Truncate(int64(f.slots) * SlotSize); err != nil {
		return fmt.Errorf("reset mark file: %w", err)
	}
	f.left = nil
	return nil
}

// Set marks value as running in slot.
func (f *File) Set(slot int, value string) error {
	if len(value) > MaxValue {
		return fmt.Errorf("mark %q: longer than %d bytes", value[:32], MaxValue)
	}
	return f.write(slot, value)
}

// Clear empties slot.
func (f *File) Clear(slot int) error { return f.write(slot, "") }

func (f *File) write(slot int, value string) error {
	if slot < 0 || slot >= f.slots {
		return fmt.Errorf("mark slot %d: out of range [0,%d)", slot, f.slots)
	}
	var buf [SlotSize]byte
	binary.BigEndian.PutUint16(buf[0:2], uint16(len(value)))
	copy(buf[2:], value)
	sum := crc32.ChecksumIEEE(buf[:2+len(value)])
	binary.BigEndian.PutUint32(buf[2+len(value):], sum)
	if _, err := f.f.WriteAt(buf[:2+len(value)+4], int64(slot)*SlotSize); err != nil {
		return fmt.Errorf("write mark slot %d: %w", slot, err)
	}
	return nil
}

func decode(buf []byte) (string, bool) {
	n := int(binary.BigEndian.Uint16(buf[0:2]))
	if n > MaxValue {
		return "", false
	}
	want := binary.BigEndian.Uint32(buf[2+n:])
	if crc32.ChecksumIEEE(buf[:2+n]) != want {
		return "", false
	}
	return string(buf[2 : 2+n]), true
}

// Close closes the file; the marks stay.
func (f *File) Close() error {
	if err := f.f.Close(); err != nil {
		return fmt.Errorf("close mark file: %w", err)
	}
	return nil
}
