package store

import (
	"encoding/json"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"
	"k8s.io/apimachinery/pkg/types"
)

// Quarantine records a pod that is not synced: its sync was proven to stop
// the agent. It holds for this uid and generation only: a new spec
// (generation) or a re-created pod (uid) lifts it.
type Quarantine struct {
	UID        types.UID `json:"uid"`
	Generation int64     `json:"generation"`
	Reason     string    `json:"reason"`
	Since      time.Time `json:"since"`
	// Evidence is what proved it (agent/podworker: a Go crash in the sync,
	// or deaths in a row); empty in a record of an older mqlet, which
	// quarantined for any death.
	Evidence string `json:"evidence,omitempty"`
	// Phase is the phase of the sync the agent last died in ("read": a
	// runtime read, which is then not asked again for the pod).
	Phase string `json:"phase,omitempty"`
}

// Covers reports whether the quarantine still holds for this pod version.
func (q Quarantine) Covers(uid types.UID, generation int64) bool {
	return q.UID == uid && q.Generation == generation
}

// SetQuarantine quarantines the pod with key.
func (s *Store) SetQuarantine(key string, q Quarantine) error {
	raw, err := json.Marshal(q)
	if err != nil {
		return fmt.Errorf("encode quarantine of %s: %w", key, err)
	}
	if err := s.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucketQuarantine).Put([]byte(key), raw) }); err != nil {
		return fmt.Errorf("quarantine pod %s in state store: %w", key, err)
	}
	return nil
}

// GetQuarantine returns the quarantine of the pod with key, if any.
func (s *Store) GetQuarantine(key string) (Quarantine, bool, error) {
	var q Quarantine
	var found bool
	err := s.db.View(func(tx *bolt.Tx) error {
		raw := tx.Bucket(bucketQuarantine).Get([]byte(key))
		if raw == nil {
			return nil
		}
		found = true
		return json.Unmarshal(raw, &q)
	})
	if err != nil {
		return Quarantine{}, false, fmt.Errorf("read quarantine of %s from state store: %w", key, err)
	}
	return q, found, nil
}

// LiftQuarantine removes the quarantine of the pod with key (none is fine).
func (s *Store) LiftQuarantine(key string) error {
	if err := s.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucketQuarantine).Delete([]byte(key)) }); err != nil {
		return fmt.Errorf("lift quarantine of %s in state store: %w", key, err)
	}
	return nil
}
