package store

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"
)

// ErrRecordTooLarge is returned (wrapped) by RecordReply for a reply larger
// than Options.MaxReplyBytes; nothing is written then.
var ErrRecordTooLarge = errors.New("reply exceeds the record bound")

// RecordReply remembers the reply sent for requestID, so a redelivered
// request is answered again instead of executed again. Recording the same id
// again replaces its reply. The oldest replies are dropped beyond
// Options.MaxReplies records or Options.MaxReplyBytes bytes; a single reply
// larger than the byte bound is refused.
func (s *Store) RecordReply(requestID string, reply []byte, at time.Time) error {
	err := s.db.Update(func(tx *bolt.Tx) error { return s.recordReply(tx, requestID, reply, at) })
	if err != nil {
		return fmt.Errorf("record reply %q in state store: %w", requestID, err)
	}
	return nil
}

// recordSize is what one record counts against Options.MaxReplyBytes: its
// key, its stamped value and its index entry.
func recordSize(id []byte, value []byte) uint64 {
	return uint64(len(id) + len(value) + 8 + len(id))
}

func (s *Store) recordReply(tx *bolt.Tx, requestID string, reply []byte, at time.Time) error {
	if requestID == "" {
		return errors.New("empty request id")
	}
	id := []byte(requestID)
	value := make([]byte, 8, 8+len(reply))
	binary.BigEndian.PutUint64(value, uint64(at.UnixNano()))
	value = append(value, reply...)
	size := recordSize(id, value)
	if size > uint64(s.opts.MaxReplyBytes) {
		return fmt.Errorf("reply of %d bytes: %w of %d bytes", len(reply), ErrRecordTooLarge, s.opts.MaxReplyBytes)
	}
	replies, index := tx.Bucket(bucketReplies), tx.Bucket(bucketReplyIndex)
	total, err := replyBytes(replies, index)
	if err != nil {
		return err
	}
	if old := replies.Get(id); old != nil {
		if len(old) < 8 {
			return fmt.Errorf("stored reply %q is truncated", requestID)
		}
		if err := index.Delete(indexKey(old[:8], id)); err != nil {
			return err
		}
		total -= min(total, recordSize(id, old))
	} else if err := replies.SetSequence(replies.Sequence() + 1); err != nil {
		return err
	}
	if err := replies.Put(id, value); err != nil {
		return err
	}
	if err := index.Put(indexKey(value[:8], id), nil); err != nil {
		return err
	}
	total += size
	// The count and the byte total live in the buckets' sequences so the
	// bounds cost no scan.
	for replies.Sequence() > uint64(s.opts.MaxReplies) || total > uint64(s.opts.MaxReplyBytes) {
		k, _ := index.Cursor().First()
		if k == nil {
			break
		}
		freed, err := deleteReply(replies, index, tx.Bucket(bucketDigests), k)
		if err != nil {
			return err
		}
		total -= min(total, freed)
	}
	return index.SetSequence(total)
}

// replyBytes is the byte total of the records, kept in the index bucket's
// sequence. A store written before the total was kept has records and a zero
// total: it is counted once here.
func replyBytes(replies, index *bolt.Bucket) (uint64, error) {
	total := index.Sequence()
	if total > 0 || replies.Sequence() == 0 {
		return total, nil
	}
	err := replies.ForEach(func(k, v []byte) error {
		total += recordSize(k, v)
		return nil
	})
	return total, err
}

// LookupReply returns the reply recorded for requestID unless it has expired.
func (s *Store) LookupReply(requestID string) ([]byte, bool, error) {
	var reply []byte
	var found bool
	err := s.db.View(func(tx *bolt.Tx) error {
		var err error
		reply, found, err = s.lookupReply(tx, requestID)
		return err
	})
	if err != nil {
		return nil, false, fmt.Errorf("look up reply %q in state store: %w", requestID, err)
	}
	return reply, found, nil
}

func (s *Store) lookupReply(tx *bolt.Tx, requestID string) ([]byte, bool, error) {
	v := tx.Bucket(bucketReplies).Get([]byte(requestID))
	if v == nil {
		return nil, false, nil
	}
	if len(v) < 8 {
		return nil, false, fmt.Errorf("stored reply %q is truncated", requestID)
	}
	at := time.Unix(0, int64(binary.BigEndian.Uint64(v[:8])))
	if s.opts.Now().Sub(at) > s.opts.ReplyTTL {
		return nil, false, nil
	}
	return append([]byte(nil), v[8:]...), true, nil
}

// PruneReplies drops replies older than Options.ReplyTTL at now and says how
// many it dropped.
func (s *Store) PruneReplies(now time.Time) (int, error) {
	cutoff := uint64(now.Add(-s.opts.ReplyTTL).UnixNano())
	pruned := 0
	err := s.db.Update(func(tx *bolt.Tx) error {
		replies, index := tx.Bucket(bucketReplies), tx.Bucket(bucketReplyIndex)
		total, err := replyBytes(replies, index)
		if err != nil {
			return err
		}
		if err := pruneDigests(tx.Bucket(bucketDigests), cutoff); err != nil {
			return err
		}
		for {
			k, _ := index.Cursor().First()
			if len(k) < 8 || binary.BigEndian.Uint64(k[:8]) >= cutoff {
				return index.SetSequence(total)
			}
			freed, err := deleteReply(replies, index, tx.Bucket(bucketDigests), k)
			if err != nil {
				return err
			}
			total -= min(total, freed)
			pruned++
		}
	})
	if err != nil {
		return 0, fmt.Errorf("prune replies in state store: %w", err)
	}
	return pruned, nil
}

// ReplyBytes is how many bytes the kept replies count against
// Options.MaxReplyBytes.
func (s *Store) ReplyBytes() (int64, error) {
	var n uint64
	err := s.db.View(func(tx *bolt.Tx) error {
		var err error
		n, err = replyBytes(tx.Bucket(bucketReplies), tx.Bucket(bucketReplyIndex))
		return err
	})
	return int64(n), err
}

// ReplyCount is how many replies are kept.
func (s *Store) ReplyCount() (int, error) {
	var n uint64
	err := s.db.View(func(tx *bolt.Tx) error {
		n = tx.Bucket(bucketReplies).Sequence()
		return nil
	})
	return int(n), err
}

func indexKey(stamp, id []byte) []byte {
	k := make([]byte, 0, len(stamp)+len(id))
	return append(append(k, stamp...), id...)
}

// deleteReply removes the record of an index key and says how many bytes
// it counted.
func deleteReply(replies, index, digests *bolt.Bucket, indexK []byte) (uint64, error) {
	k := append([]byte(nil), indexK...) // cursor keys are invalid after a delete
	if err := index.Delete(k); err != nil {
		return 0, err
	}
	if len(k) < 8 {
		return 0, nil
	}
	id := k[8:]
	v := replies.Get(id)
	if v == nil {
		return 0, nil
	}
	freed := recordSize(id, v)
	if err := replies.Delete(id); err != nil {
		return 0, err
	}
	if err := digests.Delete(id); err != nil {
		return 0, err
	}
	if n := replies.Sequence(); n > 0 {
		return freed, replies.SetSequence(n - 1)
	}
	return freed, nil
}

// NextSeq returns the next connection sequence number (1, 2, ...), persisted
// so it keeps growing across restarts.
func (s *Store) NextSeq() (uint64, error) {
	var n uint64
	err := s.db.Update(func(tx *bolt.Tx) error {
		var err error
		n, err = tx.Bucket(bucketSeq).NextSequence()
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("next sequence number in state store: %w", err)
	}
	return n, nil
}

// Meta returns a small setting stored with SetMeta.
func (s *Store) Meta(key string) ([]byte, bool, error) {
	var value []byte
	var found bool
	err := s.db.View(func(tx *bolt.Tx) error {
		if v := tx.Bucket(bucketMeta).Get([]byte(key)); v != nil {
			value, found = append([]byte(nil), v...), true
		}
		return nil
	})
	if err != nil {
		return nil, false, fmt.Errorf("read meta %q from state store: %w", key, err)
	}
	return value, found, nil
}

// SetMeta stores a small setting; a nil value deletes it.
func (s *Store) SetMeta(key string, value []byte) error {
	if key == "" {
		return errors.New("set meta: empty key")
	}
	err := s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketMeta)
		if value == nil {
			return b.Delete([]byte(key))
		}
		return b.Put([]byte(key), value)
	})
	if err != nil {
		return fmt.Errorf("write meta %q to state store: %w", key, err)
	}
	return nil
}

// A request id is bound to the command that first used it (a hash of its
// topic and payload), so that a command published later under the same id
// by someone else is refused instead of being answered from the first
// one's record. The binding goes with the id's reply record.

// BindRequest keeps digest as the command requestID names.
func (s *Store) BindRequest(requestID string, digest []byte) error {
	err := s.db.Update(func(tx *bolt.Tx) error { return s.bindRequest(tx, requestID, digest) })
	if err != nil {
		return fmt.Errorf("bind request %q in state store: %w", requestID, err)
	}
	return nil
}

// RequestDigest returns the digest requestID is bound to, nil when none
// (unused, expired, or recorded by an older mqlet).
func (s *Store) RequestDigest(requestID string) ([]byte, error) {
	var d []byte
	err := s.db.View(func(tx *bolt.Tx) error {
		d = s.requestDigest(tx, requestID)
		return nil
	})
	return d, err
}

// BindRequest is Store.BindRequest inside the transaction.
func (t *Tx) BindRequest(requestID string, digest []byte) error {
	if err := t.live(); err != nil {
		return err
	}
	if err := t.s.bindRequest(t.tx, requestID, digest); err != nil {
		return t.fail(fmt.Errorf("bind request %q in state store: %w", requestID, err))
	}
	return nil
}

// RequestDigest is Store.RequestDigest inside the transaction.
func (t *Tx) RequestDigest(requestID string) ([]byte, error) {
	if err := t.live(); err != nil {
		return nil, err
	}
	return t.s.requestDigest(t.tx, requestID), nil
}

// maxDigestBytes bounds a digest (a sha256 is 32).
const maxDigestBytes = 64

func (s *Store) bindRequest(tx *bolt.Tx, requestID string, digest []byte) error {
	if requestID == "" || len(digest) == 0 || len(digest) > maxDigestBytes {
		return errors.New("empty request id or bad digest")
	}
	v := make([]byte, 8, 8+len(digest))
	binary.BigEndian.PutUint64(v, uint64(s.opts.Now().UnixNano()))
	return tx.Bucket(bucketDigests).Put([]byte(requestID), append(v, digest...))
}

func (s *Store) requestDigest(tx *bolt.Tx, requestID string) []byte {
	v := tx.Bucket(bucketDigests).Get([]byte(requestID))
	if len(v) <= 8 {
		return nil
	}
	at := time.Unix(0, int64(binary.BigEndian.Uint64(v[:8])))
	if s.opts.Now().Sub(at) > s.opts.ReplyTTL {
		return nil
	}
	return append([]byte(nil), v[8:]...)
}

// pruneDigests drops bindings made before cutoff (their records expired,
// or the command was never recorded).
func pruneDigests(digests *bolt.Bucket, cutoff uint64) error {
	var old [][]byte
	err := digests.ForEach(func(k, v []byte) error {
		if len(v) < 8 || binary.BigEndian.Uint64(v[:8]) < cutoff {
			old = append(old, append([]byte(nil), k...))
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, k := range old {
		if err := digests.Delete(k); err != nil {
			return err
		}
	}
	return nil
}
