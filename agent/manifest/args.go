package manifest

import (
	"bytes"
	"errors"
	"fmt"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	kjson "sigs.k8s.io/json"

	apiv1 "github.com/mqlet/mqlet/api/v1"
)

// DefaultNamespace is used when an object or reference names none.
const DefaultNamespace = "default"

// DecodeArgs decodes the small argument object of a verb (YAML or JSON) into
// into, a pointer to a struct with json tags. Unknown and duplicate fields
// are errors naming the field. An empty payload leaves into untouched, so
// verbs whose arguments are all optional accept it.
func DecodeArgs(payload []byte, into any) error {
	trimmed := bytes.TrimSpace(payload)
	if len(trimmed) == 0 {
		return nil
	}
	js := trimmed
	if trimmed[0] != '{' {
		var empty bool
		var err error
		js, empty, err = yamlDocumentToJSON(trimmed, &payloadBounds{tree: newTreeBounds()})
		if err != nil {
			return fmt.Errorf("decode arguments: %w", err)
		}
		if empty {
			return nil
		}
	} else {
		if _, err := checkJSON(trimmed); err != nil {
			return fmt.Errorf("decode arguments: %w", err)
		}
		if err := checkSingleJSONValue(trimmed); err != nil {
			return fmt.Errorf("decode arguments: %w", err)
		}
	}
	strictErrs, err := kjson.UnmarshalStrict(js, into)
	if err != nil {
		return fmt.Errorf("decode arguments: %w", err)
	}
	if len(strictErrs) > 0 {
		return fmt.Errorf("decode arguments: %w", joinFieldErrors(strictErrs))
	}
	return nil
}

// ObjectRef names one object of the desired state.
type ObjectRef struct {
	Kind      string `json:"kind"`
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
}

func (r ObjectRef) String() string { return r.Kind + " " + r.Namespace + "/" + r.Name }

// DecodeRef decodes a delete payload: either the short form
// {"kind":"Pod","namespace":"default","name":"web","gracePeriodSeconds":5}
// or full manifests (anything with an apiVersion, a List, several
// documents), whose objects are named by their metadata. The grace period
// comes only from the short form. Namespaces default to "default".
func DecodeRef(payload []byte) ([]ObjectRef, *int64, error) {
	return DecodeRefIn(payload, DefaultNamespace)
}

// DecodeRefIn is DecodeRef with namespaces defaulting to ns (the namespace
// of a namespace-scoped command).
func DecodeRefIn(payload []byte, ns string) ([]ObjectRef, *int64, error) {
	short, err := isShortRef(payload)
	if err != nil {
		return nil, nil, err
	}
	if short {
		var args apiv1.DeleteRequest
		if err := DecodeArgs(payload, &args); err != nil {
			return nil, nil, err
		}
		ref, err := deleteRef(args, ns)
		if err != nil {
			return nil, nil, err
		}
		return []ObjectRef{ref}, args.GracePeriodSeconds, nil
	}
	objs, err := Decode(payload)
	if err != nil {
		return nil, nil, err
	}
	refs := make([]ObjectRef, 0, len(objs))
	for i, obj := range objs {
		ref, err := refIn(obj, ns)
		if err != nil {
			return nil, nil, fmt.Errorf("object %d: %w", i+1, err)
		}
		refs = append(refs, ref)
	}
	return refs, nil, nil
}

// deleteRef checks the short form and returns the reference it names.
func deleteRef(a apiv1.DeleteRequest, defaultNS string) (ObjectRef, error) {
	kind, ok := canonicalKind(a.Kind)
	if !ok {
		return ObjectRef{}, fmt.Errorf("kind %q: must be Pod, ConfigMap or Secret", a.Kind)
	}
	if a.Name == "" {
		return ObjectRef{}, errors.New(`missing "name"`)
	}
	if a.GracePeriodSeconds != nil && *a.GracePeriodSeconds < 0 {
		return ObjectRef{}, fmt.Errorf("gracePeriodSeconds %d: must not be negative", *a.GracePeriodSeconds)
	}
	ns := a.Namespace
	if ns == "" {
		ns = defaultNS
	}
	return ObjectRef{Kind: kind, Namespace: ns, Name: a.Name}, nil
}

// RefOf names a decoded object; its namespace defaults to "default".
func RefOf(obj runtime.Object) (ObjectRef, error) { return refIn(obj, DefaultNamespace) }

// refIn names a decoded object; its namespace defaults to defaultNS.
func refIn(obj runtime.Object, defaultNS string) (ObjectRef, error) {
	var kind string
	switch obj.(type) {
	case *v1.Pod:
		kind = KindPod
	case *v1.ConfigMap:
		kind = KindConfigMap
	case *v1.Secret:
		kind = KindSecret
	default:
		return ObjectRef{}, fmt.Errorf("unsupported object type %T", obj)
	}
	m, err := meta.Accessor(obj)
	if err != nil {
		return ObjectRef{}, fmt.Errorf("read metadata of %s: %w", kind, err)
	}
	if m.GetName() == "" {
		return ObjectRef{}, fmt.Errorf(`%s: missing "metadata.name"`, kind)
	}
	ns := m.GetNamespace()
	if ns == "" {
		ns = defaultNS
	}
	return ObjectRef{Kind: kind, Namespace: ns, Name: m.GetName()}, nil
}

// canonicalKind accepts kinds in any letter case, singular or plural.
func canonicalKind(kind string) (string, bool) {
	switch strings.ToLower(kind) {
	case "pod", "pods":
		return KindPod, true
	case "configmap", "configmaps":
		return KindConfigMap, true
	case "secret", "secrets":
		return KindSecret, true
	}
	return "", false
}

// isShortRef reports whether a delete payload is the short form: a single
// document without apiVersion.
func isShortRef(payload []byte) (bool, error) {
	docs, err := splitDocuments(payload)
	if err != nil {
		return false, err
	}
	if len(docs) != 1 {
		return false, nil
	}
	var probe struct {
		APIVersion *string `json:"apiVersion"`
	}
	if err := kjson.UnmarshalCaseSensitivePreserveInts(docs[0].json, &probe); err != nil {
		return false, fmt.Errorf("decode delete payload: %w", err)
	}
	return probe.APIVersion == nil, nil
}
