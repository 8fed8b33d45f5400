// Package redact removes secret values from text that leaves the node:
// error messages, events, statuses and logs. A pod can make a secret value
// part of a runtime error (command: ["$(PW)"] with PW from a Secret makes
// "executable file not found" quote it), so every message the runtime or
// the agent publishes goes through a Scrubber built from the secrets the
// node knows.
package redact

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"slices"
	"strconv"
	"strings"

	v1 "k8s.io/api/core/v1"
)

// Placeholder replaces every secret value.
const Placeholder = "<redacted>"

// MinLength is the shortest value that is replaced: shorter ones ("1",
// "yes") would shred ordinary text and are no secret worth the name.
const MinLength = 4

// Scrubber replaces known secret values. The zero value and nil replace
// nothing. A Scrubber is immutable and safe for concurrent use.
type Scrubber struct {
	values   []string // longest first, so a value containing another goes whole
	replacer *strings.Replacer
}

// New returns a Scrubber for values; values shorter than MinLength and
// duplicates are ignored.
func New(values ...string) *Scrubber {
	seen := map[string]bool{}
	var kept []string
	for _, v := range values {
		if len(v) < MinLength || seen[v] {
			continue
		}
		seen[v] = true
		kept = append(kept, v)
	}
	slices.SortFunc(kept, func(a, b string) int {
		if len(a) != len(b) {
			return len(b) - len(a)
		}
		return strings.Compare(a, b)
	})
	s := &Scrubber{values: kept}
	if len(kept) > 0 {
		pairs := make([]string, 0, 2*len(kept))
		for _, v := range kept {
			pairs = append(pairs, v, Placeholder)
		}
		// strings.Replacer tries the old strings in argument order at each
		// position, so longest first wins over a shorter prefix.
		s.replacer = strings.NewReplacer(pairs...)
	}
	return s
}

// FromSecrets returns a Scrubber for every value of secrets: each data and
// stringData value, its base64 and JSON-escaped forms, and the credentials
// inside a dockerconfigjson.
func FromSecrets(secrets []*v1.Secret) *Scrubber {
	var values []string
	add := func(v string) {
		if len(v) < MinLength {
			return
		}
		values = append(values, base64.StdEncoding.EncodeToString([]byte(v)))
		// As it is written, and as Go quotes it in an error (%q, %+q: exec's
		// "executable file not found" does), where control characters and
		// invalid UTF-8 of a binary secret become \x and \u escapes; each
		// also as it appears inside JSON text (a log line, a published
		// status): quotes, backslashes, control characters and <>& escaped.
		forms := []string{v}
		for _, quoted := range []string{strconv.Quote(v), strconv.QuoteToASCII(v)} {
			if inner := quoted[1 : len(quoted)-1]; inner != v {
				forms = append(forms, inner)
			}
		}
		for _, f := range forms {
			values = append(values, f)
			if quoted, err := json.Marshal(f); err == nil {
				if inner := string(quoted[1 : len(quoted)-1]); inner != f {
					values = append(values, inner)
				}
			}
		}
	}
	for _, s := range secrets {
		if s == nil {
			continue
		}
		for _, v := range s.Data {
			add(string(v))
			values = append(values, dockerCredentials(v)...)
		}
		for _, v := range s.StringData {
			add(v)
			values = append(values, dockerCredentials([]byte(v))...)
		}
	}
	return New(values...)
}

// dockerCredentials lists the credentials of a docker config JSON, which
// a pull error could quote one by one; nil for anything else.
func dockerCredentials(data []byte) []string {
	if len(data) == 0 || data[0] != '{' {
		return nil
	}
	var cfg struct {
		Auths map[string]struct {
			Password      string `json:"password"`
			Auth          string `json:"auth"`
			IdentityToken string `json:"identitytoken"`
			RegistryToken string `json:"registrytoken"`
		} `json:"auths"`
	}
	if json.Unmarshal(data, &cfg) != nil {
		return nil
	}
	var out []string
	for _, a := range cfg.Auths {
		out = append(out, a.Password, a.Auth, a.IdentityToken, a.RegistryToken)
	}
	return out
}

// Len is how many values s replaces.
func (s *Scrubber) Len() int {
	if s == nil {
		return 0
	}
	return len(s.values)
}

// String returns in with every known value replaced by Placeholder.
func (s *Scrubber) String(in string) string {
	if s == nil || s.replacer == nil || in == "" {
		return in
	}
	return s.replacer.Replace(in)
}

// Contains reports whether in holds a known value.
func (s *Scrubber) Contains(in string) bool {
	return s.String(in) != in
}

// Error returns err unchanged when its message holds no known value, and
// otherwise an error with the scrubbed message. The scrubbed error still
// answers errors.Is for err's chain (sentinels carry no values), but
// errors.As cannot reach the original values, whose messages would leak.
func (s *Scrubber) Error(err error) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	clean := s.String(msg)
	if clean == msg {
		return err
	}
	return &scrubbed{msg: clean, cause: err}
}

type scrubbed struct {
	msg   string
	cause error
}

func (e *scrubbed) Error() string { return e.msg }

// Is lets errors.Is see through to the original chain without exposing it.
func (e *scrubbed) Is(target error) bool { return errors.Is(e.cause, target) }

// Writer scrubs everything written through it with the Scrubber current
// returns at each write (so newly stored secrets count at once). zerolog
// writes one whole line per Write, so a value is never split across calls;
// a line that is one JSON document is kept valid JSON (see JSON).
type Writer struct {
	next    io.Writer
	current func() *Scrubber
}

// NewWriter returns a Writer in front of next.
func NewWriter(next io.Writer, current func() *Scrubber) *Writer {
	return &Writer{next: next, current: current}
}

func (w *Writer) Write(p []byte) (int, error) {
	s := w.current()
	if s.Len() == 0 {
		return w.next.Write(p)
	}
	// A JSON line (zerolog's) stays valid JSON; other text is replaced.
	clean := s.JSON(p)
	if _, err := w.next.Write(clean); err != nil {
		return 0, err
	}
	return len(p), nil // what the caller gave was consumed whole
}
