package intake

import (
	"fmt"

	v1 "k8s.io/api/core/v1"

	"github.com/mqlet/mqlet/agent/validate"
	apiv1 "github.com/mqlet/mqlet/api/v1"
	"github.com/mqlet/mqlet/signing"
)

// targetOf is the name a command on scope's topic is signed for: the
// group's, or the node's.
func targetOf(node string, scope apiv1.Scope) string {
	if scope.Group != "" {
		return scope.Group
	}
	return node
}

// Opener checks a command's signature envelope against the node's signing
// policy and returns the inner command (signing.Verifier does this).
type Opener interface {
	Open(verb, requestID string, payload []byte) (signing.Opened, error)
}

// open runs the Opener, if any, on a command's payload. It fails the command
// with the Opener's reason, or returns the inner command and remembers the
// profile its signer may ask for, for the pod validation of this command.
func (in *Intake) open(id, verb string, scope apiv1.Scope, payload []byte) ([]byte, bool) {
	in.cmdProfile, in.cmdRequester, in.scope = "", "", cmdScope{Scope: scope}
	if in.opts.Opener == nil {
		return payload, true
	}
	opened, err := in.opts.Opener.Open(verb, id, payload)
	if err != nil {
		// Unrecorded: anyone on the broker can publish an unsigned or
		// forged command, and a recorded refusal would use up its request
		// id, so the operator's signed command with that id would only get
		// the refusal back and never run.
		in.refuseUnrecorded(id, verb, err)
		in.events.ObjectEvent(v1.ObjectReference{Kind: "Node", Name: in.opts.Topics.Node}, v1.EventTypeWarning, "FailedSignature", "request "+id+": "+err.Error())
		return nil, false
	}
	if opened.Signed {
		// The envelope names the node or group it was signed for: it must
		// be the one whose topic it came on, so a command signed for one
		// member cannot be sent to the whole group, nor one signed for a
		// group to a node outside it.
		if want := targetOf(in.opts.Topics.Node, scope); opened.Target != want {
			err := fmt.Errorf("signature rejected: signed for %q, but sent on the topic of %q", opened.Target, want)
			in.refuseUnrecorded(id, verb, err)
			in.events.ObjectEvent(v1.ObjectReference{Kind: "Node", Name: in.opts.Topics.Node}, v1.EventTypeWarning, "FailedSignature", "request "+id+": "+err.Error())
			return nil, false
		}
		in.log.Info().Str("requestId", id).Str("verb", verb).Str("keyId", opened.KeyID).Msg("signed command verified")
		in.scope.keyNamespaces = opened.Namespaces
	}
	in.cmdProfile = opened.MaxProfile
	if opened.Signed {
		in.cmdRequester = "key " + opened.KeyID
	}
	return opened.Body, true
}

// podPolicy is the admission policy for a pod in namespace of the command
// being handled: the node's, or what ProfilePolicy makes of it for the
// profile the command's signing key may ask for.
func (in *Intake) podPolicy(namespace string) validate.Policy {
	if in.cmdProfile == "" || in.opts.ProfilePolicy == nil {
		return in.opts.Policy
	}
	return in.opts.ProfilePolicy(in.opts.Policy, namespace, in.cmdProfile)
}
