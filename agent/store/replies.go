package store

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"
)

// RecordReply remembers the reply sent for requestID, so a redelivered
// request is answered again instead of executed again. Recording the same id
// again replaces its reply. The oldest replies are dropped beyond
// Options.MaxReplies.
func (s *Store) RecordReply(requestID string, reply []byte, at time.Time) error {
	if requestID == "" {
		return errors.New("record reply: empty request id")
	}
	id := []byte(requestID)
	err := s.db.Update(func(tx *bolt.Tx) error {
		replies, index := tx.Bucket(bucketReplies), tx.Bucket(bucketReplyIndex)
		if old := replies.Get(id); old != nil {
			if len(old) < 8 {
				return fmt.Errorf("stored reply %q is truncated", requestID)
			}
			if err := index.Delete(indexKey(old[:8], id)); err != nil {
				return err
			}
		} else if err := replies.SetSequence(replies.Sequence() + 1); err != nil {
			return err
		}
		stamp := make([]byte, 8)
		binary.BigEndian.PutUint64(stamp, uint64(at.UnixNano()))
		if err := replies.Put(id, append(stamp, reply...)); err != nil {
			return err
		}
		if err := index.Put(indexKey(stamp, id), nil); err != nil {
			return err
		}
		// The reply count lives in the bucket's sequence so the bound costs
		// no scan.
		for replies.Sequence() > uint64(s.opts.MaxReplies) {
			k, _ := index.Cursor().First()
			if k == nil {
				break
			}
			if err := deleteReply(replies, index, k); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("record reply %q in state store: %w", requestID, err)
	}
	return nil
}

// LookupReply returns the reply recorded for requestID unless it has expired.
func (s *Store) LookupReply(requestID string) ([]byte, bool, error) {
	var reply []byte
	var found bool
	now := s.opts.Now()
	err := s.db.View(func(tx *bolt.Tx) error {
		v := tx.Bucket(bucketReplies).Get([]byte(requestID))
		if v == nil {
			return nil
		}
		if len(v) < 8 {
			return fmt.Errorf("stored reply %q is truncated", requestID)
		}
		at := time.Unix(0, int64(binary.BigEndian.Uint64(v[:8])))
		if now.Sub(at) > s.opts.ReplyTTL {
			return nil
		}
		reply = append([]byte(nil), v[8:]...)
		found = true
		return nil
	})
	if err != nil {
		return nil, false, fmt.Errorf("look up reply %q in state store: %w", requestID, err)
	}
	return reply, found, nil
}

// PruneReplies drops replies older than Options.ReplyTTL at now and says how
// many it dropped.
func (s *Store) PruneReplies(now time.Time) (int, error) {
	cutoff := uint64(now.Add(-s.opts.ReplyTTL).UnixNano())
	pruned := 0
	err := s.db.Update(func(tx *bolt.Tx) error {
		replies, index := tx.Bucket(bucketReplies), tx.Bucket(bucketReplyIndex)
		for {
			k, _ := index.Cursor().First()
			if len(k) < 8 || binary.BigEndian.Uint64(k[:8]) >= cutoff {
				return nil
			}
			if err := deleteReply(replies, index, k); err != nil {
				return err
			}
			pruned++
		}
	})
	if err != nil {
		return 0, fmt.Errorf("prune replies in state store: %w", err)
	}
	return pruned, nil
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

func deleteReply(replies, index *bolt.Bucket, indexK []byte) error {
	k := append([]byte(nil), indexK...) // cursor keys are invalid after a delete
	if err := index.Delete(k); err != nil {
		return err
	}
	if len(k) < 8 {
		return nil
	}
	if err := replies.Delete(k[8:]); err != nil {
		return err
	}
	if n := replies.Sequence(); n > 0 {
		return replies.SetSequence(n - 1)
	}
	return nil
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
