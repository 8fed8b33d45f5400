package intake

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/mqlet/mqlet/agent/manifest"
	apiv1 "github.com/mqlet/mqlet/api/v1"
)

// config applies a merge patch of live settings and answers with the
// effective configuration.
func (in *Intake) handleConfig(r request) {
	id, payload := r.id, r.payload
	const verb = "config"
	live := in.opts.Verbs.Config
	if live == nil {
		in.fail(id, verb, errors.New("verb \"config\" is not supported by this mqlet"))
		return
	}
	if err := in.scope.nodeWide("verb config"); err != nil {
		in.fail(id, verb, err)
		return
	}
	var patch map[string]any
	if err := manifest.DecodeArgs(payload, &patch); err != nil {
		in.fail(id, verb, fmt.Errorf("decoding config patch: %w", err))
		return
	}
	raw, err := json.Marshal(patch)
	if err != nil {
		in.fail(id, verb, fmt.Errorf("decoding config patch: %w", err))
		return
	}
	changed, err := live.Patch(raw)
	if err != nil {
		in.fail(id, verb, err)
		return
	}
	view, err := live.View()
	if err != nil {
		in.fail(id, verb, err)
		return
	}
	in.log.Info().Strs("settings", changed).Str("requestId", id).Msg("settings changed over MQTT")
	_ = in.replies.Send(apiv1.Reply{RequestID: id, Verb: verb, Phase: apiv1.Succeeded,
		Message: "changed " + strings.Join(changed, ", ") + " (persisted; kept across restarts)", Result: view})
}

// getConfig answers get {"kind":"Config"}: every setting with its source.
func (in *Intake) getConfig(id string, args apiv1.GetRequest) {
	live := in.opts.Verbs.Config
	switch {
	case live == nil:
		in.fail(id, "get", errors.New("kind Config is not supported by this mqlet"))
		return
	case args.Namespace != "" || args.Name != "" || args.LabelSelector != "" || args.InvolvedObject != nil:
		in.fail(id, "get", errors.New("kind Config takes no namespace, name, labelSelector or involvedObject"))
		return
	}
	view, err := live.View()
	if err != nil {
		in.fail(id, "get", err)
		return
	}
	_ = in.replies.Send(apiv1.Reply{RequestID: id, Verb: "get", Phase: apiv1.Succeeded,
		Message: fmt.Sprintf("%d settings", len(view.Settings)), Result: view})
}
