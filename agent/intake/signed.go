package intake

import (
	v1 "k8s.io/api/core/v1"

	"github.com/mqlet/mqlet/agent/validate"
	"github.com/mqlet/mqlet/signing"
)

// Opener checks a command's signature envelope against the node's signing
// policy and returns the inner command (signing.Verifier does this).
type Opener interface {
	Open(verb, requestID string, payload []byte) (signing.Opened, error)
}

// open runs the Opener, if any, on a command's payload. It fails the command
// with the Opener's reason, or returns the inner command and remembers the
// profile its signer may ask for, for the pod validation of this command.
func (in *Intake) open(id, verb string, payload []byte) ([]byte, bool) {
	in.cmdProfile, in.cmdRequester = "", ""
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
		in.log.Info().Str("requestId", id).Str("verb", verb).Str("keyId", opened.KeyID).Msg("signed command verified")
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
