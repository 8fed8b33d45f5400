package redact

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

type fakeSource struct {
	version uint64
	secrets []*v1.Secret
	err     error
	lists   int
}

func (f *fakeSource) SecretsVersion() uint64 { return f.version }
func (f *fakeSource) ListSecrets() ([]*v1.Secret, error) {
	f.lists++
	return f.secrets, f.err
}

func TestLiveRebuildsOnlyWhenTheVersionMoves(t *testing.T) {
	var l Live
	if l.Current().String("s3cr3t") != "s3cr3t" {
		t.Fatal("an unbound Live must scrub nothing")
	}
	src := &fakeSource{version: 1, secrets: []*v1.Secret{{StringData: map[string]string{"a": "first-value"}}}}
	l.Bind(src)
	for range 3 {
		if got := l.Current().String("x first-value"); got != "x "+Placeholder {
			t.Fatalf("got %q", got)
		}
	}
	if src.lists != 1 {
		t.Fatalf("listed %d times for one version, want 1", src.lists)
	}
	src.secrets = append(src.secrets, &v1.Secret{StringData: map[string]string{"b": "second-value"}})
	src.version = 2
	if got := l.Current().String("second-value"); got != Placeholder {
		t.Fatalf("a secret added later is not scrubbed: %q", got)
	}
	src.err, src.version = errors.New("store closed"), 3
	if got := l.Current().String("second-value"); got != Placeholder {
		t.Fatalf("a failed listing must keep the last scrubber: %q", got)
	}
}

func TestJSONScrubsValuesAndStaysValid(t *testing.T) {
	s := FromSecrets([]*v1.Secret{{StringData: map[string]string{"pw": `pa"ss<word>`, "user": "kind"}}})
	doc := []byte(`{"kind":"Event","message":"exec: \"pa\"ss\u003cword\u003e\": not found","note":"pa\"ss<word> kind","n":12345678901234567890,"list":["kind"]}` + "\n")
	got := s.JSON(doc)
	if !json.Valid(got) || !strings.HasSuffix(string(got), "\n") {
		t.Fatalf("not valid JSON with its newline: %s", got)
	}
	var m map[string]any
	if err := json.Unmarshal(got, &m); err != nil {
		t.Fatal(err)
	}
	if m["kind"] != "Event" {
		t.Fatalf("keys and unrelated values must stay: %s", got)
	}
	if strings.Contains(string(got), "pa\\\"ss") || strings.Contains(string(got), `pa"ss`) || strings.Contains(m["note"].(string), "kind") {
		t.Fatalf("secret value left: %s", got)
	}
	if !strings.Contains(string(got), "12345678901234567890") {
		t.Fatalf("numbers must keep their digits: %s", got)
	}
	clean := []byte(`{"kind":"Event"}`)
	if out := FromSecrets(nil).JSON(clean); string(out) != string(clean) {
		t.Fatal("nothing to scrub must return the doc as is")
	}
	if out := s.JSON([]byte("not json pa\"ss<word>")); string(out) != "not json "+Placeholder {
		t.Fatalf("text fallback: %q", out)
	}
}

// A binary secret quoted by Go (%q, as exec's "executable file not found"
// error quotes a command) shows its control bytes and invalid UTF-8 as \x
// escapes; neither its raw nor its JSON form matched that.
func TestGoQuotedBinarySecretIsScrubbed(t *testing.T) {
	value := "\x01\xfe\x02key-material\x7f\u00e9"
	s := FromSecrets([]*v1.Secret{{Data: map[string][]byte{"k": []byte(value)}}})
	for _, msg := range []string{
		fmt.Sprintf(`exec: %q: executable file not found in $PATH`, value),
		fmt.Sprintf(`exec: %+q: executable file not found in $PATH`, value),
	} {
		if got := s.String(msg); strings.Contains(got, "key-material") {
			t.Errorf("Go-quoted binary secret left: %s", got)
		}
		doc, _ := json.Marshal(map[string]string{"message": msg})
		if got := s.JSON(doc); strings.Contains(string(got), "key-material") {
			t.Errorf("Go-quoted binary secret left in JSON: %s", got)
		}
	}
}

// The cost a scrubbed log line or message pays: 100 secrets, a typical
// zerolog line without a value (the common case), and one with a value.
func BenchmarkScrubJSONLine(b *testing.B) {
	var secrets []*v1.Secret
	for i := range 100 {
		secrets = append(secrets, &v1.Secret{StringData: map[string]string{"pw": fmt.Sprintf("secret-value-%03d-xyz", i)}})
	}
	s := FromSecrets(secrets)
	clean := []byte(`{"level":"info","node":"gw1","component":"podworker","pod":"default/web","uid":"0b6c1a52-7d1e-4c55-9a3e-2f1d8e4b7a01","time":"2026-12-01T09:00:00Z","message":"pod synced"}` + "\n")
	dirty := []byte(`{"level":"warn","node":"gw1","component":"podworker","error":"exec: \"secret-value-042-xyz\": executable file not found in $PATH","time":"2026-12-01T09:00:00Z","message":"pod sync failed"}` + "\n")
	for name, line := range map[string][]byte{"clean": clean, "with-value": dirty} {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_ = s.JSON(line)
			}
		})
	}
}

// A deleted or rotated secret's old value stays in the runtime's records of
// containers that ran with it; it is still scrubbed.
func TestLiveKeepsScrubbingDeletedAndRotatedValues(t *testing.T) {
	src := &fakeSource{version: 1, secrets: []*v1.Secret{
		{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "a"}, StringData: map[string]string{"pw": "old-password"}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "b"}, StringData: map[string]string{"tok": "deleted-token"}},
	}}
	var l Live
	l.Bind(src)
	_ = l.Current()
	src.secrets = []*v1.Secret{{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "a"}, StringData: map[string]string{"pw": "new-password"}}}
	src.version = 2
	got := l.Current().String("old-password deleted-token new-password")
	if got != strings.Repeat(Placeholder+" ", 2)+Placeholder {
		t.Fatalf("got %q", got)
	}
}

type podsAndRetired struct {
	fakeSource
	pods    map[string]*v1.Pod
	retired []byte
}

func (p *podsAndRetired) Pod(namespace, name string) (*v1.Pod, error) {
	if pod, ok := p.pods[namespace+"/"+name]; ok {
		return pod, nil
	}
	return nil, errors.New("not found")
}
func (p *podsAndRetired) RetiredSecrets() ([]byte, error)    { return p.retired, nil }
func (p *podsAndRetired) SetRetiredSecrets(raw []byte) error { p.retired = raw; return nil }

// A pod's text is scrubbed of the secrets it refers to, and of no other
// (else a pod printing candidates learns which is another's secret); a
// retired value stays scrubbed after a restart, kept sealed by the store.
func TestForPodScopesAndRetiredValuesSurviveARestart(t *testing.T) {
	src := &podsAndRetired{fakeSource: fakeSource{version: 1, secrets: []*v1.Secret{
		{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "mine"}, StringData: map[string]string{"pw": "my-password"}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "other"}, StringData: map[string]string{"pw": "other-password"}},
	}}, pods: map[string]*v1.Pod{"ns/p": {Spec: v1.PodSpec{Containers: []v1.Container{{Name: "c", EnvFrom: []v1.EnvFromSource{{SecretRef: &v1.SecretEnvSource{LocalObjectReference: v1.LocalObjectReference{Name: "mine"}}}}}}}}}}
	var l Live
	l.Bind(src)
	if got := l.ForPod("ns", "p").String("my-password other-password"); got != Placeholder+" other-password" {
		t.Fatalf("pod scrubber: %q", got)
	}
	if got := l.ForPod("ns", "stranger").String("my-password"); got != "my-password" {
		t.Fatalf("a pod referring to nothing: %q", got)
	}
	src.secrets = src.secrets[1:] // "mine" deleted
	src.version = 2
	if got := l.ForPod("ns", "p").String("my-password"); got != Placeholder {
		t.Fatalf("a deleted value the pod used: %q", got)
	}
	if len(src.retired) == 0 || strings.Contains(string(src.retired), "my-password") == false && !strings.Contains(string(src.retired), "bXktcGFzc3dvcmQ") {
		t.Fatalf("retired values not handed to the store: %s", src.retired)
	}
	// A restart: a new Live over the same store.
	var again Live
	again.Bind(&podsAndRetired{fakeSource: fakeSource{version: 7, secrets: src.secrets}, pods: src.pods, retired: src.retired})
	if got := again.ForPod("ns", "p").String("my-password"); got != Placeholder {
		t.Fatalf("after a restart the retired value is published: %q", got)
	}
	if got := again.Current().String("my-password"); got != Placeholder {
		t.Fatalf("after a restart the log scrubber forgot it: %q", got)
	}
	// Bounded by age.
	old := Live{now: func() time.Time { return time.Now().Add(MaxRetiredAge + time.Hour) }}
	old.Bind(&podsAndRetired{fakeSource: fakeSource{version: 8, secrets: src.secrets}, pods: src.pods, retired: src.retired})
	if got := old.Current().String("my-password"); got != "my-password" {
		t.Fatalf("a value retired longer than MaxRetiredAge: %q", got)
	}
}
