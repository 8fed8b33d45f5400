package store

import (
	"fmt"

	bolt "go.etcd.io/bbolt"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	apiv1 "github.com/mqlet/mqlet/api/v1"
)

// SourceOf is the source an object was stored from: its
// apiv1.AnnotationSource, or apiv1.SourceNode when it has none.
func SourceOf(m *metav1.ObjectMeta) string {
	if s := m.Annotations[apiv1.AnnotationSource]; s != "" {
		return s
	}
	return apiv1.SourceNode
}

// checkSource refuses a write by source to the object at key when it is
// stored from another source: each source replaces only its own objects,
// and the same namespace/name from two sources is refused naming both.
func (s *Store) checkSource(tx *bolt.Tx, kind, key, source string) error {
	raw := tx.Bucket(kindBuckets[kind]).Get([]byte(key))
	if raw == nil {
		return nil
	}
	prev, err := s.atRest.decode(kind, []byte(key), raw)
	if err != nil {
		return fmt.Errorf("store %s %s: read stored version: %w", kind, key, err)
	}
	if stored := SourceOf(metaOf(prev)); stored != source {
		return &RejectedError{Kind: kind, Key: key, Field: "metadata.annotations[" + apiv1.AnnotationSource + "]",
			Reason: fmt.Sprintf("stored from source %s; this command's source is %s: an object has one source (change or delete it through %s)", stored, source, stored)}
	}
	return nil
}
