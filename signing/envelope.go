// Package signing seals mqlet commands in a JWS envelope (RFC 7515, EdDSA
// with Ed25519 keys, RFC 8037) and opens them again: the operator's CLI
// signs, the agent verifies signature, binding, lifetime and freshness. The
// format is described in docs/signed-commands.md. It imports nothing of the
// agent, so both sides share one definition of the envelope.
package signing

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"time"

	jose "github.com/go-jose/go-jose/v4"
)

// Type is the JWS "typ" header of a signed command; a JWS of any other type
// (an ID token, another system's message) is not a command.
const Type = "mqlet-command+jws"

// Claims bind a command to where, when and what it may be used for. They are
// the signed JSON payload of the JWS, beside the inner command body.
type Claims struct {
	Node      string    // the node (or a group the node is in) the command is for
	Verb      string    // the verb of the command topic
	RequestID string    // the request id of the command topic
	IssuedAt  time.Time // iat
	Expires   time.Time // exp
	Nonce     string    // unique per key until exp; empty: Sign picks one
}

// wireClaims is the JSON payload. Times are NumericDate seconds as in JWT;
// body is base64 (JSON []byte) so any bytes survive, also non-UTF-8 ones.
type wireClaims struct {
	Node      string `json:"node"`
	Verb      string `json:"verb"`
	RequestID string `json:"requestId"`
	IssuedAt  int64  `json:"iat"`
	Expires   int64  `json:"exp"`
	Nonce     string `json:"nonce"`
	Body      []byte `json:"body"`
}

// Signer signs commands with one Ed25519 private key.
type Signer struct {
	keyID string
	key   ed25519.PrivateKey
	sig   jose.Signer
}

// NewSigner returns a Signer for key; an empty keyID takes KeyID(public key).
func NewSigner(keyID string, key ed25519.PrivateKey) (*Signer, error) {
	if len(key) != ed25519.PrivateKeySize {
		return nil, fmt.Errorf("creating signer: an Ed25519 private key has %d bytes, got %d", ed25519.PrivateKeySize, len(key))
	}
	if keyID == "" {
		keyID = KeyID(key.Public().(ed25519.PublicKey))
	}
	if err := checkKeyID(keyID); err != nil {
		return nil, err
	}
	opts := (&jose.SignerOptions{}).WithType(Type)
	s, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.EdDSA, Key: jose.JSONWebKey{Key: key, KeyID: keyID}}, opts)
	if err != nil {
		return nil, fmt.Errorf("creating signer: %w", err)
	}
	return &Signer{keyID: keyID, key: key, sig: s}, nil
}

// KeyID is the key id the signer puts in the "kid" header.
func (s *Signer) KeyID() string { return s.keyID }

// Public is the signer's public key.
func (s *Signer) Public() ed25519.PublicKey { return s.key.Public().(ed25519.PublicKey) }

// Sign returns the command as a JWS in compact serialization, ready to be
// the MQTT payload of the command topic the claims name.
func (s *Signer) Sign(c Claims, body []byte) ([]byte, error) {
	if c.Nonce == "" {
		c.Nonce = NewNonce()
	}
	if body == nil {
		body = []byte{}
	}
	payload, err := json.Marshal(wireClaims{
		Node: c.Node, Verb: c.Verb, RequestID: c.RequestID,
		IssuedAt: c.IssuedAt.Unix(), Expires: c.Expires.Unix(), Nonce: c.Nonce, Body: body,
	})
	if err != nil {
		return nil, fmt.Errorf("encoding command claims: %w", err)
	}
	obj, err := s.sig.Sign(payload)
	if err != nil {
		return nil, fmt.Errorf("signing command: %w", err)
	}
	out, err := obj.CompactSerialize()
	if err != nil {
		return nil, fmt.Errorf("serializing signed command: %w", err)
	}
	return []byte(out), nil
}

// NewNonce returns 16 random bytes, base64url: unguessable and unique.
func NewNonce() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b) // crypto/rand.Read never returns an error
	return base64.RawURLEncoding.EncodeToString(b)
}

// KeyID derives a key id from a public key: the first 16 hex digits of its
// SHA-256, so operator and node name the key the same way without agreeing.
func KeyID(pub ed25519.PublicKey) string {
	sum := sha256.Sum256(pub)
	return hex.EncodeToString(sum[:])[:16]
}

// LooksSigned tells a JWS from a plain command (a manifest or JSON args):
// a compact JWS is three base64url parts joined by dots starting with the
// encoding of `{"`; a flattened or general JSON JWS is an object with a
// "signature(s)" member. A Kubernetes manifest is neither.
func LooksSigned(payload []byte) bool {
	p := bytes.TrimSpace(payload)
	if len(p) == 0 {
		return false
	}
	if p[0] == '{' {
		if !bytes.Contains(p, []byte(`"signature`)) {
			return false // cheap test first: a manifest rarely has the word
		}
		var probe struct {
			Protected  json.RawMessage `json:"protected"`
			Signature  json.RawMessage `json:"signature"`
			Signatures json.RawMessage `json:"signatures"`
		}
		if json.Unmarshal(p, &probe) != nil {
			return false
		}
		return probe.Protected != nil || probe.Signature != nil || probe.Signatures != nil
	}
	if !bytes.HasPrefix(p, []byte("eyJ")) || bytes.Count(p, []byte{'.'}) != 2 {
		return false
	}
	for _, c := range p {
		if !(c == '.' || c == '-' || c == '_' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z') {
			return false
		}
	}
	return true
}

// checkKeyID bounds a key id: it is echoed in messages and logs.
func checkKeyID(id string) error {
	if id == "" || len(id) > 64 {
		return fmt.Errorf("key id %q must be 1 to 64 characters", id)
	}
	for _, c := range id {
		if !(c == '.' || c == '-' || c == '_' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z') {
			return fmt.Errorf("key id %q may hold only letters, digits, '.', '-' and '_'", id)
		}
	}
	return nil
}
