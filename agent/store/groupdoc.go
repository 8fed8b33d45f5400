package store

import (
	"encoding/json"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"

	apiv1 "github.com/mqlet/mqlet/api/v1"
)

// bucketGroupDocs holds, by group, the generation of the group's document
// the node last applied (apiv1.GroupDocument): group -> GroupApplied JSON.
var bucketGroupDocs = []byte("group-documents")

// GroupApplied is what the store keeps of the last group document applied.
type GroupApplied struct {
	Generation uint64    `json:"generation"`
	AppliedAt  time.Time `json:"appliedAt"`
	// Digest is the SHA-256 (hex) of the document applied, so the same
	// generation published again with other content is told apart.
	Digest string `json:"digest,omitempty"`
}

func groupApplied(tx *bolt.Tx, group string) (GroupApplied, bool, error) {
	raw := tx.Bucket(bucketGroupDocs).Get([]byte(group))
	if raw == nil {
		return GroupApplied{}, false, nil
	}
	var g GroupApplied
	if err := json.Unmarshal(raw, &g); err != nil {
		return GroupApplied{}, false, fmt.Errorf("read applied document of group %s: %w", group, err)
	}
	return g, true, nil
}

func setGroupApplied(tx *bolt.Tx, group string, g *GroupApplied) error {
	b := tx.Bucket(bucketGroupDocs)
	if g == nil {
		return b.Delete([]byte(group))
	}
	raw, err := json.Marshal(g)
	if err != nil {
		return err
	}
	return b.Put([]byte(group), raw)
}

// GroupApplied returns the last document of group applied (found false:
// none, or none since the node last left the group).
func (s *Store) GroupApplied(group string) (g GroupApplied, found bool, err error) {
	err = s.db.View(func(tx *bolt.Tx) error {
		g, found, err = groupApplied(tx, group)
		return err
	})
	return g, found, err
}

// SetGroupApplied records the document of group applied (nil forgets it)
// in a transaction of its own.
func (s *Store) SetGroupApplied(group string, g *GroupApplied) error {
	if err := s.db.Update(func(tx *bolt.Tx) error { return setGroupApplied(tx, group, g) }); err != nil {
		return fmt.Errorf("record applied document of group %s in state store %s: %w", group, s.path, err)
	}
	return nil
}

// GroupGenerations returns the generation of every group's document
// applied, by group.
func (s *Store) GroupGenerations() (map[string]uint64, error) {
	out := map[string]uint64{}
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketGroupDocs).ForEach(func(k, v []byte) error {
			var g GroupApplied
			if err := json.Unmarshal(v, &g); err != nil {
				return fmt.Errorf("read applied document of group %s: %w", k, err)
			}
			out[string(k)] = g.Generation
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("list applied group documents in state store %s: %w", s.path, err)
	}
	return out, nil
}

// GroupApplied is Store.GroupApplied inside the transaction.
func (t *Tx) GroupApplied(group string) (GroupApplied, bool, error) {
	if err := t.live(); err != nil {
		return GroupApplied{}, false, err
	}
	return groupApplied(t.tx, group)
}

// SetGroupApplied records, in the transaction that applies it, the
// document of group applied; nil forgets it (the node left the group).
func (t *Tx) SetGroupApplied(group string, g *GroupApplied) error {
	if err := t.live(); err != nil {
		return err
	}
	return t.fail(setGroupApplied(t.tx, group, g))
}

// migrateSources gives every stored object without a source annotation
// (stored before sources existed, schema 4 and older) the node's source,
// so what the store holds says where each object came from. It returns
// how many objects it changed.
func migrateSources(tx *bolt.Tx, c *atRest) (int, error) {
	n := 0
	for _, kind := range kindOrder {
		b := tx.Bucket(kindBuckets[kind])
		fixed := map[string][]byte{}
		err := b.ForEach(func(k, v []byte) error {
			obj, err := c.decode(kind, k, v)
			if err != nil {
				return fmt.Errorf("%s %s: %w", kind, k, err)
			}
			m := metaOf(obj)
			if m.Annotations[apiv1.AnnotationSource] != "" {
				return nil
			}
			if m.Annotations == nil {
				m.Annotations = map[string]string{}
			}
			m.Annotations[apiv1.AnnotationSource] = apiv1.SourceNode
			raw, err := c.encode(kind, k, obj)
			if err != nil {
				return err
			}
			fixed[string(k)] = raw
			return nil
		})
		if err != nil {
			return 0, fmt.Errorf("migrate sources: %w", err)
		}
		for k, raw := range fixed {
			if err := b.Put([]byte(k), raw); err != nil {
				return 0, fmt.Errorf("migrate source of %s %s: %w", kind, k, err)
			}
		}
		n += len(fixed)
	}
	return n, nil
}
