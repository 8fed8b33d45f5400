package store

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"time"

	bolt "go.etcd.io/bbolt"
)

// PendingWant is what an accepted command waits for on one pod: at least
// Generation observed running or done, or (Gone) the pod gone.
type PendingWant struct {
	Generation int64 `json:"g,omitempty"`
	Gone       bool  `json:"gone,omitempty"`
}

// PendingReply is a command answered accepted whose final reply
// (succeeded or failed) is still owed. It is written in the transaction
// that stores the command, so a kill cannot lose the promise of an answer.
//
// Once the final reply is decided it is kept with the entry (FinalTopic,
// FinalPayload; bucket pending-finals) until it is known to be queued in
// the outbox, a separate file: a start that finds a decided entry queues
// that reply again, under OnceKey, which the outbox stores at most once.
type PendingReply struct {
	RequestID string                 `json:"-"`
	Seq       uint64                 `json:"-"` // order of acceptance, for re-registering in order
	Verb      string                 `json:"verb"`
	Want      map[string]PendingWant `json:"want,omitempty"`
	Deadline  time.Time              `json:"deadline"`

	FinalTopic   string `json:"-"`
	FinalPayload []byte `json:"-"`
}

// Decided reports whether the final reply is recorded in the entry.
func (p PendingReply) Decided() bool { return p.FinalTopic != "" }

// OnceKey names this entry's final reply in the outbox: the request id with
// the entry's sequence, so a command repeated under the same id (a command
// without an id sent again) is not mistaken for the earlier one.
func (p PendingReply) OnceKey() string { return fmt.Sprintf("final/%d/%s", p.Seq, p.RequestID) }

// PutPending records (or replaces) the pending reply of p.RequestID inside
// the batch; the entry gets the next acceptance sequence.
func (t *Tx) PutPending(p PendingReply) error {
	if err := t.live(); err != nil {
		return err
	}
	if err := putPending(t.tx, p); err != nil {
		return t.fail(fmt.Errorf("record pending reply %q in state store: %w", p.RequestID, err))
	}
	return nil
}

// PutPending is Tx.PutPending in a transaction of its own.
func (s *Store) PutPending(p PendingReply) error {
	err := s.db.Update(func(tx *bolt.Tx) error { return putPending(tx, p) })
	if err != nil {
		return fmt.Errorf("record pending reply %q in state store: %w", p.RequestID, err)
	}
	return nil
}

func putPending(tx *bolt.Tx, p PendingReply) error {
	if p.RequestID == "" {
		return errors.New("empty request id")
	}
	b := tx.Bucket(bucketPending)
	seq, err := b.NextSequence()
	if err != nil {
		return err
	}
	p.Seq, p.FinalTopic, p.FinalPayload = seq, "", nil
	raw, err := json.Marshal(p)
	if err != nil {
		return err
	}
	// A final reply kept for an earlier entry of the same id is not this one's.
	if err := tx.Bucket(bucketFinals).Delete([]byte(p.RequestID)); err != nil {
		return err
	}
	return b.Put([]byte(p.RequestID), append(binary.BigEndian.AppendUint64(make([]byte, 0, 8+len(raw)), seq), raw...))
}

// entrySeq is the acceptance sequence of a stored entry (its first 8 bytes).
func entrySeq(v []byte) (uint64, bool) {
	if len(v) < 8 {
		return 0, false
	}
	return binary.BigEndian.Uint64(v[:8]), true
}

// DecidePending keeps the final reply of requestID's pending entry (see
// PendingReply) and returns the entry's id, sequence and final reply;
// found is false when the request has no entry (nothing is written then).
// The entry itself is not read beyond its sequence: deciding costs one
// small write per final reply.
func (t *Tx) DecidePending(requestID, topic string, payload []byte) (p PendingReply, found bool, err error) {
	if err := t.live(); err != nil {
		return PendingReply{}, false, err
	}
	seq, ok := entrySeq(t.tx.Bucket(bucketPending).Get([]byte(requestID)))
	if !ok {
		return PendingReply{}, false, nil
	}
	v := binary.BigEndian.AppendUint64(make([]byte, 0, 8+binary.MaxVarintLen64+len(topic)+len(payload)), seq)
	v = binary.AppendUvarint(v, uint64(len(topic)))
	v = append(append(v, topic...), payload...)
	if err := t.tx.Bucket(bucketFinals).Put([]byte(requestID), v); err != nil {
		return PendingReply{}, false, t.fail(fmt.Errorf("keep final reply of %q: %w", requestID, err))
	}
	return PendingReply{RequestID: requestID, Seq: seq, FinalTopic: topic, FinalPayload: payload}, true, nil
}

// decodeFinal reads a kept final reply.
func decodeFinal(v []byte) (seq uint64, topic string, payload []byte, err error) {
	seq, ok := entrySeq(v)
	if !ok {
		return 0, "", nil, errors.New("truncated")
	}
	n, w := binary.Uvarint(v[8:])
	if w <= 0 || uint64(len(v)-8-w) < n {
		return 0, "", nil, errors.New("bad topic length")
	}
	start := 8 + w
	return seq, string(v[start : start+int(n)]), append([]byte(nil), v[start+int(n):]...), nil
}

// DropPending removes the entries of the given request ids whose sequence
// matches (a newer entry under the same id stays).
func (t *Tx) DropPending(entries map[string]uint64) error {
	if err := t.live(); err != nil {
		return err
	}
	if err := dropPending(t.tx, entries); err != nil {
		return t.fail(err)
	}
	return nil
}

// DropPending is Tx.DropPending in a transaction of its own.
func (s *Store) DropPending(entries map[string]uint64) error {
	return s.db.Update(func(tx *bolt.Tx) error { return dropPending(tx, entries) })
}

func dropPending(tx *bolt.Tx, entries map[string]uint64) error {
	b, finals := tx.Bucket(bucketPending), tx.Bucket(bucketFinals)
	for id, seq := range entries {
		if got, ok := entrySeq(b.Get([]byte(id))); !ok || got != seq {
			continue
		}
		if err := b.Delete([]byte(id)); err != nil {
			return fmt.Errorf("drop pending reply %q: %w", id, err)
		}
		if err := finals.Delete([]byte(id)); err != nil {
			return fmt.Errorf("drop final reply of %q: %w", id, err)
		}
	}
	return nil
}

// ListPending returns every pending reply, oldest acceptance first, each
// with its final reply if one was decided. An entry that cannot be read is
// skipped and named in the error (the others are still returned).
func (s *Store) ListPending() ([]PendingReply, error) {
	var out []PendingReply
	var bad []error
	err := s.db.View(func(tx *bolt.Tx) error {
		finals := tx.Bucket(bucketFinals)
		return tx.Bucket(bucketPending).ForEach(func(k, v []byte) error {
			var p PendingReply
			seq, ok := entrySeq(v)
			if !ok {
				bad = append(bad, fmt.Errorf("pending reply %q: truncated", k))
				return nil
			}
			if err := json.Unmarshal(v[8:], &p); err != nil {
				bad = append(bad, fmt.Errorf("pending reply %q: %w", k, err))
				return nil
			}
			p.RequestID, p.Seq = string(k), seq
			if f := finals.Get(k); f != nil {
				fseq, topic, payload, err := decodeFinal(f)
				if err != nil {
					bad = append(bad, fmt.Errorf("final reply of %q: %w", k, err))
				} else if fseq == seq {
					p.FinalTopic, p.FinalPayload = topic, payload
				}
			}
			out = append(out, p)
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("list pending replies in state store: %w", err)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Seq < out[j].Seq })
	if len(bad) > 0 {
		return out, fmt.Errorf("list pending replies in state store: %w", errors.Join(bad...))
	}
	return out, nil
}

// KeepPendingDeadline replaces the deadline of requestID's pending entry
// (a delete waiting out a grace period); an id without entry is left alone.
func (t *Tx) KeepPendingDeadline(requestID string, deadline time.Time) error {
	if err := t.live(); err != nil {
		return err
	}
	b := t.tx.Bucket(bucketPending)
	v := b.Get([]byte(requestID))
	seq, ok := entrySeq(v)
	if !ok {
		return nil
	}
	var p PendingReply
	if err := json.Unmarshal(v[8:], &p); err != nil {
		return t.fail(fmt.Errorf("read pending reply %q: %w", requestID, err))
	}
	p.Deadline = deadline
	raw, err := json.Marshal(p)
	if err == nil {
		err = b.Put([]byte(requestID), append(binary.BigEndian.AppendUint64(make([]byte, 0, 8+len(raw)), seq), raw...))
	}
	if err != nil {
		return t.fail(fmt.Errorf("keep the deadline of pending reply %q: %w", requestID, err))
	}
	return nil
}
