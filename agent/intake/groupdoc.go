package intake

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/mqlet/mqlet/agent/store"
	apiv1 "github.com/mqlet/mqlet/api/v1"
	"github.com/mqlet/mqlet/signing"
)

// A group's document (apiv1.GroupDocument, retained on
// <prefix>/group/<g>/desired) is the group's desired state for members
// that were offline when it was sent, or join later. A member applies it
// as the group's sync would, once: only a generation newer than the one it
// last applied for the group, kept in the store in the transaction that
// applies it. So the retained message, delivered again at every connect,
// is never refused as a retained command would be, and is never run twice.

// Reasons of the events about group documents.
const (
	ReasonAppliedGroupDocument = apiv1.ReasonAppliedGroupDocument
	ReasonStaleGroupDocument   = apiv1.ReasonStaleGroupDocument
	ReasonFailedGroupDocument  = apiv1.ReasonFailedGroupDocument
)

// DocumentOpener checks a group document's signature envelope against the
// node's signing policy and returns the document (signing.Verifier).
type DocumentOpener interface {
	OpenDocument(group string, payload []byte) (signing.Opened, error)
}

// handleDocument applies the document of group that came on its topic
// (topicErr: the topic's group name is not valid), when it is newer than
// the last applied. Every refusal is a Warning event and a log line; a
// document applied is answered like a sync under
// apiv1.GroupDocumentRequestID on the node's reply topic.
func (in *Intake) handleDocument(cmd Command, group string, topicErr error) {
	log := in.log.With().Str("group", group).Str("topic", cmd.Topic).Logger()
	refuse := func(err error) {
		in.rejected.Add(1)
		log.Warn().Err(err).Msg("group document not applied")
		in.nodeEvent(v1.EventTypeWarning, ReasonFailedGroupDocument, "group document on "+cmd.Topic+" not applied: "+err.Error())
	}
	if topicErr != nil {
		refuse(topicErr)
		return
	}
	if len(cmd.Payload) == 0 {
		// How a retained document is cleared: the node keeps what it applied.
		log.Info().Msg("group document cleared; the node keeps the group's objects it applied")
		return
	}
	if err := in.checkMember(apiv1.Scope{Group: group}); err != nil {
		refuse(err)
		return
	}
	if limit := in.maxEnvelopeBytes(); len(cmd.Payload) > limit {
		refuse(fmt.Errorf("document of %d bytes exceeds the limit of %d bytes", len(cmd.Payload), limit))
		return
	}
	opened, err := in.openDocument(group, cmd.Payload)
	if err != nil {
		refuse(err)
		return
	}
	if in.opts.MaxPayloadBytes > 0 && len(opened.Body) > in.opts.MaxPayloadBytes {
		refuse(fmt.Errorf("document of %d bytes exceeds the limit of %d bytes (mqtt.maxPayloadBytes)", len(opened.Body), in.opts.MaxPayloadBytes))
		return
	}
	doc, err := apiv1.DecodeGroupDocument(group, opened.Body)
	if err != nil {
		refuse(err)
		return
	}
	log = log.With().Uint64("generation", doc.Generation).Logger()
	sum := sha256.Sum256(opened.Body)
	digest := hex.EncodeToString(sum[:])
	applied, found, err := in.store.GroupApplied(group)
	if err != nil {
		refuse(fmt.Errorf("reading the generation applied: %w", err))
		return
	}
	switch {
	case found && doc.Generation == applied.Generation && digest == applied.Digest:
		// The retained document again, at a (re)connect: nothing to do.
		log.Debug().Msg("group document already applied")
		return
	case found && doc.Generation == applied.Generation:
		in.rejected.Add(1)
		msg := fmt.Sprintf("group %s: a document of generation %d with other content than the one applied at %s is not applied: publish it with a newer generation",
			group, doc.Generation, applied.AppliedAt.UTC().Format(time.RFC3339))
		log.Warn().Msg(msg)
		in.nodeEvent(v1.EventTypeWarning, ReasonStaleGroupDocument, msg)
		return
	case found && doc.Generation < applied.Generation:
		in.rejected.Add(1)
		msg := fmt.Sprintf("group %s: document of generation %d not applied: generation %d was applied at %s", group, doc.Generation, applied.Generation, applied.AppliedAt.UTC().Format(time.RFC3339))
		log.Warn().Uint64("applied", applied.Generation).Msg("older group document not applied")
		in.nodeEvent(v1.EventTypeWarning, ReasonStaleGroupDocument, msg)
		return
	}
	id := apiv1.GroupDocumentRequestID(group, doc.Generation)
	// A generation that failed here before (refused, or it stopped the
	// agent) is not tried again at every connect: a newer one is the fix.
	if recorded, ok, err := in.store.LookupReply(id); err == nil && ok {
		if r, err := apiv1.DecodeReply(recorded); err == nil && r.Phase == apiv1.Failed {
			log.Info().Str("requestId", id).Msg("this generation of the group document failed before; not tried again (publish a newer one)")
			return
		}
	}
	in.received.Add(1)
	defer in.markInFlight(id, apiv1.VerbDesired, log)()
	defer in.recoverPanic(id, apiv1.VerbDesired, log)
	in.cmdProfile, in.cmdRequester = opened.MaxProfile, ""
	in.scope = cmdScope{Scope: apiv1.Scope{Group: group}, keyNamespaces: opened.Namespaces}
	if opened.Signed {
		in.cmdRequester = "key " + opened.KeyID
		log.Info().Str("keyId", opened.KeyID).Msg("signed group document verified")
	}
	log.Info().Int("bytes", len(opened.Body)).Str("requestId", id).Msg("applying group document")
	if !in.applyObjects(id, apiv1.VerbDesired, doc.Objects, true) {
		return
	}
	if err := in.store.SetGroupApplied(group, &store.GroupApplied{Generation: doc.Generation, AppliedAt: in.now().UTC(), Digest: digest}); err != nil {
		// Applied but not recorded: the next delivery applies it again,
		// which a sync of the same objects makes a no-op.
		log.Error().Err(err).Msg("recording the generation of the group document applied")
		return
	}
	prev := "none"
	if found {
		prev = strconv.FormatUint(applied.Generation, 10)
	}
	in.nodeEvent(v1.EventTypeNormal, ReasonAppliedGroupDocument, fmt.Sprintf("group %s: applied generation %d (previous: %s; request %s)", group, doc.Generation, prev, id))
	if in.opts.OnGroupApplied != nil {
		in.opts.OnGroupApplied(group, doc.Generation)
	}
}

// openDocument checks the document's signature; without a DocumentOpener
// a signed document cannot be checked and is refused.
func (in *Intake) openDocument(group string, payload []byte) (signing.Opened, error) {
	if in.opts.DocumentOpener != nil {
		return in.opts.DocumentOpener.OpenDocument(group, payload)
	}
	if signing.LooksSigned(payload) {
		return signing.Opened{}, errors.New("signature rejected: the document is signed but this node checks no signatures")
	}
	return signing.Opened{Body: payload}, nil
}

// maxEnvelopeBytes bounds a document before its envelope is opened: a
// body of MaxPayloadBytes grows by base64 twice in a signed envelope
// (16/9), plus room for the claims, as a signed command's does.
func (in *Intake) maxEnvelopeBytes() int {
	if in.opts.MaxPayloadBytes <= 0 {
		return 16 << 20
	}
	return in.opts.MaxPayloadBytes*16/9 + 4096
}
