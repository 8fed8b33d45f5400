package apiv1

import (
	"fmt"
	"regexp"

	v1 "k8s.io/api/core/v1"
)

// Kinds a get can ask for.
const (
	KindPod       = "Pod"
	KindConfigMap = "ConfigMap"
	KindSecret    = "Secret"
	// KindNode reads the node itself: the v1.Node last published on the
	// node topic (NodeList).
	KindNode = "Node"
)

// NodeList is the result of get {"kind":"Node"}: this node, as last
// published on its node topic (one item; a name other than the node's is
// not found).
type NodeList struct {
	Nodes []*v1.Node `json:"nodes"`
}

// GetRequest selects what a get returns; empty fields match everything.
type GetRequest struct {
	Kind      string `json:"kind,omitempty"`
	Namespace string `json:"namespace,omitempty"`
	Name      string `json:"name,omitempty"`
	// LabelSelector filters by labels, in kubectl's syntax ("app=web").
	LabelSelector string `json:"labelSelector,omitempty"`
	// InvolvedObject filters events by the object they are about.
	InvolvedObject *ObjectRef `json:"involvedObject,omitempty"`
}

// ObjectRef names one object.
type ObjectRef struct {
	Kind      string `json:"kind"`
	Namespace string `json:"namespace,omitempty"`
	Name      string `json:"name"`
}

// GetResult is the result of a get: desired objects, pods with their status.
// Secrets carry their keys and sizes only; so do ConfigMaps in a listing
// (a get without a name), whose data is read one ConfigMap at a time.
type GetResult struct {
	Pods       []*v1.Pod       `json:"pods"`
	ConfigMaps []*v1.ConfigMap `json:"configMaps"`
	Secrets    []*v1.Secret    `json:"secrets"`
}

// Placeholders stand for a value get does not show: every value of a
// Secret, and each value of a ConfigMap in a listing. An object holding one
// is output of get, never input: apply refuses it naming the key, so a
// round trip through get cannot overwrite the real value with its size.

// Redacted is the placeholder of a Secret value of n bytes.
func Redacted(n int) string { return fmt.Sprintf("<redacted: %d bytes>", n) }

// Omitted is the placeholder of a ConfigMap value of n bytes in a listing.
func Omitted(n int) string { return fmt.Sprintf("<omitted: %d bytes>", n) }

var placeholder = regexp.MustCompile(`^<(redacted|omitted): [0-9]+ bytes>$`)

// IsPlaceholder reports whether v is a value get shows in place of the data.
func IsPlaceholder(v []byte) bool { return len(v) < 64 && placeholder.Match(v) }
