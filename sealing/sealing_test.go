package sealing

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

const value = "s3cret-sealed-5e1f"

func node(t testing.TB) (*Identity, Recipient) {
	t.Helper()
	id, err := NewIdentity()
	if err != nil {
		t.Fatal(err)
	}
	r, err := ParseRecipient(id.Recipient())
	if err != nil {
		t.Fatal(err)
	}
	return id, r
}

// decodeSecrets reads every Secret of a manifest the way the agent does
// (strict JSON after YAML).
func decodeSecrets(t *testing.T, manifest []byte) []*v1.Secret {
	t.Helper()
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(manifest), 4096)
	var out []*v1.Secret
	for {
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			break
		}
		var kind struct {
			Kind  string            `json:"kind"`
			Items []json.RawMessage `json:"items"`
		}
		if err := json.Unmarshal(raw, &kind); err != nil {
			t.Fatal(err)
		}
		docs := []json.RawMessage{raw}
		if kind.Kind == "List" {
			docs = kind.Items
		}
		for _, d := range docs {
			if !bytes.Contains(d, []byte(`"kind":"Secret"`)) {
				continue
			}
			var s v1.Secret
			if err := json.Unmarshal(d, &s); err != nil {
				t.Fatal(err)
			}
			if s.Kind == "Secret" {
				out = append(out, &s)
			}
		}
	}
	return out
}

func TestSealManifestRoundTrip(t *testing.T) {
	id, r := node(t)
	manifest := []byte(`apiVersion: v1
kind: ConfigMap
metadata: {name: cfg}
data: {a: b}
---
apiVersion: v1
kind: Secret
metadata: {name: creds, namespace: edge, annotations: {team: x}}
data: {pw: ` + "czNjcmV0LXNlYWxlZC01ZTFm" + `}
stringData: {token: ` + value + `-token}
---
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Secret
  metadata: {name: other}
  stringData: {pw: ` + value + `}
`)
	out, n, err := SealManifest(manifest, "default", To(r))
	if err != nil || n != 2 {
		t.Fatalf("SealManifest: %d sealed, %v", n, err)
	}
	for _, v := range []string{value, "czNjcmV0LXNlYWxlZC01ZTFm"} {
		if bytes.Contains(out, []byte(v)) {
			t.Fatalf("the sealed manifest holds %q:\n%s", v, out)
		}
	}
	secrets := decodeSecrets(t, out)
	if len(secrets) != 2 {
		t.Fatalf("%d secrets in the sealed manifest", len(secrets))
	}
	want := []map[string]string{{"pw": value, "token": value + "-token"}, {"pw": value}}
	for i, s := range secrets {
		if !IsSealed(s) || s.StringData != nil {
			t.Fatalf("secret %d not sealed: %+v", i, s)
		}
		if err := id.UnsealSecret(s); err != nil {
			t.Fatalf("unseal %s: %v", s.Name, err)
		}
		if IsSealed(s) || len(s.Data) != len(want[i]) {
			t.Fatalf("unsealed %s: %+v", s.Name, s)
		}
		for k, v := range want[i] {
			if string(s.Data[k]) != v {
				t.Fatalf("%s %s = %q, want %q", s.Name, k, s.Data[k], v)
			}
		}
	}
	if secrets[0].Annotations["team"] != "x" {
		t.Fatalf("other annotations lost: %v", secrets[0].Annotations)
	}
	// No Secret: the manifest is sent as it was.
	plain := []byte(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"c"}}`)
	if got, n, err := SealManifest(plain, "default", To(r)); err != nil || n != 0 || !bytes.Equal(got, plain) {
		t.Fatalf("manifest without Secret: %q %d %v", got, n, err)
	}
}

func sealedSecret(t *testing.T, r Recipient, ns, name string) *v1.Secret {
	t.Helper()
	out, _, err := SealManifest([]byte(`{"apiVersion":"v1","kind":"Secret","metadata":{"name":"`+name+`","namespace":"`+ns+`"},"stringData":{"pw":"`+value+`"}}`), "default", To(r))
	if err != nil {
		t.Fatal(err)
	}
	return decodeSecrets(t, out)[0]
}

func TestUnsealRefusals(t *testing.T) {
	id, r := node(t)
	_, otherR := node(t)
	cases := []struct {
		name   string
		secret func() *v1.Secret
		want   string
	}{
		{"sealed to another node", func() *v1.Secret { return sealedSecret(t, otherR, "edge", "a") }, "this node's sealing key is " + id.KeyID()},
		{"value moved to another Secret", func() *v1.Secret {
			s := sealedSecret(t, r, "edge", "a")
			s.Name = "b"
			return s
		}, "sealed for another Secret or key"},
		{"value moved to another namespace", func() *v1.Secret {
			s := sealedSecret(t, r, "edge", "a")
			s.Namespace = "other"
			return s
		}, "sealed for another Secret or key"},
		{"value moved to another key", func() *v1.Secret {
			s := sealedSecret(t, r, "edge", "a")
			s.Data["pw2"] = s.Data["pw"]
			return s
		}, "sealed for another Secret or key"},
		{"annotation with another node's key on this node's values", func() *v1.Secret {
			s := sealedSecret(t, r, "edge", "a")
			s.Annotations[AnnotationSealedTo] = otherR.KeyID()
			return s
		}, "this node's sealing key is"},
		{"plain value", func() *v1.Secret {
			s := sealedSecret(t, r, "edge", "a")
			s.Data["pw"] = []byte(value)
			return s
		}, "not a sealed value"},
		{"stringData beside", func() *v1.Secret {
			s := sealedSecret(t, r, "edge", "a")
			s.StringData = map[string]string{"x": "y"}
			return s
		}, "stringData must be empty"},
		{"tampered ciphertext", func() *v1.Secret {
			s := sealedSecret(t, r, "edge", "a")
			s.Data["pw"][len(s.Data["pw"])-1] ^= 1
			return s
		}, "pw"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := c.secret()
			before, _ := json.Marshal(s)
			err := id.UnsealSecret(s)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("UnsealSecret: %v, want %q", err, c.want)
			}
			if strings.Contains(err.Error(), value) {
				t.Fatalf("the error holds the value: %v", err)
			}
			if after, _ := json.Marshal(s); !bytes.Equal(before, after) {
				t.Fatal("a refused Secret was changed")
			}
		})
	}
}

func TestIdentityFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "seal.key")
	a, err := LoadOrCreateIdentity(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v %v", fi, err)
	}
	b, err := LoadOrCreateIdentity(path)
	if err != nil || b.Recipient() != a.Recipient() || b.KeyID() != a.KeyID() || !strings.HasPrefix(a.Recipient(), "age1") {
		t.Fatalf("reloaded %v %v, want %s", b, err, a.Recipient())
	}
	if err := os.Chmod(path, 0o640); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadOrCreateIdentity(path); err == nil || !strings.Contains(err.Error(), "others may read it") {
		t.Fatalf("readable key file: %v", err)
	}
}

// BenchmarkSeal and BenchmarkUnseal: the cost per Secret of one 64-byte
// value (one X25519 agreement each side; a Secret costs this per key).
func BenchmarkSeal(b *testing.B) {
	_, r := node(b)
	v := bytes.Repeat([]byte("x"), 64)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := SealValue([]Recipient{r}, "edge", "creds", "pw", v); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkUnseal(b *testing.B) {
	id, r := node(b)
	sealed, err := SealValue([]Recipient{r}, "edge", "creds", "pw", bytes.Repeat([]byte("x"), 64))
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := id.UnsealValue("edge", "creds", "pw", sealed); err != nil {
			b.Fatal(err)
		}
	}
}

// One sealed value opens on each of several nodes (a group), with its own key.
func TestSealToSeveralNodes(t *testing.T) {
	a, ra := node(t)
	b, rb := node(t)
	_, rc := node(t)
	out, n, err := SealManifest([]byte(`{"apiVersion":"v1","kind":"Secret","metadata":{"name":"g"},"stringData":{"pw":"`+value+`"}}`), "default", To(ra, rb))
	if err != nil || n != 1 {
		t.Fatal(n, err)
	}
	for _, id := range []*Identity{a, b} {
		s := decodeSecrets(t, out)[0]
		if err := id.UnsealSecret(s); err != nil || string(s.Data["pw"]) != value {
			t.Fatalf("node %s: %v", id.KeyID(), err)
		}
	}
	s := decodeSecrets(t, out)[0]
	if !strings.Contains(s.Annotations[AnnotationSealedTo], ra.KeyID()) || strings.Contains(s.Annotations[AnnotationSealedTo], rc.KeyID()) {
		t.Fatalf("annotation %q", s.Annotations[AnnotationSealedTo])
	}
}
