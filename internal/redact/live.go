package redact

import (
	"bytes"
	"encoding/json"
	"sync"
	"sync/atomic"

	v1 "k8s.io/api/core/v1"
)

// SecretSource is where a Live scrubber takes the node's secrets from (the
// desired-state store).
type SecretSource interface {
	// SecretsVersion changes whenever the set of secrets may have changed.
	SecretsVersion() uint64
	ListSecrets() ([]*v1.Secret, error)
}

// Live is a Scrubber kept current with a changing set of secrets: it is
// rebuilt when the source's version moves, so a value stored a moment ago
// is already scrubbed from the next log line or message. The zero value
// scrubs nothing until Bind. Safe for concurrent use.
type Live struct {
	mu   sync.Mutex // serialises rebuilds
	src  atomic.Pointer[liveSource]
	seen atomic.Uint64
	cur  atomic.Pointer[Scrubber]
}

type liveSource struct{ SecretSource }

// Bind makes src the source of secrets (nil: none).
func (l *Live) Bind(src SecretSource) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if src == nil {
		l.src.Store(nil)
	} else {
		l.src.Store(&liveSource{src})
	}
	l.seen.Store(0)
}

// Current returns the Scrubber for the secrets the source holds now. When
// listing them fails, the last good one is kept (and retried next time).
func (l *Live) Current() *Scrubber {
	src := l.src.Load()
	if src == nil {
		return l.cur.Load()
	}
	v := src.SecretsVersion()
	if v == l.seen.Load() {
		return l.cur.Load()
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if v == l.seen.Load() {
		return l.cur.Load()
	}
	secrets, err := src.ListSecrets()
	if err != nil {
		return l.cur.Load()
	}
	l.cur.Store(FromSecrets(secrets))
	l.seen.Store(v)
	return l.cur.Load()
}

// JSON returns doc with every known value removed from its string values,
// keeping it valid JSON: object keys (field, label and annotation names,
// never a value the node was given as secret) are left alone, so a stored
// secret whose value is a field name such as "name" or "kind" cannot break
// the structure of everything published. A doc that
// holds no value is returned as is; one that is not JSON is scrubbed as
// text.
func (s *Scrubber) JSON(doc []byte) []byte {
	if s.Len() == 0 || !s.Contains(string(doc)) {
		return doc
	}
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil || dec.More() {
		return []byte(s.String(string(doc)))
	}
	var out bytes.Buffer
	enc := json.NewEncoder(&out)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(s.scrubValue(v)); err != nil {
		return []byte(s.String(string(doc)))
	}
	clean := bytes.TrimSuffix(out.Bytes(), []byte("\n"))
	if bytes.HasSuffix(doc, []byte("\n")) {
		clean = append(clean, '\n')
	}
	return clean
}

func (s *Scrubber) scrubValue(v any) any {
	switch x := v.(type) {
	case string:
		return s.String(x)
	case []any:
		for i := range x {
			x[i] = s.scrubValue(x[i])
		}
		return x
	case map[string]any:
		for k, e := range x {
			x[k] = s.scrubValue(e)
		}
		return x
	}
	return v
}
