package manifest

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

func readTestdata(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatalf("read testdata: %v", err)
	}
	return b
}

// describe renders decoded objects as "Kind ns/name" for compact comparison.
func describe(t *testing.T, objs []runtime.Object) []string {
	t.Helper()
	var out []string
	for _, o := range objs {
		ref, err := RefOf(o)
		if err != nil {
			t.Fatalf("RefOf(%T): %v", o, err)
		}
		out = append(out, ref.String())
	}
	return out
}

func TestDecodeAccepted(t *testing.T) {
	tests := []struct {
		name    string
		payload []byte
		want    []string
	}{
		{"single pod YAML", readTestdata(t, "pod.yaml"), []string{"Pod default/web"}},
		{"multi-document YAML with an empty document", readTestdata(t, "multi.yaml"),
			[]string{"ConfigMap default/web-config", "Secret default/web-secret", "Pod default/web"}},
		{"JSON List", readTestdata(t, "list.json"), []string{"ConfigMap edge/cfg", "Pod edge/sensor"}},
		{"single JSON secret", []byte(`{"apiVersion":"v1","kind":"Secret","metadata":{"name":"s"},"data":{"k":"dmFsdWU="}}`),
			[]string{"Secret default/s"}},
		{"YAML List", []byte("apiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: ConfigMap\n  metadata: {name: a}\n"),
			[]string{"ConfigMap default/a"}},
		{"leading document separator", []byte("---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n---\n"),
			[]string{"ConfigMap default/a"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			objs, err := Decode(tt.payload)
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			got := describe(t, objs)
			if strings.Join(got, ";") != strings.Join(tt.want, ";") {
				t.Fatalf("got %v, want %v", got, tt.want)
			}
		})
	}
}

func TestDecodeKeepsContent(t *testing.T) {
	objs, err := Decode(readTestdata(t, "multi.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	sec := objs[1].(*v1.Secret)
	if sec.StringData["password"] != "hunter2" || sec.Kind != "Secret" || sec.APIVersion != "v1" {
		t.Fatalf("secret decoded wrongly: %+v", sec)
	}
	pod := objs[2].(*v1.Pod)
	if pod.Spec.Containers[0].Image != "nginx:1.27" || pod.Spec.Containers[0].EnvFrom[0].ConfigMapRef.Name != "web-config" {
		t.Fatalf("pod decoded wrongly: %+v", pod.Spec)
	}
	objs, err = Decode(readTestdata(t, "pod.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	lim := objs[0].(*v1.Pod).Spec.Containers[0].Resources.Limits
	if lim.Memory().String() != "64Mi" || lim.Cpu().MilliValue() != 100 {
		t.Fatalf("limits decoded wrongly: %v", lim)
	}
}

func TestDecodeRejected(t *testing.T) {
	tests := []struct {
		name    string
		payload string
		want    []string // substrings of the error
	}{
		{"empty payload", "  \n", []string{"no object", "empty payload"}},
		{"only empty documents", "---\n# c\n---\n", []string{"no object"}},
		{"empty List", `{"apiVersion":"v1","kind":"List","items":[]}`, []string{"no object"}},
		{"unknown field YAML", "apiVersion: v1\nkind: Pod\nmetadata: {name: a}\nspec:\n  containers:\n  - name: c\n    imagee: x\n",
			[]string{`unknown field "spec.containers[0].imagee"`}},
		{"unknown field JSON", `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"a"},"spec":{"containers":[{"name":"c","imagee":"x"}]}}`,
			[]string{`unknown field "spec.containers[0].imagee"`}},
		{"two unknown fields", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a, nam: b}\ndatta: {}\n",
			[]string{`unknown field "metadata.nam"`, `unknown field "datta"`}},
		{"wrong case field", `{"apiVersion":"v1","kind":"ConfigMap","Metadata":{"name":"a"}}`, []string{`unknown field "Metadata"`}},
		{"duplicate field YAML", "apiVersion: v1\nkind: Pod\nmetadata:\n  name: a\n  name: b\nspec: {containers: [{name: c, image: x}]}\n",
			[]string{`duplicate field "metadata.name"`}},
		{"duplicate field JSON", `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"a","name":"b"}}`,
			[]string{`duplicate field "metadata.name"`}},
		{"duplicate in YAML list item", "apiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: ConfigMap\n  metadata: {name: a}\n  data: {}\n  data: {}\n",
			[]string{`duplicate field "items[0].data"`}},
		{"unsupported kind second document", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n---\napiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\n",
			[]string{"document 2", `"Deployment"`, `"apps/v1"`}},
		{"wrong apiVersion", "apiVersion: v2\nkind: Pod\nmetadata: {name: a}\n", []string{`unsupported kind "Pod"`, `"v2"`}},
		{"missing kind", "apiVersion: v1\nmetadata: {name: a}\n", []string{`missing "kind"`}},
		{"missing apiVersion", "kind: Pod\nmetadata: {name: a}\n", []string{`missing "apiVersion"`}},
		{"unsupported List item", `{"apiVersion":"v1","kind":"List","items":[{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a"}},{"apiVersion":"v1","kind":"Service","metadata":{"name":"s"}}]}`,
			[]string{"items[1]", `"Service"`}},
		{"nested List", `{"apiVersion":"v1","kind":"List","items":[{"apiVersion":"v1","kind":"List","items":[]}]}`,
			[]string{"items[0]", `"List"`}},
		{"unknown field in List item with index", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n---\n" +
			`{"apiVersion":"v1","kind":"List","items":[{"apiVersion":"v1","kind":"Secret","metadata":{"name":"s"},"dta":{}}]}`,
			[]string{"document 2", "items[0]", `unknown field "dta"`}},
		{"document is a list", "- a\n- b\n", []string{"must be an object"}},
		{"invalid YAML in third document", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n---\n# empty\n---\nkind: [\n", []string{"document 3", "invalid YAML"}},
		{"trailing JSON", `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a"}} {"x":1}`, []string{"more than one value"}},
		{"type mismatch", `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a"},"data":{"k":1}}`, []string{"decode object"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			objs, err := Decode([]byte(tt.payload))
			if err == nil {
				t.Fatalf("Decode accepted it: %v", objs)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func TestDecodeEmptyIsErrEmpty(t *testing.T) {
	_, err := Decode(nil)
	if !errors.Is(err, ErrEmpty) {
		t.Fatalf("Decode(nil) = %v, want ErrEmpty", err)
	}
}

func TestDecodeFieldErrorType(t *testing.T) {
	_, err := Decode([]byte(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a"},"x":1,"y":2}`))
	var fe *FieldError
	if !errors.As(err, &fe) || len(fe.Problems) != 2 {
		t.Fatalf("want a FieldError with 2 problems, got %#v", err)
	}
}

type getArgs struct {
	Kind      string `json:"kind,omitempty"`
	Namespace string `json:"namespace,omitempty"`
	Name      string `json:"name,omitempty"`
	TailLines *int64 `json:"tailLines,omitempty"`
}

func TestDecodeArgs(t *testing.T) {
	tests := []struct {
		name    string
		payload string
		want    getArgs
		wantErr string
	}{
		{"empty object", `{}`, getArgs{}, ""},
		{"empty payload", ``, getArgs{}, ""},
		{"JSON", `{"kind":"Pod","name":"web","tailLines":10}`, getArgs{Kind: "Pod", Name: "web", TailLines: ptr(int64(10))}, ""},
		{"YAML", "kind: Pod\nnamespace: edge\nname: web\n", getArgs{Kind: "Pod", Namespace: "edge", Name: "web"}, ""},
		{"unknown field", `{"nmae":"web"}`, getArgs{}, `unknown field "nmae"`},
		{"duplicate JSON", `{"name":"a","name":"b"}`, getArgs{}, `duplicate field "name"`},
		{"duplicate YAML", "name: a\nname: b\n", getArgs{}, `duplicate field "name"`},
		{"wrong type", `{"tailLines":"ten"}`, getArgs{}, "decode arguments"},
		{"not an object", `[1,2]`, getArgs{}, "must be an object"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got getArgs
			err := DecodeArgs([]byte(tt.payload), &got)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want it to contain %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("DecodeArgs: %v", err)
			}
			if got.Kind != tt.want.Kind || got.Namespace != tt.want.Namespace || got.Name != tt.want.Name ||
				(got.TailLines == nil) != (tt.want.TailLines == nil) || (got.TailLines != nil && *got.TailLines != *tt.want.TailLines) {
				t.Fatalf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

func TestDecodeRef(t *testing.T) {
	tests := []struct {
		name      string
		payload   string
		want      []string
		wantGrace *int64
		wantErr   string
	}{
		{"short form", string(readTestdata(t, "delete.json")), []string{"Pod default/web"}, ptr(int64(5)), ""},
		{"short form default namespace", `{"kind":"configmap","name":"cfg"}`, []string{"ConfigMap default/cfg"}, nil, ""},
		{"short form YAML", "kind: Secret\nnamespace: edge\nname: s\n", []string{"Secret edge/s"}, nil, ""},
		{"manifest", string(readTestdata(t, "pod.yaml")), []string{"Pod default/web"}, nil, ""},
		{"multi-document manifest", string(readTestdata(t, "multi.yaml")),
			[]string{"ConfigMap default/web-config", "Secret default/web-secret", "Pod default/web"}, nil, ""},
		{"List", string(readTestdata(t, "list.json")), []string{"ConfigMap edge/cfg", "Pod edge/sensor"}, nil, ""},
		{"short form bad kind", `{"kind":"Deployment","name":"d"}`, nil, nil, `kind "Deployment"`},
		{"short form missing name", `{"kind":"Pod"}`, nil, nil, `missing "name"`},
		{"short form negative grace", `{"kind":"Pod","name":"a","gracePeriodSeconds":-1}`, nil, nil, "must not be negative"},
		{"short form unknown field", `{"kind":"Pod","name":"a","grace":1}`, nil, nil, `unknown field "grace"`},
		{"manifest without name", "apiVersion: v1\nkind: Pod\nmetadata: {}\n", nil, nil, `missing "metadata.name"`},
		{"empty", "", nil, nil, "no object"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			refs, grace, err := DecodeRef([]byte(tt.payload))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want it to contain %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("DecodeRef: %v", err)
			}
			var got []string
			for _, r := range refs {
				got = append(got, r.String())
			}
			if strings.Join(got, ";") != strings.Join(tt.want, ";") {
				t.Fatalf("refs %v, want %v", got, tt.want)
			}
			if (grace == nil) != (tt.wantGrace == nil) || (grace != nil && *grace != *tt.wantGrace) {
				t.Fatalf("grace %v, want %v", grace, tt.wantGrace)
			}
		})
	}
}
