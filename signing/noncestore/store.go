// Package noncestore keeps the nonces of accepted signed commands in a small
// bbolt file, so a signed command is accepted once, also across restarts.
// A nonce is kept until its command could no longer pass as fresh, then
// pruned; the count is bounded, and a full store refuses new nonces rather
// than forgetting unexpired ones (which would open a replay window).
package noncestore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/mqlet/mqlet/signing"
)

var (
	bucketNonces = []byte("nonces")  // keyID \x00 nonce -> 8-byte keep-until (unix nanos)
	bucketByTime = []byte("by-time") // 8-byte keep-until + keyID \x00 nonce -> nothing, oldest first
)

// ErrFull is returned when MaxNonces unexpired nonces are kept.
var ErrFull = errors.New("nonce store full")

// Store is the persisted nonce record.
type Store struct {
	db    *bolt.DB
	max   int
	mu    sync.Mutex // guards count
	count int
}

// Open opens (or creates) the nonce file at path, keeping at most max
// unexpired nonces.
func Open(path string, max int) (*Store, error) {
	if max < 1 {
		return nil, fmt.Errorf("opening nonce store: max %d must be positive", max)
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 5 * time.Second})
	if err != nil {
		return nil, fmt.Errorf("opening nonce store %s: %w", path, err)
	}
	s := &Store{db: db, max: max}
	err = db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists(bucketNonces)
		if err != nil {
			return err
		}
		if _, err := tx.CreateBucketIfNotExists(bucketByTime); err != nil {
			return err
		}
		s.count = b.Stats().KeyN
		return nil
	})
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("preparing nonce store %s: %w", path, err)
	}
	return s, nil
}

// Close closes the file.
func (s *Store) Close() error { return s.db.Close() }

// Count is how many nonces are kept.
func (s *Store) Count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.count
}

// Use records keyID's nonce until keep, after pruning what expired by now.
// It is one transaction: check, prune and record are atomic and durable
// before the command runs.
func (s *Store) Use(keyID, nonce string, keep, now time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	id := append(append([]byte(keyID), 0), nonce...)
	var added, pruned int
	err := s.db.Update(func(tx *bolt.Tx) error {
		nonces, byTime := tx.Bucket(bucketNonces), tx.Bucket(bucketByTime)
		var err error
		if pruned, err = prune(nonces, byTime, now); err != nil {
			return err
		}
		if nonces.Get(id) != nil {
			return fmt.Errorf("%w: %s", signing.ErrReplayed, nonce)
		}
		if s.count-pruned >= s.max {
			return fmt.Errorf("%w: %d unexpired nonces kept (security.maxNonces)", ErrFull, s.count-pruned)
		}
		t := make([]byte, 8)
		binary.BigEndian.PutUint64(t, uint64(keep.UnixNano()))
		if err := nonces.Put(id, t); err != nil {
			return err
		}
		added = 1
		return byTime.Put(append(t, id...), nil)
	})
	if err != nil {
		return err
	}
	s.count += added - pruned
	return nil
}

// Prune drops the nonces whose keep-until passed by now.
func (s *Store) Prune(now time.Time) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var pruned int
	err := s.db.Update(func(tx *bolt.Tx) error {
		var err error
		pruned, err = prune(tx.Bucket(bucketNonces), tx.Bucket(bucketByTime), now)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("pruning nonces: %w", err)
	}
	s.count -= pruned
	return pruned, nil
}

func prune(nonces, byTime *bolt.Bucket, now time.Time) (int, error) {
	cutoff := uint64(now.UnixNano())
	var old [][]byte
	c := byTime.Cursor()
	for k, _ := c.First(); k != nil && len(k) >= 8 && binary.BigEndian.Uint64(k[:8]) < cutoff; k, _ = c.Next() {
		old = append(old, append([]byte(nil), k...))
	}
	for _, k := range old {
		if err := byTime.Delete(k); err != nil {
			return 0, err
		}
		if err := nonces.Delete(k[8:]); err != nil {
			return 0, err
		}
	}
	return len(old), nil
}
