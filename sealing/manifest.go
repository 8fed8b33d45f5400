package sealing

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"

	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// SealManifest seals every Secret of a manifest (YAML or JSON, one or more
// documents, Lists too) to the recipients and returns the manifest and how
// many Secrets it sealed. A Secret without a namespace is given
// defaultNamespace, the one the node will put it in: its values are bound
// to it, so the sealed Secret names it. The recipients are asked for (once) only when a
// Secret needs them. A manifest without a Secret comes back as it is;
// one with Secrets is re-encoded (JSON for one document, YAML documents
// otherwise). Secrets already sealed are left alone; stringData is folded
// into data first (stringData wins, as in the API server).
func SealManifest(payload []byte, defaultNamespace string, recipients func() ([]Recipient, error)) ([]byte, int, error) {
	if defaultNamespace == "" {
		return nil, 0, errors.New("sealing: no default namespace")
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(payload), 4096)
	var docs []map[string]any
	for {
		var doc map[string]any
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, 0, fmt.Errorf("reading the manifest to seal its Secrets: %w", err)
		}
		if doc != nil {
			docs = append(docs, doc)
		}
	}
	sealed := 0
	var to []Recipient
	lookup := func() ([]Recipient, error) {
		if to != nil {
			return to, nil
		}
		var err error
		if to, err = recipients(); err == nil && len(to) == 0 {
			err = errors.New("no sealing key to seal to")
		}
		return to, err
	}
	for i, doc := range docs {
		n, err := sealDoc(doc, defaultNamespace, lookup)
		if err != nil {
			return nil, 0, fmt.Errorf("document %d: %w", i+1, err)
		}
		sealed += n
	}
	if sealed == 0 {
		return payload, 0, nil
	}
	if len(docs) == 1 {
		out, err := json.Marshal(docs[0])
		return out, sealed, err
	}
	var b bytes.Buffer
	for i, doc := range docs {
		y, err := yaml.Marshal(doc)
		if err != nil {
			return nil, 0, err
		}
		if i > 0 {
			b.WriteString("---\n")
		}
		b.Write(y)
	}
	return b.Bytes(), sealed, nil
}

func sealDoc(doc map[string]any, defaultNamespace string, to func() ([]Recipient, error)) (int, error) {
	switch doc["kind"] {
	case "Secret":
		return sealSecret(doc, defaultNamespace, to)
	case "List":
		items, _ := doc["items"].([]any)
		n := 0
		for j, it := range items {
			m, ok := it.(map[string]any)
			if !ok {
				continue
			}
			k, err := sealDoc(m, defaultNamespace, to)
			if err != nil {
				return 0, fmt.Errorf("item %d: %w", j+1, err)
			}
			n += k
		}
		return n, nil
	}
	return 0, nil
}

// sealSecret seals one Secret given as decoded JSON.
func sealSecret(sec map[string]any, defaultNamespace string, recipients func() ([]Recipient, error)) (int, error) {
	meta, _ := sec["metadata"].(map[string]any)
	name, _ := meta["name"].(string)
	if name == "" {
		return 0, errors.New("a Secret without metadata.name cannot be sealed")
	}
	namespace, _ := meta["namespace"].(string)
	if namespace == "" {
		namespace = defaultNamespace
	}
	annotations, _ := meta["annotations"].(map[string]any)
	if _, done := annotations[AnnotationSealedTo]; done {
		return 0, nil
	}
	to, err := recipients()
	if err != nil {
		return 0, err
	}
	values := map[string][]byte{}
	if data, ok := sec["data"].(map[string]any); ok {
		for k, v := range data {
			s, ok := v.(string)
			if !ok {
				return 0, fmt.Errorf("Secret %s: data.%s is not a base64 string", name, k)
			}
			b, err := base64.StdEncoding.DecodeString(s)
			if err != nil {
				return 0, fmt.Errorf("Secret %s: data.%s is not base64: %w", name, k, err)
			}
			values[k] = b
		}
	}
	if sd, ok := sec["stringData"].(map[string]any); ok {
		for k, v := range sd {
			s, ok := v.(string)
			if !ok {
				return 0, fmt.Errorf("Secret %s: stringData.%s is not a string", name, k)
			}
			values[k] = []byte(s)
		}
	}
	out := make(map[string]any, len(values))
	for k, v := range values {
		s, err := SealValue(to, namespace, name, k, v)
		if err != nil {
			return 0, fmt.Errorf("Secret %s: %w", name, err)
		}
		out[k] = base64.StdEncoding.EncodeToString(s)
	}
	ids := make([]string, len(to))
	for i, r := range to {
		ids[i] = r.KeyID()
	}
	sort.Strings(ids)
	if meta == nil {
		meta = map[string]any{}
		sec["metadata"] = meta
	}
	if annotations == nil {
		annotations = map[string]any{}
		meta["annotations"] = annotations
	}
	annotations[AnnotationSealedTo] = strings.Join(ids, ",")
	meta["namespace"] = namespace
	sec["data"] = out
	delete(sec, "stringData")
	return 1, nil
}

// To is the recipients argument of SealManifest for recipients known already.
func To(rs ...Recipient) func() ([]Recipient, error) {
	return func() ([]Recipient, error) { return rs, nil }
}
