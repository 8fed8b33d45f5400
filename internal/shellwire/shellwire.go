// Package shellwire holds the sequencing and flow control of an
// interactive session carried over MQTT (exec -it, attach), shared by the
// agent and mqletctl: each side numbers its messages from 1, the receiver
// hands them on in order exactly once (QoS 1 may redeliver, a clustered
// broker may reorder), and the sender keeps at most a bounded number of
// bytes unacknowledged. Every number here comes from the other side, which
// may be hostile: buffers and counts are bounded and a message outside
// them is refused, never kept.
package shellwire

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// Errors of Reorder.Add and Window.Ack.
var (
	ErrTooFarAhead = errors.New("sequence number too far ahead")
	ErrBufferFull  = errors.New("out-of-order buffer full")
	ErrBadAck      = errors.New("acknowledges a message never sent")
)

// Reorder hands on messages in sequence order, each once.
type Reorder struct {
	next     uint64 // the sequence number handed on next
	maxAhead uint64
	maxBytes int
	held     map[uint64][]byte
	bytes    int
}

// NewReorder returns a Reorder expecting sequence number 1 that holds at
// most maxAhead messages beyond the next one, maxBytes in all.
func NewReorder(maxAhead, maxBytes int) *Reorder {
	return &Reorder{next: 1, maxAhead: uint64(max(1, maxAhead)), maxBytes: max(0, maxBytes), held: map[uint64][]byte{}}
}

// Add takes message seq and returns what is now in order (possibly
// nothing). A duplicate (seq already handed on or held) is dropped
// silently; seq 0, one more than maxAhead past the next, or one that would
// overflow the buffer's bytes is refused.
func (r *Reorder) Add(seq uint64, data []byte) ([][]byte, error) {
	switch {
	case seq == 0:
		return nil, fmt.Errorf("sequence number 0: numbering starts at 1")
	case seq < r.next:
		return nil, nil // redelivered
	case seq-r.next > r.maxAhead:
		return nil, fmt.Errorf("%w: %d while %d is next (at most %d ahead)", ErrTooFarAhead, seq, r.next, r.maxAhead)
	}
	if seq > r.next {
		if _, dup := r.held[seq]; dup {
			return nil, nil
		}
		if r.bytes+len(data) > r.maxBytes {
			return nil, fmt.Errorf("%w: %d bytes held, %d more exceed %d", ErrBufferFull, r.bytes, len(data), r.maxBytes)
		}
		r.held[seq] = data
		r.bytes += len(data)
		return nil, nil
	}
	out := [][]byte{data}
	r.next++
	for {
		d, ok := r.held[r.next]
		if !ok {
			return out, nil
		}
		delete(r.held, r.next)
		r.bytes -= len(d)
		out = append(out, d)
		r.next++
	}
}

// Delivered is the highest sequence number handed on: the cumulative
// acknowledgement to send back.
func (r *Reorder) Delivered() uint64 { return r.next - 1 }

// Window bounds the bytes a sender has in flight: Reserve numbers a
// message and waits for room; a cumulative Ack frees the messages up to it.
type Window struct {
	limit int

	mu    sync.Mutex
	sent  uint64 // the last sequence number given out
	acked uint64 // the highest acknowledged
	sizes []int  // sizes of sent messages acked+1..sent
	used  int    // their sum
	freed chan struct{}
}

// NewWindow returns a Window of limit bytes (at least 1).
func NewWindow(limit int) *Window {
	return &Window{limit: max(1, limit), freed: make(chan struct{})}
}

// Reserve waits until n more bytes fit (a message larger than the whole
// window waits for an empty one) and returns the message's sequence
// number, or ctx's error.
func (w *Window) Reserve(ctx context.Context, n int) (uint64, error) {
	for {
		w.mu.Lock()
		if w.used == 0 || w.used+n <= w.limit {
			w.sent++
			w.sizes = append(w.sizes, n)
			w.used += n
			seq := w.sent
			w.mu.Unlock()
			return seq, nil
		}
		freed := w.freed
		w.mu.Unlock()
		select {
		case <-freed:
		case <-ctx.Done():
			return 0, fmt.Errorf("waiting for the receiver to acknowledge %d bytes in flight: %w", w.InFlight(), ctx.Err())
		}
	}
}

// Ack records that the receiver has every message up to seq. An older ack
// (reordered) changes nothing; one past the last message sent is refused.
func (w *Window) Ack(seq uint64) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if seq > w.sent {
		return fmt.Errorf("%w: ack %d, last sent %d", ErrBadAck, seq, w.sent)
	}
	if seq <= w.acked {
		return nil
	}
	k := int(seq - w.acked)
	for _, s := range w.sizes[:k] {
		w.used -= s
	}
	w.sizes = w.sizes[k:]
	w.acked = seq
	close(w.freed)
	w.freed = make(chan struct{})
	return nil
}

// InFlight is the bytes sent and not yet acknowledged.
func (w *Window) InFlight() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.used
}
