package store

import (
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
