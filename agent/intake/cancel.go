package intake

import (
	"errors"
	"fmt"

	"github.com/mqlet/mqlet/agent/manifest"
	"github.com/mqlet/mqlet/agent/streams"
	apiv1 "github.com/mqlet/mqlet/api/v1"
)

// handleCancel ends a running logs, exec or restart request (its stream).
func (in *Intake) handleCancel(r request) {
	id, payload := r.id, r.payload
	const verb = "cancel"
	v := in.opts.Verbs
	if v.Streams == nil {
		in.fail(id, verb, errors.New("verb \"cancel\" is not supported by this mqlet"))
		return
	}
	var args apiv1.CancelRequest
	if err := manifest.DecodeArgs(payload, &args); err != nil {
		in.fail(id, verb, fmt.Errorf("decoding cancel request: %w", err))
		return
	}
	if err := apiv1.ValidateRequestID(args.RequestID); err != nil {
		in.fail(id, verb, fmt.Errorf("requestId: %w", err))
		return
	}
	scope, by := in.scope, in.cmdRequester
	in.afterCommit(func(in *Intake) {
		// A request about a pod outside the scope is answered as one not
		// running: the scope learns nothing of other namespaces' requests.
		// MQTT 3.1.1 names no publisher, so within the scope the signing key
		// is all that tells requesters apart: a request started by a
		// signed command is cancelled only by a cancel signed with that key.
		var otherKey string
		cancelled := in.opts.Verbs.Streams.CancelIf(args.RequestID, func(k streams.Kind) bool {
			if !scope.sees(ownerMeta(k.Owner)) {
				return false
			}
			if k.Requester != "" && k.Requester != by {
				otherKey = k.Requester
				return false
			}
			return true
		})
		if otherKey != "" {
			in.log.Warn().Str("requestId", id).Str("target", args.RequestID).Str("by", by).Msg("cancel refused: the request was signed by another key")
			in.fail(id, verb, fmt.Errorf("request %q was started by a command signed with %s: only a cancel signed with that key ends it", args.RequestID, otherKey))
			return
		}
		if !cancelled {
			in.fail(id, verb, fmt.Errorf("no running request %q in this command's scope (logs, exec and restart requests can be cancelled while they run)", args.RequestID))
			return
		}
		_ = in.replies.Send(apiv1.Reply{RequestID: id, Verb: verb, Phase: apiv1.Succeeded, Message: "cancelled request " + args.RequestID,
			Result: apiv1.CancelResult{RequestID: args.RequestID}})
	})
}
