package manifest

import (
	"encoding/json"
	"testing"

	apiequality "k8s.io/apimachinery/pkg/api/equality"
)

func addSeeds(f *testing.F) {
	for _, name := range []string{"pod.yaml", "multi.yaml", "list.json", "delete.json"} {
		f.Add(readTestdata(f, name))
	}
	f.Add([]byte("apiVersion: v1\nkind: Pod\nmetadata:\n  name: a\n  name: b\n"))
	f.Add([]byte(`{"apiVersion":"v1","kind":"List","items":[{"apiVersion":"v1","kind":"List"}]}`))
	f.Add([]byte("---\n---\n"))
	f.Add([]byte(`{"kind":"pod","name":"x"}`))
}

// FuzzDecode checks that Decode never panics and that whatever it accepts
// re-encodes to JSON that decodes back to the same objects.
func FuzzDecode(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, payload []byte) {
		objs, err := Decode(payload)
		if err != nil {
			return
		}
		if len(objs) == 0 {
			t.Fatal("Decode returned no objects and no error")
		}
		for i, obj := range objs {
			js, err := json.Marshal(obj)
			if err != nil {
				t.Fatalf("object %d (%T) does not re-encode: %v", i, obj, err)
			}
			again, err := Decode(js)
			if err != nil {
				t.Fatalf("object %d re-encoded as %s does not decode: %v", i, js, err)
			}
			if len(again) != 1 || !apiequality.Semantic.DeepEqual(obj, again[0]) {
				t.Fatalf("object %d changed through re-encoding:\n%#v\n%#v", i, obj, again)
			}
		}
	})
}

// FuzzDecodeRef checks that DecodeRef never panics and only returns complete
// references.
func FuzzDecodeRef(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, payload []byte) {
		refs, grace, err := DecodeRef(payload)
		if err != nil {
			return
		}
		if len(refs) == 0 {
			t.Fatal("DecodeRef returned no references and no error")
		}
		for _, r := range refs {
			if r.Name == "" || r.Namespace == "" {
				t.Fatalf("incomplete reference %+v", r)
			}
			if k, ok := canonicalKind(r.Kind); !ok || k != r.Kind {
				t.Fatalf("bad kind in %+v", r)
			}
		}
		if grace != nil && *grace < 0 {
			t.Fatalf("negative grace %d", *grace)
		}
	})
}
