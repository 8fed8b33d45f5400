package signing

import (
	"bytes"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	jose "github.com/go-jose/go-jose/v4"

	apiv1 "github.com/mqlet/mqlet/api/v1"
)

// Profiles a key may lift a command's pods to, weakest restriction first
// (Pod Security Standards levels).
const (
	ProfilePrivileged = "privileged"
	ProfileBaseline   = "baseline"
	ProfileRestricted = "restricted"
)

// AllVerbs in a key's Verbs allows every verb.
const AllVerbs = "*"

// Key is one trusted public key and what commands it may sign.
type Key struct {
	ID     string
	Public ed25519.PublicKey
	// Verbs the key may sign; AllVerbs for every one.
	Verbs []string
	// MaxProfile is the most permissive pod security profile the key may
	// ask for (ProfilePrivileged, ...); empty: the node's own profile.
	MaxProfile string
	// Namespaces limit the key's commands to objects of these namespaces
	// (the agent checks every object and target); empty: any.
	Namespaces []string
}

// Policy is what the Verifier demands.
type Policy struct {
	// Required makes every command need a signature (security.commands: signed-only).
	Required bool
	// SignedVerbs need a signature even when Required is off.
	SignedVerbs []string
	// Targets are the names a command may be signed for: the node's name
	// and the groups it is in.
	Targets []string
	// Groups, when set, gives further target names at each check: the
	// groups the node is in now (they change live).
	Groups func() []string
	Keys   []Key
	// ClockSkew is tolerated on iat and exp between signer and node.
	ClockSkew time.Duration
	// MaxLifetime bounds exp - iat, and so how long a nonce is kept.
	MaxLifetime time.Duration
	// MaxEnvelopeBytes bounds a signed payload before it is parsed.
	MaxEnvelopeBytes int
}

// NonceStore remembers the nonces of accepted commands until they expire.
type NonceStore interface {
	// Use records keyID's nonce until keep; it returns an error wrapping
	// ErrReplayed when the nonce is recorded already.
	Use(keyID, nonce string, keep, now time.Time) error
}

// ErrReplayed is returned by a NonceStore for a nonce seen before.
var ErrReplayed = errors.New("replayed nonce")

// Opened is a command whose envelope passed every check (or an unsigned
// command where none is required).
type Opened struct {
	Body       []byte // the inner command: manifest or JSON args
	Signed     bool
	KeyID      string // the key that signed it
	MaxProfile string // the key's MaxProfile; empty when unsigned
	// Target is the node or group the command was signed for.
	Target string
	// Namespaces are the key's Namespaces; nil when unsigned or any.
	Namespaces []string
}

// Verifier opens commands according to a Policy.
type Verifier struct {
	policy Policy
	keys   map[string]Key
	nonces NonceStore
	now    func() time.Time
}

// NewVerifier checks the policy and returns a Verifier; nonces is needed
// whenever keys are trusted. now nil means time.Now.
func NewVerifier(p Policy, nonces NonceStore, now func() time.Time) (*Verifier, error) {
	if now == nil {
		now = time.Now
	}
	if len(p.Targets) == 0 {
		return nil, errors.New("signature policy: no target names (the node's name)")
	}
	if (p.Required || len(p.SignedVerbs) > 0) && len(p.Keys) == 0 {
		return nil, errors.New("signature policy: signatures are required but no key is trusted")
	}
	if len(p.Keys) > 0 && nonces == nil {
		return nil, errors.New("signature policy: trusted keys need a nonce store")
	}
	if p.MaxLifetime <= 0 {
		return nil, errors.New("signature policy: max lifetime must be positive")
	}
	if p.ClockSkew < 0 {
		return nil, errors.New("signature policy: clock skew must not be negative")
	}
	if p.MaxEnvelopeBytes <= 0 {
		return nil, errors.New("signature policy: max envelope size must be positive")
	}
	keys := make(map[string]Key, len(p.Keys))
	for _, k := range p.Keys {
		if err := checkKeyID(k.ID); err != nil {
			return nil, fmt.Errorf("signature policy: %w", err)
		}
		if _, dup := keys[k.ID]; dup {
			return nil, fmt.Errorf("signature policy: key id %q is trusted twice", k.ID)
		}
		if len(k.Public) != ed25519.PublicKeySize {
			return nil, fmt.Errorf("signature policy: key %q is not an Ed25519 public key", k.ID)
		}
		if len(k.Verbs) == 0 {
			return nil, fmt.Errorf("signature policy: key %q may sign no verb", k.ID)
		}
		for _, ns := range k.Namespaces {
			if err := apiv1.ValidateNamespace(ns); err != nil {
				return nil, fmt.Errorf("signature policy: key %q: %w", k.ID, err)
			}
		}
		switch k.MaxProfile {
		case "", ProfilePrivileged, ProfileBaseline, ProfileRestricted:
		default:
			return nil, fmt.Errorf("signature policy: key %q: unknown profile %q", k.ID, k.MaxProfile)
		}
		keys[k.ID] = k
	}
	return &Verifier{policy: p, keys: keys, nonces: nonces, now: now}, nil
}

// RejectError says why a command was refused; its message is made for
// the failed reply, so it never holds more than ids, names and times.
type RejectError struct{ msg string }

func (e *RejectError) Error() string { return e.msg }

func rejected(format string, args ...any) error {
	return &RejectError{msg: "signature rejected: " + fmt.Sprintf(format, args...)}
}

// required reports whether verb needs a signature, and which setting says so.
func (v *Verifier) required(verb string) (bool, string) {
	if v.policy.Required {
		return true, "this node accepts only signed commands (security.commands: signed-only)"
	}
	if slices.Contains(v.policy.SignedVerbs, verb) {
		return true, fmt.Sprintf("verb %s must be signed on this node (security.signedVerbs)", verb)
	}
	// sync stores and deletes like apply and delete together: a node that
	// wants either signed must not take the same change unsigned as a sync.
	if verb == "sync" {
		for _, implied := range []string{"apply", "delete"} {
			if slices.Contains(v.policy.SignedVerbs, implied) {
				return true, fmt.Sprintf("verb sync must be signed on this node: it applies and deletes, and %s must be signed (security.signedVerbs)", implied)
			}
		}
	}
	return false, ""
}

// Open checks the command that arrived on the topic of verb and requestID
// and returns its inner body. An unsigned payload passes as it is unless a
// signature is required; a signed one must pass every check, also where
// none is required, because accepting it unverified would ignore its
// binding. A nonce is spent only by a command that passed the other checks.
func (v *Verifier) Open(verb, requestID string, payload []byte) (Opened, error) {
	if !LooksSigned(payload) {
		if need, why := v.required(verb); need {
			return Opened{}, &RejectError{msg: "signature required: " + why}
		}
		return Opened{Body: payload}, nil
	}
	key, c, err := v.verify(payload)
	if err != nil {
		return Opened{}, err
	}
	if err := v.checkBinding(key, c, verb, requestID); err != nil {
		return Opened{}, err
	}
	now := v.now()
	keep, err := v.checkTimes(c, now)
	if err != nil {
		return Opened{}, err
	}
	if err := checkNonce(c.Nonce); err != nil {
		return Opened{}, err
	}
	if err := v.nonces.Use(key.ID, c.Nonce, keep, now); err != nil {
		if errors.Is(err, ErrReplayed) {
			return Opened{}, rejected("replayed nonce %s of key %s", c.Nonce, key.ID)
		}
		// Fail closed: a nonce that cannot be recorded could be replayed.
		return Opened{}, rejected("recording the nonce: %v", err)
	}
	if c.Body == nil {
		c.Body = []byte{}
	}
	var namespaces []string
	if len(key.Namespaces) > 0 {
		namespaces = slices.Clone(key.Namespaces)
	}
	return Opened{Body: c.Body, Signed: true, KeyID: key.ID, MaxProfile: key.MaxProfile, Target: c.Node, Namespaces: namespaces}, nil
}

// verify checks an envelope's form, header and signature against the
// trusted keys and decodes its claims strictly; what they must say is the
// caller's check.
func (v *Verifier) verify(payload []byte) (Key, wireClaims, error) {
	if len(v.keys) == 0 {
		return Key{}, wireClaims{}, rejected("the command is signed but this node trusts no key (security.trustedKeys)")
	}
	if len(payload) > v.policy.MaxEnvelopeBytes {
		return Key{}, wireClaims{}, rejected("envelope of %d bytes exceeds the limit of %d bytes", len(payload), v.policy.MaxEnvelopeBytes)
	}
	obj, err := parse(payload)
	if err != nil {
		return Key{}, wireClaims{}, err
	}
	if len(obj.Signatures) != 1 {
		return Key{}, wireClaims{}, rejected("want exactly one signature, got %d", len(obj.Signatures))
	}
	sig := obj.Signatures[0]
	if !emptyHeader(sig.Unprotected) {
		return Key{}, wireClaims{}, rejected("unprotected JWS header parameters are not accepted")
	}
	h := sig.Protected
	if h.Algorithm != string(jose.EdDSA) {
		return Key{}, wireClaims{}, rejected("algorithm %q is not accepted (only EdDSA)", h.Algorithm)
	}
	if typ, _ := h.ExtraHeaders[jose.HeaderType].(string); typ != Type {
		return Key{}, wireClaims{}, rejected("header typ %q is not %q", bounded(typ), Type)
	}
	for name := range h.ExtraHeaders {
		if name != jose.HeaderType {
			return Key{}, wireClaims{}, rejected("header parameter %q is not accepted", bounded(string(name)))
		}
	}
	if h.JSONWebKey != nil || h.Nonce != "" {
		return Key{}, wireClaims{}, rejected("header parameters jwk and nonce are not accepted")
	}
	if h.KeyID == "" {
		return Key{}, wireClaims{}, rejected("no key id (kid) in the header")
	}
	key, ok := v.keys[h.KeyID]
	if !ok {
		return Key{}, wireClaims{}, rejected("unknown key id %q", bounded(h.KeyID))
	}
	raw, err := obj.Verify(key.Public)
	if err != nil {
		return Key{}, wireClaims{}, rejected("bad signature for key %s (tampered, or signed by another key)", key.ID)
	}
	var c wireClaims
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return Key{}, wireClaims{}, rejected("claims of key %s do not decode: %v", key.ID, err)
	}
	if dec.More() {
		return Key{}, wireClaims{}, rejected("trailing data after the claims")
	}
	return key, c, nil
}

func parse(payload []byte) (*jose.JSONWebSignature, error) {
	algs := []jose.SignatureAlgorithm{jose.EdDSA}
	p := strings.TrimSpace(string(payload))
	var obj *jose.JSONWebSignature
	var err error
	if strings.HasPrefix(p, "{") {
		obj, err = jose.ParseSignedJSON(p, algs)
	} else {
		obj, err = jose.ParseSignedCompact(p, algs)
	}
	var algErr *jose.ErrUnexpectedSignatureAlgorithm
	switch {
	case errors.As(err, &algErr):
		return nil, rejected("algorithm %q is not accepted (only EdDSA)", bounded(string(algErr.Got)))
	case err != nil:
		return nil, rejected("malformed JWS: %v", err)
	}
	return obj, nil
}

func (v *Verifier) checkBinding(key Key, c wireClaims, verb, requestID string) error {
	if !slices.Contains(v.policy.Targets, c.Node) && (v.policy.Groups == nil || !slices.Contains(v.policy.Groups(), c.Node)) {
		return rejected("signed for node %q, this is %q", bounded(c.Node), v.policy.Targets[0])
	}
	if c.Verb != verb {
		return rejected("signed for verb %q, the topic says %q", bounded(c.Verb), verb)
	}
	if c.RequestID != requestID {
		return rejected("signed for request id %q, the topic carries %q (signed commands need the request id in the topic)", bounded(c.RequestID), requestID)
	}
	if !slices.Contains(key.Verbs, AllVerbs) && !slices.Contains(key.Verbs, verb) {
		return rejected("key %s may not sign verb %s (it may sign: %s)", key.ID, verb, strings.Join(key.Verbs, ", "))
	}
	return nil
}

// checkTimes checks iat and exp and returns until when the nonce must be
// kept: as long as the command could still pass as fresh.
func (v *Verifier) checkTimes(c wireClaims, now time.Time) (time.Time, error) {
	skew := v.policy.ClockSkew
	iat, exp := time.Unix(c.IssuedAt, 0), time.Unix(c.Expires, 0)
	if c.IssuedAt <= 0 || c.Expires <= 0 {
		return time.Time{}, rejected("iat and exp must both be set")
	}
	if iat.After(now.Add(skew)) {
		return time.Time{}, rejected("issued in the future (iat %s, node time %s, allowed skew %s)", stamp(iat), stamp(now), skew)
	}
	if !exp.After(iat) {
		return time.Time{}, rejected("exp %s is not after iat %s", stamp(exp), stamp(iat))
	}
	if life := exp.Sub(iat); life > v.policy.MaxLifetime {
		return time.Time{}, rejected("lifetime %s exceeds the maximum of %s (security.maxLifetime)", life, v.policy.MaxLifetime)
	}
	keep := exp.Add(skew)
	if now.After(keep) {
		return time.Time{}, rejected("expired at %s (node time %s)", stamp(exp), stamp(now))
	}
	return keep, nil
}

// checkNonce bounds the nonce: it becomes a key in the nonce store.
func checkNonce(n string) error {
	if len(n) < 8 || len(n) > 64 {
		return rejected("nonce must be 8 to 64 characters, got %d", len(n))
	}
	for _, c := range n {
		if !(c == '-' || c == '_' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z') {
			return rejected("nonce may hold only base64url characters")
		}
	}
	return nil
}

func emptyHeader(h jose.Header) bool {
	return h.KeyID == "" && h.JSONWebKey == nil && h.Algorithm == "" && h.Nonce == "" && len(h.ExtraHeaders) == 0
}

// bounded shortens a value from the envelope before it is echoed.
func bounded(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}

func stamp(t time.Time) string { return t.UTC().Format(time.RFC3339) }
