package redact

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
)

// A value printed in two pieces (two writes, two log chunks) is replaced
// whole; the text around it goes out unchanged and in order.
func TestStreamScrubsAcrossPieces(t *testing.T) {
	s := New("123456", "hunter22-long-value")
	for _, pieces := range [][]string{
		{"code 12", "3456 ok\n"},
		{"code 1", "2", "3", "4", "5", "6 ok\n"},
		{"a hunter22-lo", "ng-value b\n"},
		{"code 123456 ok\n"},
	} {
		st := NewStream(s)
		var out []string
		for _, p := range pieces {
			out = append(out, st.Next(p))
		}
		out = append(out, st.Flush())
		joined := strings.Join(out, "")
		for _, o := range out {
			if strings.Contains(o, "123") && strings.Contains(joined, "123456") {
				t.Errorf("pieces %q published %q", pieces, out)
			}
		}
		want := strings.ReplaceAll(strings.ReplaceAll(strings.Join(pieces, ""), "123456", Placeholder), "hunter22-long-value", Placeholder)
		if joined != want {
			t.Errorf("pieces %q gave %q, want %q", pieces, joined, want)
		}
	}
	// Text that only looks like a beginning is published once the next
	// piece shows it is not a value; at the end, whatever is held.
	st := NewStream(s)
	if got := st.Next("total 12"); got != "total " {
		t.Fatalf("held back: %q", got)
	}
	if got := st.Next("9\n"); got != "129\n" {
		t.Fatalf("released: %q", got)
	}
	if got := st.Next("x 1234") + st.Flush(); got != "x 1234" {
		t.Fatalf("flushed: %q", got)
	}
	if got := NewStream(nil).Next("123456"); got != "123456" {
		t.Fatal("a nil scrubber changes nothing")
	}
}

// What a log chunk pays for the hold-back: 200 secrets, a 64 KiB chunk.
func BenchmarkStreamNext(b *testing.B) {
	values := make([]string, 200)
	for i := range values {
		values[i] = strings.Repeat("x", i%7) + "secret-value-" + strings.Repeat("y", i%13)
	}
	s := New(values...)
	chunk := strings.Repeat("2026-12-01T09:00:00Z stdout F request served in 12 ms\n", 64<<10/54)
	st := NewStream(s)
	b.ReportAllocs()
	for b.Loop() {
		_ = st.Next(chunk)
	}
}

// The cost per published message with 200 secrets on the node (each with
// its base64, quoted and escaped forms): before, every payload went
// through the node-wide scrubber as JSON; after, only a pod's own text is
// scrubbed, with the secrets that pod refers to (2 here), and the other
// messages (node status, replies, events of mqlet's own) not at all.
func BenchmarkScrubPerMessage200Secrets(b *testing.B) {
	secrets := make([]*v1.Secret, 200)
	for i := range secrets {
		secrets[i] = &v1.Secret{StringData: map[string]string{"pw": fmt.Sprintf("secret-value-%03d-xyz", i)}}
	}
	all, pods := FromSecrets(secrets), FromSecrets(secrets[:2])
	status := []byte(`{"kind":"Pod","apiVersion":"v1","metadata":{"name":"web","namespace":"default","uid":"0b6c1a52-7d1e-4c55-9a3e-2f1d8e4b7a01"},"spec":{"containers":[{"name":"web","image":"busybox:1","command":["sh","-c","sleep 3600"]}]},"status":{"phase":"Running","conditions":[{"type":"Ready","status":"True"}],"containerStatuses":[{"name":"web","state":{"running":{"startedAt":"2026-12-01T09:00:00Z"}},"lastState":{"terminated":{"exitCode":1,"reason":"Error","message":"exec: \"secret-value-001-xyz\": not found"}},"ready":true,"restartCount":1,"image":"busybox:1","imageID":"sha256:0","containerID":"containerd://4f1c"}]}}`)
	message := `exec: "secret-value-001-xyz": executable file not found in $PATH`
	chunk := strings.Repeat("2026-12-01T09:00:00Z stdout F request served in 12 ms\n", 16<<10/54)
	chunkJSON, _ := json.Marshal(map[string]any{"requestId": "l1", "verb": "logs", "phase": "in_progress", "result": map[string]any{"lines": strings.Split(chunk, "\n")}})
	for _, c := range []struct {
		name string
		fn   func()
	}{
		{"before/pod-status-all-200", func() { _ = all.JSON(status) }},
		{"after/pod-status-message-own-2", func() { _ = pods.String(message) }},
		{"after/pod-status-other-messages", func() {}},
		{"before/log-chunk-16KiB-all-200", func() { _ = all.JSON(chunkJSON) }},
		{"after/log-chunk-16KiB-own-2", func() { _ = NewStream(pods).Next(chunk) }},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				c.fn()
			}
		})
	}
}
