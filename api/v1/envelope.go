package apiv1

// This file holds the unsigned command envelope: a command that should not
// run after a time (mqletctl --expires) carries its expiry in it, signed or
// not (a signed command carries the envelope as its signed body).

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// EnvelopeKind and EnvelopeAPIVersion mark a command envelope; no
// manifest has this kind.
const (
	EnvelopeKind       = "CommandEnvelope"
	EnvelopeAPIVersion = "mqlet.io/v1"
)

// Envelope wraps a command's payload with when it expires:
// {"apiVersion":"mqlet.io/v1","kind":"CommandEnvelope","expires":"2026-01-01T00:10:00Z","body":"<base64 of the payload>"}.
// A node that takes it after expires answers failed "expired" and does not
// run it.
type Envelope struct {
	APIVersion string    `json:"apiVersion"`
	Kind       string    `json:"kind"`
	Expires    time.Time `json:"expires"`
	Body       []byte    `json:"body"`
}

// WrapEnvelope puts payload in an envelope expiring at expires.
func WrapEnvelope(payload []byte, expires time.Time) ([]byte, error) {
	if payload == nil {
		payload = []byte{}
	}
	return json.Marshal(Envelope{APIVersion: EnvelopeAPIVersion, Kind: EnvelopeKind, Expires: expires.UTC().Truncate(time.Second), Body: payload})
}

// envelopeMarker is how every envelope begins as WrapEnvelope writes it;
// a payload that does not is no envelope (a manifest, YAML or JSON).
var envelopeMarker = []byte(`{"apiVersion":"` + EnvelopeAPIVersion + `","kind":"` + EnvelopeKind + `"`)

// OpenEnvelope returns the payload inside an envelope and its expiry; a
// payload that is no envelope comes back as it is with a zero time. A
// payload that begins as an envelope but is not a whole valid one is an
// error.
func OpenEnvelope(payload []byte) ([]byte, time.Time, error) {
	if !bytes.HasPrefix(payload, envelopeMarker) {
		return payload, time.Time{}, nil
	}
	var env Envelope
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&env); err != nil {
		return nil, time.Time{}, fmt.Errorf("command envelope: %w", err)
	}
	if dec.More() {
		return nil, time.Time{}, errors.New("command envelope: data after the JSON object")
	}
	if env.Expires.IsZero() {
		return nil, time.Time{}, errors.New("command envelope: expires: required")
	}
	if env.Body == nil {
		env.Body = []byte{}
	}
	return env.Body, env.Expires, nil
}
