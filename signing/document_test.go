package signing_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	apiv1 "github.com/mqlet/mqlet/api/v1"
	"github.com/mqlet/mqlet/signing"
)

const doc = `{"apiVersion":"mqlet.io/v1","kind":"GroupDocument","group":"line-1","generation":3,"objects":{"apiVersion":"v1","kind":"List","items":[]}}`

func docFixture(t *testing.T, p signing.Policy) *fixture {
	t.Helper()
	p.Groups = func() []string { return []string{"line-1"} }
	return newFixture(t, p, nil)
}

func signDoc(t *testing.T, s *signing.Signer, group string, iat time.Time) []byte {
	t.Helper()
	env, err := s.SignDocument(group, iat, []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	return env
}

func wantDocReject(t *testing.T, v *signing.Verifier, group string, payload []byte, want string) {
	t.Helper()
	_, err := v.OpenDocument(group, payload)
	var re *signing.RejectError
	if err == nil || !errors.As(err, &re) || !strings.Contains(err.Error(), want) {
		t.Fatalf("OpenDocument: %v; want a rejection saying %q", err, want)
	}
}

// A signed document opens days after it was signed, and again (no nonce
// is spent: the generation orders documents); what it must say is checked.
func TestSignedGroupDocument(t *testing.T) {
	f := docFixture(t, signing.Policy{Required: true})
	env := signDoc(t, f.signer, "line-1", t0)
	f.now = t0.Add(30 * 24 * time.Hour)
	for i := range 2 {
		got, err := f.verifier.OpenDocument("line-1", env)
		if err != nil || !got.Signed || got.KeyID != "ops" || string(got.Body) != doc || got.Target != "line-1" {
			t.Fatalf("open %d: %+v, %v", i, got, err)
		}
	}
	// Unsigned where signed-only: refused.
	wantDocReject(t, f.verifier, "line-1", []byte(doc), "signature required: a group document does what the group's sync does")
	// Signed for another group, or sent as another group's document.
	wantDocReject(t, f.verifier, "line-2", env, `signed for "line-1", but sent as the document of group "line-2"`)
	wantDocReject(t, f.verifier, "line-9", signDoc(t, f.signer, "line-9", t0), `which this node is not in`)
	// A key that may not sign sync.
	wantDocReject(t, f.verifier, "line-1", signDoc(t, f.other, "line-1", t0), "may not sign group documents")
	// Issued in the future.
	wantDocReject(t, f.verifier, "line-1", signDoc(t, f.signer, "line-1", f.now.Add(time.Hour)), "issued in the future")
	// A command's envelope is not a document, nor a document a command.
	cmd := sign(t, f.signer, signing.Claims{Node: "line-1", Verb: "sync", RequestID: "r1", IssuedAt: f.now, Expires: f.now.Add(time.Minute)}, doc)
	wantDocReject(t, f.verifier, "line-1", cmd, `signed for verb "sync", not as a group document`)
	if _, err := f.verifier.Open(apiv1.VerbDesired, "", env); err == nil {
		t.Fatal("a document's envelope opened as a command")
	}
	// Tampered.
	tampered := []byte(string(env[:len(env)-4]) + "AAAA")
	wantDocReject(t, f.verifier, "line-1", tampered, "bad signature")
}

// Unsigned documents pass where sync need not be signed; where apply,
// delete or sync must be signed, so must a document.
func TestUnsignedGroupDocumentFollowsSyncPolicy(t *testing.T) {
	f := docFixture(t, signing.Policy{})
	if got, err := f.verifier.OpenDocument("line-1", []byte(doc)); err != nil || got.Signed || string(got.Body) != doc {
		t.Fatalf("unsigned, signing off: %+v %v", got, err)
	}
	for _, verb := range []string{"apply", "delete", "sync"} {
		f := docFixture(t, signing.Policy{SignedVerbs: []string{verb}})
		wantDocReject(t, f.verifier, "line-1", []byte(doc), "signature required")
	}
	f = docFixture(t, signing.Policy{SignedVerbs: []string{"exec"}})
	if _, err := f.verifier.OpenDocument("line-1", []byte(doc)); err != nil {
		t.Fatalf("unsigned document where only exec must be signed: %v", err)
	}
}

// PeekDocument reads what a signed document says without a key (a tool's
// view); a command's envelope is not taken for one.
func TestPeekDocument(t *testing.T) {
	f := docFixture(t, signing.Policy{})
	group, kid, iat, body, err := signing.PeekDocument(signDoc(t, f.signer, "line-1", t0))
	if err != nil || group != "line-1" || kid != "ops" || !iat.Equal(t0.Truncate(time.Second)) || string(body) != doc {
		t.Fatalf("peek: %q %q %v %q %v", group, kid, iat, body, err)
	}
	cmd := sign(t, f.signer, signing.Claims{Node: "line-1", Verb: "sync", RequestID: "r1", IssuedAt: t0, Expires: t0.Add(time.Minute)}, doc)
	if _, _, _, _, err := signing.PeekDocument(cmd); err == nil || !strings.Contains(err.Error(), "not as a group document") {
		t.Fatalf("a command's envelope peeked as a document: %v", err)
	}
	if _, _, _, _, err := signing.PeekDocument([]byte("eyJ.x.y")); err == nil {
		t.Fatal("a malformed envelope peeked")
	}
}
