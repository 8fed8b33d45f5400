// Package manifest turns command payloads into Kubernetes objects.
//
// Payloads are YAML or JSON: one Pod, ConfigMap or Secret, a v1 List of them,
// or several YAML documents separated by "---". Decoding is strict, like
// kubectl's strict field validation: an unknown or duplicated field is an
// error that names the field path, so a typo in a manifest is reported
// instead of silently ignored. Document numbers in errors count from 1 in the
// order the documents appear; List items are named items[i].
package manifest

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer/json"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// Supported kinds, all in apiVersion v1.
const (
	KindPod       = "Pod"
	KindConfigMap = "ConfigMap"
	KindSecret    = "Secret"
	KindList      = "List"
)

// ErrEmpty is returned (wrapped) when a payload holds no object at all.
var ErrEmpty = errors.New("payload holds no object")

// codec decodes v1 JSON strictly. It is built once and only read afterwards.
var codec = newCodec()

func newCodec() *json.Serializer {
	scheme := runtime.NewScheme()
	scheme.AddKnownTypes(v1.SchemeGroupVersion, &v1.Pod{}, &v1.ConfigMap{}, &v1.Secret{}, &v1.List{})
	return json.NewSerializerWithOptions(json.DefaultMetaFactory, scheme, scheme,
		json.SerializerOptions{Strict: true})
}

// Decode decodes every object in payload. The objects are *v1.Pod,
// *v1.ConfigMap or *v1.Secret with their TypeMeta set, in payload order
// (List items in place of their List).
func Decode(payload []byte) ([]runtime.Object, error) {
	docs, err := splitDocuments(payload)
	if err != nil {
		return nil, err
	}
	var objs []runtime.Object
	for _, d := range docs {
		got, err := decodeDocument(d.json)
		if err != nil {
			if len(docs) > 1 {
				return nil, fmt.Errorf("document %d: %w", d.index, err)
			}
			return nil, err
		}
		objs = append(objs, got...)
	}
	if len(objs) == 0 {
		return nil, fmt.Errorf("decode manifest: %w (an empty List)", ErrEmpty)
	}
	return objs, nil
}

// document is one non-empty document of a payload, already converted to JSON
// and checked for duplicate fields.
type document struct {
	index int // 1-based position in the payload, counting empty documents too
	json  []byte
}

// splitDocuments cuts payload into documents and converts each to JSON.
// Empty documents are skipped; a payload with none is an error.
func splitDocuments(payload []byte) ([]document, error) {
	trimmed := bytes.TrimSpace(payload)
	if len(trimmed) == 0 {
		return nil, fmt.Errorf("decode manifest: %w (empty payload)", ErrEmpty)
	}
	if trimmed[0] == '{' {
		// JSON goes to the strict JSON decoder as is: converting it through
		// YAML would drop duplicate fields before they could be reported.
		objects, err := checkJSON(trimmed)
		if err != nil {
			return nil, err
		}
		if err := checkObjects(objects); err != nil {
			return nil, err
		}
		if err := checkSingleJSONValue(trimmed); err != nil {
			return nil, err
		}
		return []document{{index: 1, json: trimmed}}, nil
	}
	reader := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(payload)))
	var docs []document
	total := &payloadBounds{tree: newTreeBounds()}
	for index := 1; ; index++ {
		raw, err := reader.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("read YAML document %d: %w", index, err)
		}
		js, empty, err := yamlDocumentToJSON(raw, total)
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", index, err)
		}
		if empty {
			continue
		}
		docs = append(docs, document{index: index, json: js})
	}
	if len(docs) == 0 {
		return nil, fmt.Errorf("decode manifest: %w (only empty documents)", ErrEmpty)
	}
	return docs, nil
}

// payloadBounds accumulates the expansion and object count of a payload's
// documents.
type payloadBounds struct {
	tree    *treeBounds
	sum     expansion
	objects int
}

// yamlDocumentToJSON converts one YAML document to JSON, reporting duplicate
// keys with their field paths. empty is true for a document with no content.
// The document is measured first and counted into total; one beyond the
// bounds is never converted.
func yamlDocumentToJSON(raw []byte, total *payloadBounds) (js []byte, empty bool, err error) {
	// The tree costs about 250 bytes a value: a document denser than the
	// values left is refused before it is built.
	if err := checkYAMLDensity(raw, MaxNodes-total.sum.nodes); err != nil {
		return nil, false, err
	}
	e, objects, err := checkYAMLDocument(raw, total.tree)
	if err != nil {
		return nil, false, err
	}
	if err := total.sum.add(e); err != nil {
		return nil, false, err
	}
	total.objects += objects
	if err := checkObjects(total.objects); err != nil {
		return nil, false, err
	}
	js, err = yaml.YAMLToJSON(raw)
	if err != nil {
		return nil, false, fmt.Errorf("invalid YAML: %w", err)
	}
	if t := bytes.TrimSpace(js); len(t) == 0 || bytes.Equal(t, []byte("null")) {
		return nil, true, nil
	}
	if js[0] != '{' {
		return nil, false, fmt.Errorf("a document must be an object, not %s", describeJSON(js))
	}
	if dups := yamlDuplicateFields(raw); len(dups) > 0 {
		return nil, false, joinFieldErrors(dups)
	}
	return js, false, nil
}

func describeJSON(js []byte) string {
	switch js[0] {
	case '[':
		return "a list"
	case '"':
		return "a string"
	default:
		return "a scalar"
	}
}

// decodeDocument decodes one JSON document: a supported object or a List.
func decodeDocument(js []byte) ([]runtime.Object, error) {
	gvk, err := json.DefaultMetaFactory.Interpret(js)
	if err != nil {
		return nil, fmt.Errorf("read apiVersion and kind: %w", err)
	}
	if err := checkKind(*gvk, true); err != nil {
		return nil, err
	}
	obj, err := decodeStrict(js)
	if err != nil {
		return nil, err
	}
	list, ok := obj.(*v1.List)
	if !ok {
		return []runtime.Object{obj}, nil
	}
	objs := make([]runtime.Object, 0, len(list.Items))
	for i, item := range list.Items {
		raw := bytes.TrimSpace(item.Raw)
		if len(raw) == 0 || raw[0] != '{' {
			return nil, fmt.Errorf("items[%d]: an item must be an object", i)
		}
		igvk, err := json.DefaultMetaFactory.Interpret(raw)
		if err != nil {
			return nil, fmt.Errorf("items[%d]: read apiVersion and kind: %w", i, err)
		}
		if err := checkKind(*igvk, false); err != nil {
			return nil, fmt.Errorf("items[%d]: %w", i, err)
		}
		itemObj, err := decodeStrict(raw)
		if err != nil {
			return nil, fmt.Errorf("items[%d]: %w", i, err)
		}
		objs = append(objs, itemObj)
	}
	return objs, nil
}

// checkKind accepts v1 Pod, ConfigMap and Secret, and List where allowed.
func checkKind(gvk schema.GroupVersionKind, allowList bool) error {
	apiVersion := gvk.GroupVersion().String()
	if gvk.Kind == "" {
		return errors.New(`missing "kind"`)
	}
	if gvk.Version == "" {
		return fmt.Errorf(`kind %q: missing "apiVersion"`, gvk.Kind)
	}
	supported := gvk.Kind == KindPod || gvk.Kind == KindConfigMap || gvk.Kind == KindSecret ||
		(allowList && gvk.Kind == KindList)
	if !supported || apiVersion != "v1" {
		want := "v1 Pod, ConfigMap or Secret"
		if allowList {
			want = "v1 Pod, ConfigMap, Secret or List"
		}
		return fmt.Errorf("unsupported kind %q (apiVersion %q): only %s are accepted", gvk.Kind, apiVersion, want)
	}
	return nil
}

// decodeStrict decodes one supported object, turning strict decoding
// failures into one error listing every offending field.
func decodeStrict(js []byte) (runtime.Object, error) {
	obj, _, err := codec.Decode(js, nil, nil)
	if err != nil {
		if strict, ok := runtime.AsStrictDecodingError(err); ok {
			return nil, joinFieldErrors(strict.Errors())
		}
		return nil, fmt.Errorf("decode object: %w", err)
	}
	return obj, nil
}

// FieldError lists the unknown or duplicate fields of one object.
type FieldError struct {
	Problems []string // e.g. `unknown field "spec.containers[0].imagee"`
}

func (e *FieldError) Error() string { return strings.Join(e.Problems, ", ") }

func joinFieldErrors(errs []error) error {
	fe := &FieldError{}
	for _, err := range errs {
		fe.Problems = append(fe.Problems, err.Error())
	}
	return fe
}

// checkSingleJSONValue rejects trailing content after a JSON object, which a
// decoder would otherwise ignore.
func checkSingleJSONValue(data []byte) error {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), len(data))
	var first, second any
	if err := dec.Decode(&first); err != nil {
		return fmt.Errorf("invalid JSON: %w", err)
	}
	if err := dec.Decode(&second); !errors.Is(err, io.EOF) {
		return errors.New("invalid JSON: more than one value; send a v1 List or multi-document YAML for several objects")
	}
	return nil
}
