package signing

import (
	"encoding/json"
	"fmt"
	"slices"
	"time"

	apiv1 "github.com/mqlet/mqlet/api/v1"
)

// A group's desired-state document (apiv1.GroupDocument) is retained: a
// member that was offline, or joins later, receives it days after it was
// signed, and every (re)connect delivers it again. So its envelope is the
// commands' envelope with other claims: node names the group, verb is
// apiv1.VerbDesired, iat is set; requestId, exp and nonce are absent.
// Its replay protection is the document's generation, which the node
// applies only when newer than the last it applied (signed inside the
// body), not a nonce; a document has no expiry.

// SignDocument returns the signed envelope of a group document: body is
// the apiv1.GroupDocument JSON.
func (s *Signer) SignDocument(group string, issuedAt time.Time, body []byte) ([]byte, error) {
	payload, err := json.Marshal(wireClaims{Node: group, Verb: apiv1.VerbDesired, IssuedAt: issuedAt.Unix(), Body: body})
	if err != nil {
		return nil, fmt.Errorf("encoding document claims: %w", err)
	}
	obj, err := s.sig.Sign(payload)
	if err != nil {
		return nil, fmt.Errorf("signing group document: %w", err)
	}
	out, err := obj.CompactSerialize()
	if err != nil {
		return nil, fmt.Errorf("serializing signed group document: %w", err)
	}
	return []byte(out), nil
}

// OpenDocument checks the retained document of group and returns its
// body. Unsigned, it passes unless the node wants sync signed
// (security.commands: signed-only, or sync, apply or delete in
// security.signedVerbs): a document does what the group's sync does.
// Signed, it must be signed by a trusted key that may sign sync, for this
// group, as a document (not a command), not issued in the future.
func (v *Verifier) OpenDocument(group string, payload []byte) (Opened, error) {
	if !LooksSigned(payload) {
		if need, why := v.required(apiv1.VerbSync); need {
			return Opened{}, &RejectError{msg: "signature required: a group document does what the group's sync does, and " + why}
		}
		return Opened{Body: payload}, nil
	}
	key, c, err := v.verify(payload)
	if err != nil {
		return Opened{}, err
	}
	switch {
	case c.Verb != apiv1.VerbDesired:
		return Opened{}, rejected("signed for verb %q, not as a group document (%q): a command's envelope is not a document", bounded(c.Verb), apiv1.VerbDesired)
	case c.Node != group:
		return Opened{}, rejected("signed for %q, but sent as the document of group %q", bounded(c.Node), group)
	case !slices.Contains(v.policy.Targets, group) && (v.policy.Groups == nil || !slices.Contains(v.policy.Groups(), group)):
		return Opened{}, rejected("signed for group %q, which this node is not in", group)
	case c.RequestID != "" || c.Expires != 0 || c.Nonce != "":
		return Opened{}, rejected("a group document carries no requestId, exp or nonce (its generation orders it)")
	case !slices.Contains(key.Verbs, AllVerbs) && !slices.Contains(key.Verbs, apiv1.VerbSync):
		return Opened{}, rejected("key %s may not sign group documents: that needs verb sync (it may sign: %s)", key.ID, joinVerbs(key.Verbs))
	}
	now := v.now()
	iat := time.Unix(c.IssuedAt, 0)
	if c.IssuedAt <= 0 {
		return Opened{}, rejected("iat must be set")
	}
	if iat.After(now.Add(v.policy.ClockSkew)) {
		return Opened{}, rejected("issued in the future (iat %s, node time %s, allowed skew %s)", stamp(iat), stamp(now), v.policy.ClockSkew)
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

func joinVerbs(verbs []string) string {
	out := ""
	for i, v := range verbs {
		if i > 0 {
			out += ", "
		}
		out += v
	}
	return out
}

// PeekDocument reads a signed group document's claims WITHOUT checking
// its signature: for a tool that shows which generation is retained and
// who says they signed it (mqletctl group status), never for deciding to
// apply it (a node uses OpenDocument). It fails on what is no document
// envelope (a command's, or a malformed one).
func PeekDocument(payload []byte) (group, keyID string, issuedAt time.Time, body []byte, err error) {
	obj, err := parse(payload)
	if err != nil {
		return "", "", time.Time{}, nil, err
	}
	if len(obj.Signatures) != 1 {
		return "", "", time.Time{}, nil, rejected("want exactly one signature, got %d", len(obj.Signatures))
	}
	var c wireClaims
	if err := json.Unmarshal(obj.UnsafePayloadWithoutVerification(), &c); err != nil {
		return "", "", time.Time{}, nil, rejected("claims do not decode: %v", err)
	}
	if c.Verb != apiv1.VerbDesired {
		return "", "", time.Time{}, nil, rejected("signed for verb %q, not as a group document (%q)", bounded(c.Verb), apiv1.VerbDesired)
	}
	return c.Node, obj.Signatures[0].Protected.KeyID, time.Unix(c.IssuedAt, 0), c.Body, nil
}
