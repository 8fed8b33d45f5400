package redact

import (
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
)

func TestStringReplacesLongestFirstAndSkipsShortValues(t *testing.T) {
	s := New("abc", "s3cr3t", "s3cr3t-and-more", "s3cr3t")
	if s.Len() != 2 {
		t.Fatalf("Len = %d, want 2 (short and duplicate values ignored)", s.Len())
	}
	cases := map[string]string{
		`exec: "s3cr3t-and-more": executable file not found`: `exec: "<redacted>": executable file not found`,
		"a s3cr3t b s3cr3t":          "a <redacted> b <redacted>",
		"abc stays, it is too short": "abc stays, it is too short",
		"":                           "",
	}
	for in, want := range cases {
		if got := s.String(in); got != want {
			t.Errorf("String(%q) = %q, want %q", in, got, want)
		}
	}
	var none *Scrubber
	if none.String("s3cr3t") != "s3cr3t" || New().String("s3cr3t") != "s3cr3t" || none.Len() != 0 {
		t.Fatal("a nil or empty Scrubber must change nothing")
	}
}

var errSentinel = errors.New("sentinel")

type typed struct{ msg string }

func (e *typed) Error() string { return e.msg }

func TestErrorKeepsIsButHidesValues(t *testing.T) {
	s := New("hunter22")
	clean := fmt.Errorf("pull: %w", errSentinel)
	if got := s.Error(clean); got != clean {
		t.Fatal("an error without values must come back unchanged")
	}
	leaky := fmt.Errorf("start: %w: %w", errSentinel, &typed{msg: `exec "hunter22" not found`})
	got := s.Error(leaky)
	if strings.Contains(got.Error(), "hunter22") || !strings.Contains(got.Error(), Placeholder) {
		t.Fatalf("scrubbed message %q", got)
	}
	if !errors.Is(got, errSentinel) {
		t.Fatal("errors.Is lost the sentinel")
	}
	var inner *typed
	if errors.As(got, &inner) {
		t.Fatalf("errors.As reached the original value %q", inner.msg)
	}
	if s.Error(nil) != nil {
		t.Fatal("Error(nil) != nil")
	}
}

func TestFromSecretsCoversDataStringDataBase64AndDockerConfig(t *testing.T) {
	docker := `{"auths":{"reg.local":{"username":"u","password":"regpass99","auth":"dTpyZWdwYXNzOTk="}}}`
	s := FromSecrets([]*v1.Secret{
		{Data: map[string][]byte{"pw": []byte("data-value-1"), v1.DockerConfigJsonKey: []byte(docker)}},
		{StringData: map[string]string{"token": "string-value-2", "x": "no"}},
		nil,
	})
	for _, v := range []string{"data-value-1", "string-value-2", "regpass99", "dTpyZWdwYXNzOTk=",
		base64.StdEncoding.EncodeToString([]byte("data-value-1"))} {
		if s.String("x "+v+" y") != "x "+Placeholder+" y" {
			t.Errorf("%q not redacted: %q", v, s.String("x "+v+" y"))
		}
	}
	if s.String("no") != "no" {
		t.Fatal("a 2-byte value must not be replaced")
	}
}

func BenchmarkScrub(b *testing.B) {
	values := make([]string, 200)
	for i := range values {
		values[i] = fmt.Sprintf("secret-value-%04d-xxxxxxxx", i)
	}
	s := New(values...)
	msg := strings.Repeat("failed to create containerd task: exec: not found in $PATH ", 8) + values[150]
	b.ReportAllocs()
	for b.Loop() {
		_ = s.String(msg)
	}
}

func TestWriterScrubsEachLineAndJSONForms(t *testing.T) {
	var buf strings.Builder
	s := FromSecrets([]*v1.Secret{{StringData: map[string]string{"a": `pa"ss<word>`}}})
	w := NewWriter(&buf, func() *Scrubber { return s })
	line := `{"level":"warn","error":"exec: \"pa\"ss\u003cword\u003e\": not found"}` + "\n"
	n, err := w.Write([]byte(line))
	if err != nil || n != len(line) {
		t.Fatalf("Write = %d, %v", n, err)
	}
	if strings.Contains(buf.String(), "word") || !strings.Contains(buf.String(), Placeholder) {
		t.Fatalf("log line not scrubbed: %s", buf.String())
	}
}

// What the runtime pays per SyncPod to build a Scrubber from the node's
// secrets (50 secrets of 4 keys).
func BenchmarkFromSecrets(b *testing.B) {
	secrets := make([]*v1.Secret, 50)
	for i := range secrets {
		secrets[i] = &v1.Secret{Data: map[string][]byte{}}
		for k := range 4 {
			secrets[i].Data[fmt.Sprint("k", k)] = []byte(fmt.Sprintf("value-%03d-%d-xxxxxxxxxxxxxxxx", i, k))
		}
	}
	b.ReportAllocs()
	for b.Loop() {
		_ = FromSecrets(secrets)
	}
}
