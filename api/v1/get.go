package apiv1

import v1 "k8s.io/api/core/v1"

// Kinds a get can ask for.
const (
	KindPod       = "Pod"
	KindConfigMap = "ConfigMap"
	KindSecret    = "Secret"
)

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

// Placeholders that stand for a value get does not show. An object holding
// one is output of get, never input: apply refuses it.
const (
	RedactedFormat = "<redacted: %d bytes>" // a Secret's value
	OmittedFormat  = "<omitted: %d bytes>"  // a ConfigMap's value in a listing
)
