package signing_test

import (
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"

	"github.com/mqlet/mqlet/signing"
	"github.com/mqlet/mqlet/signing/noncestore"
)

var t0 = time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)

// memNonces is a NonceStore in memory, for tests that are not about persistence.
type memNonces struct {
	mu   sync.Mutex
	seen map[string]time.Time
}

func (m *memNonces) Use(keyID, nonce string, keep, _ time.Time) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.seen == nil {
		m.seen = map[string]time.Time{}
	}
	if _, ok := m.seen[keyID+"/"+nonce]; ok {
		return fmt.Errorf("%w: %s", signing.ErrReplayed, nonce)
	}
	m.seen[keyID+"/"+nonce] = keep
	return nil
}

type fixture struct {
	signer, other *signing.Signer
	verifier      *signing.Verifier
	now           time.Time
}

func newKey(t testing.TB, id string) *signing.Signer {
	t.Helper()
	priv, err := signing.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	s, err := signing.NewSigner(id, priv)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func newFixture(t testing.TB, p signing.Policy, nonces signing.NonceStore) *fixture {
	t.Helper()
	f := &fixture{signer: newKey(t, "ops"), other: newKey(t, "ci"), now: t0}
	if p.Targets == nil {
		p.Targets = []string{"gw1", "lab"}
	}
	if p.Keys == nil {
		p.Keys = []signing.Key{
			{ID: "ops", Public: f.signer.Public(), Verbs: []string{signing.AllVerbs}, MaxProfile: signing.ProfilePrivileged},
			{ID: "ci", Public: f.other.Public(), Verbs: []string{"get"}},
		}
	}
	if p.MaxLifetime == 0 {
		p.MaxLifetime = time.Hour
	}
	if p.ClockSkew == 0 {
		p.ClockSkew = 30 * time.Second
	}
	if p.MaxEnvelopeBytes == 0 {
		p.MaxEnvelopeBytes = 1 << 20
	}
	if nonces == nil {
		nonces = &memNonces{}
	}
	v, err := signing.NewVerifier(p, nonces, func() time.Time { return f.now })
	if err != nil {
		t.Fatal(err)
	}
	f.verifier = v
	return f
}

func claims(verb, id string) signing.Claims {
	return signing.Claims{Node: "gw1", Verb: verb, RequestID: id, IssuedAt: t0, Expires: t0.Add(5 * time.Minute)}
}

func sign(t testing.TB, s *signing.Signer, c signing.Claims, body string) []byte {
	t.Helper()
	env, err := s.Sign(c, []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	return env
}

const manifest = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\n"

// expectReject opens payload and wants a RejectError containing want.
func expectReject(t *testing.T, v *signing.Verifier, verb, id string, payload []byte, want string) {
	t.Helper()
	_, err := v.Open(verb, id, payload)
	if err == nil {
		t.Fatalf("accepted; want rejection %q", want)
	}
	var re *signing.RejectError
	if !errors.As(err, &re) {
		t.Fatalf("error %v is not a RejectError", err)
	}
	if !strings.Contains(err.Error(), want) {
		t.Fatalf("error %q does not say %q", err, want)
	}
}

func TestFreshSignedCommandIsOpened(t *testing.T) {
	f := newFixture(t, signing.Policy{Required: true}, nil)
	env := sign(t, f.signer, claims("apply", "r1"), manifest)
	if !signing.LooksSigned(env) {
		t.Fatal("a compact JWS does not look signed")
	}
	got, err := f.verifier.Open("apply", "r1", env)
	if err != nil {
		t.Fatal(err)
	}
	if string(got.Body) != manifest || !got.Signed || got.KeyID != "ops" || got.MaxProfile != signing.ProfilePrivileged {
		t.Fatalf("opened %+v", got)
	}
	// A group name is a target too.
	c := claims("get", "r2")
	c.Node = "lab"
	if _, err := f.verifier.Open("get", "r2", sign(t, f.other, c, "{}")); err != nil {
		t.Fatalf("command signed for the node's group: %v", err)
	}
}

func TestUnsignedCommands(t *testing.T) {
	off := newFixture(t, signing.Policy{SignedVerbs: []string{"exec"}}, nil)
	got, err := off.verifier.Open("apply", "r1", []byte(manifest))
	if err != nil || got.Signed || string(got.Body) != manifest {
		t.Fatalf("unsigned manifest where signing is off: %+v, %v", got, err)
	}
	expectReject(t, off.verifier, "exec", "r2", []byte(`{"name":"x"}`), "verb exec must be signed on this node (security.signedVerbs)")
	// sync applies and deletes: signing either of those makes sync signed too.
	for _, v := range []string{"apply", "delete"} {
		f := newFixture(t, signing.Policy{SignedVerbs: []string{v}}, nil)
		expectReject(t, f.verifier, "sync", "r3", []byte(manifest), "verb sync must be signed on this node: it applies and deletes, and "+v+" must be signed")
		if _, err := f.verifier.Open("get", "r4", []byte(`{}`)); err != nil {
			t.Fatalf("get need not be signed when only %s is: %v", v, err)
		}
	}
	on := newFixture(t, signing.Policy{Required: true}, nil)
	expectReject(t, on.verifier, "apply", "r1", []byte(manifest), "signature required: this node accepts only signed commands")
	expectReject(t, on.verifier, "get", "r1", []byte(`{}`), "signature required")
	// A signed command is verified even where none is required.
	bad := sign(t, off.signer, claims("apply", "r9"), manifest)
	expectReject(t, off.verifier, "apply", "r1", bad, "signed for request id")
	// A node that trusts no key refuses signed commands rather than ignoring the signature.
	none, err := signing.NewVerifier(signing.Policy{Targets: []string{"gw1"}, MaxLifetime: time.Hour, MaxEnvelopeBytes: 1 << 20}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	expectReject(t, none, "apply", "r9", bad, "trusts no key")
}

// segments splits a compact JWS.
func segments(t *testing.T, env []byte) (header, payload map[string]any, sig string) {
	t.Helper()
	parts := strings.Split(string(env), ".")
	if len(parts) != 3 {
		t.Fatalf("not compact: %s", env)
	}
	dec := func(s string) map[string]any {
		b, err := base64.RawURLEncoding.DecodeString(s)
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]any{}
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		return m
	}
	return dec(parts[0]), dec(parts[1]), parts[2]
}

func join(t *testing.T, header, payload map[string]any, sig string) []byte {
	t.Helper()
	enc := func(m map[string]any) string {
		b, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return base64.RawURLEncoding.EncodeToString(b)
	}
	return []byte(enc(header) + "." + enc(payload) + "." + sig)
}

func TestEveryRejection(t *testing.T) {
	f := newFixture(t, signing.Policy{Required: true}, nil)
	good := sign(t, f.signer, claims("apply", "r1"), manifest)
	h, p, s := segments(t, good)
	if h["typ"] != signing.Type || h["alg"] != "EdDSA" || h["kid"] != "ops" {
		t.Fatalf("header %v", h)
	}
	for _, k := range []string{"node", "verb", "requestId", "iat", "exp", "nonce", "body"} {
		if _, ok := p[k]; !ok {
			t.Fatalf("claim %s missing from %v", k, p)
		}
	}

	tamperedBody := map[string]any{}
	for k, v := range p {
		tamperedBody[k] = v
	}
	tamperedBody["body"] = base64.StdEncoding.EncodeToString([]byte(manifest + "data:\n  x: y\n"))
	tamperedHeader := map[string]any{"alg": "EdDSA", "typ": signing.Type, "kid": "ops", "cty": "x"}
	kidSwap := map[string]any{"alg": "EdDSA", "typ": signing.Type, "kid": "ci"}

	none := join(t, map[string]any{"alg": "none", "typ": signing.Type, "kid": "ops"}, p, "")

	// HS256 keyed with the public key: the classic algorithm confusion.
	hs, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.HS256, Key: []byte(f.signer.Public())},
		(&jose.SignerOptions{}).WithType(signing.Type).WithHeader("kid", "ops"))
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := json.Marshal(p)
	hsObj, err := hs.Sign(raw)
	if err != nil {
		t.Fatal(err)
	}
	hsCompact, _ := hsObj.CompactSerialize()

	wrongKey, err := signing.NewSigner("ops", mustKey(t))
	if err != nil {
		t.Fatal(err)
	}
	unknown := newKey(t, "stranger")

	at := func(d time.Duration) signing.Claims {
		c := claims("apply", "r1")
		c.IssuedAt, c.Expires = t0.Add(d), t0.Add(d+5*time.Minute)
		return c
	}
	long := claims("apply", "r1")
	long.Expires = t0.Add(2 * time.Hour)
	otherNode := claims("apply", "r1")
	otherNode.Node = "gw2"
	notAllowed := claims("delete", "r1")

	// flattened JSON with an unprotected kid
	var flat map[string]any
	obj, err := jose.ParseSignedCompact(string(good), []jose.SignatureAlgorithm{jose.EdDSA})
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(obj.FullSerialize()), &flat); err != nil {
		t.Fatal(err)
	}
	flat["header"] = map[string]any{"kid": "ci"}
	flatUnprot, _ := json.Marshal(flat)

	cases := []struct {
		name, verb, id string
		payload        []byte
		want           string
	}{
		{"tampered body", "apply", "r1", join(t, h, tamperedBody, s), "bad signature for key ops"},
		{"tampered header", "apply", "r1", join(t, tamperedHeader, p, s), `header parameter "cty" is not accepted`},
		{"kid switched in header", "apply", "r1", join(t, kidSwap, p, s), "bad signature for key ci"},
		{"wrong key", "apply", "r1", sign(t, wrongKey, claims("apply", "r1"), manifest), "bad signature for key ops"},
		{"unknown key id", "apply", "r1", sign(t, unknown, claims("apply", "r1"), manifest), `unknown key id "stranger"`},
		{"alg none", "apply", "r1", none, `algorithm "none" is not accepted`},
		{"alg HS256", "apply", "r1", []byte(hsCompact), `algorithm "HS256" is not accepted`},
		{"expired", "apply", "r1", sign(t, f.signer, at(-10*time.Minute), manifest), "expired at 2026-12-01T09:55:00Z"},
		{"issued in the future", "apply", "r1", sign(t, f.signer, at(2*time.Minute), manifest), "issued in the future"},
		{"lifetime too long", "apply", "r1", sign(t, f.signer, long, manifest), "lifetime 2h0m0s exceeds the maximum of 1h0m0s"},
		{"wrong node", "apply", "r1", sign(t, f.signer, otherNode, manifest), `signed for node "gw2", this is "gw1"`},
		{"wrong verb", "sync", "r1", good, `signed for verb "apply", the topic says "sync"`},
		{"wrong request id", "apply", "r2", good, `signed for request id "r1", the topic carries "r2"`},
		{"verb not allowed for key", "delete", "r1", sign(t, f.other, notAllowed, manifest), "key ci may not sign verb delete"},
		{"unprotected header", "apply", "r1", flatUnprot, "unprotected JWS header parameters are not accepted"},
		{"malformed", "apply", "r1", []byte("eyJhbGc.eyJ.xx"), "malformed JWS"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			expectReject(t, f.verifier, tc.verb, tc.id, tc.payload, tc.want)
		})
	}
	// Within the skew, a little future is fine.
	if _, err := f.verifier.Open("apply", "r1", sign(t, f.signer, at(20*time.Second), manifest)); err != nil {
		t.Fatalf("iat within clock skew: %v", err)
	}
	// None of the rejected ones spent the good envelope's nonce.
	if _, err := f.verifier.Open("apply", "r1", good); err != nil {
		t.Fatalf("good envelope after the rejections: %v", err)
	}
	expectReject(t, f.verifier, "apply", "r1", good, "replayed nonce")
}

func TestFlattenedJSONIsAccepted(t *testing.T) {
	f := newFixture(t, signing.Policy{Required: true}, nil)
	obj, err := jose.ParseSignedCompact(string(sign(t, f.signer, claims("get", "q1"), "{}")), []jose.SignatureAlgorithm{jose.EdDSA})
	if err != nil {
		t.Fatal(err)
	}
	flat := []byte(obj.FullSerialize())
	if !signing.LooksSigned(flat) {
		t.Fatalf("flattened JWS does not look signed: %s", flat)
	}
	got, err := f.verifier.Open("get", "q1", flat)
	if err != nil || string(got.Body) != "{}" {
		t.Fatalf("flattened: %+v %v", got, err)
	}
}

func TestLooksSigned(t *testing.T) {
	for _, s := range []string{manifest, `{"kind":"Pod","metadata":{"name":"signature"}}`, "", "{}", `{"kind":"Pod","spec":{"signature":1}}`, "a.b.c"} {
		if signing.LooksSigned([]byte(s)) {
			t.Errorf("%q looks signed", s)
		}
	}
}

func TestReplayIsRejectedAfterReopeningTheNonceStore(t *testing.T) {
	path := filepath.Join(t.TempDir(), "nonces.db")
	st, err := noncestore.Open(path, 100)
	if err != nil {
		t.Fatal(err)
	}
	f := newFixture(t, signing.Policy{Required: true}, st)
	env := sign(t, f.signer, claims("apply", "r1"), manifest)
	if _, err := f.verifier.Open("apply", "r1", env); err != nil {
		t.Fatal(err)
	}
	expectReject(t, f.verifier, "apply", "r1", env, "replayed nonce")
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}

	st2, err := noncestore.Open(path, 100)
	if err != nil {
		t.Fatal(err)
	}
	defer st2.Close()
	if st2.Count() != 1 {
		t.Fatalf("reopened store holds %d nonces, want 1", st2.Count())
	}
	v2, err := signing.NewVerifier(signing.Policy{Required: true, Targets: []string{"gw1"}, MaxLifetime: time.Hour, ClockSkew: 30 * time.Second, MaxEnvelopeBytes: 1 << 20,
		Keys: []signing.Key{{ID: "ops", Public: f.signer.Public(), Verbs: []string{"*"}}}}, st2, func() time.Time { return t0.Add(time.Minute) })
	if err != nil {
		t.Fatal(err)
	}
	expectReject(t, v2, "apply", "r1", env, "replayed nonce")
	// A fresh one still passes.
	if _, err := v2.Open("apply", "r2", sign(t, f.signer, claims("apply", "r2"), manifest)); err != nil {
		t.Fatal(err)
	}
}

func mustKey(t testing.TB) ed25519.PrivateKey {
	t.Helper()
	k, err := signing.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func TestNewVerifierRefusesBadPolicies(t *testing.T) {
	pub := mustKey(t).Public().(ed25519.PublicKey)
	base := func() signing.Policy {
		return signing.Policy{Targets: []string{"gw1"}, MaxLifetime: time.Hour, MaxEnvelopeBytes: 1024,
			Keys: []signing.Key{{ID: "a", Public: pub, Verbs: []string{"get"}}}}
	}
	cases := map[string]func(*signing.Policy){
		"required without keys": func(p *signing.Policy) { p.Required, p.Keys = true, nil },
		"duplicate key":         func(p *signing.Policy) { p.Keys = append(p.Keys, p.Keys[0]) },
		"no verbs":              func(p *signing.Policy) { p.Keys[0].Verbs = nil },
		"bad profile":           func(p *signing.Policy) { p.Keys[0].MaxProfile = "root" },
		"bad key id":            func(p *signing.Policy) { p.Keys[0].ID = "a/b" },
		"no targets":            func(p *signing.Policy) { p.Targets = nil },
	}
	for name, mutate := range cases {
		p := base()
		mutate(&p)
		if _, err := signing.NewVerifier(p, &memNonces{}, nil); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := signing.NewVerifier(base(), nil, nil); err == nil {
		t.Error("keys without a nonce store: accepted")
	}
}
