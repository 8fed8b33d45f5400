package intake

import (
	"fmt"

	v1 "k8s.io/api/core/v1"
	apiruntime "k8s.io/apimachinery/pkg/runtime"

	"github.com/mqlet/mqlet/sealing"
)

// Unsealer opens the values of a Secret sealed to this node
// (sealing.Identity); its errors never hold a value.
type Unsealer interface {
	UnsealSecret(sec *v1.Secret) error
	Recipient() string
}

// ReasonFailedUnseal is the event reason of a Secret refused at unsealing.
const ReasonFailedUnseal = "FailedUnseal"

// maxSealedValues bounds the values one command may ask the node to open:
// each costs an X25519 agreement (about 0.25 ms), so a payload of small
// sealed values could otherwise buy seconds of CPU.
const maxSealedValues = 1024

// unsealAll replaces the values of every sealed Secret of a command by
// their plaintext, before validation and storing, and returns one problem
// per Secret refused: sealed to another key, not openable, or (with
// RequireSealedSecrets) not sealed at all.
func (in *Intake) unsealAll(objs []apiruntime.Object) []string {
	sealed := 0
	for _, o := range objs {
		if sec, ok := o.(*v1.Secret); ok && sealing.IsSealed(sec) {
			sealed += len(sec.Data)
		}
	}
	if sealed > maxSealedValues {
		return []string{fmt.Sprintf("%d sealed values in one command, at most %d are opened: send the Secrets in several commands", sealed, maxSealedValues)}
	}
	var problems []string
	for _, o := range objs {
		sec, ok := o.(*v1.Secret)
		if !ok {
			continue
		}
		ns := sec.Namespace
		if ns == "" {
			ns = v1.NamespaceDefault
		}
		switch {
		case !sealing.IsSealed(sec) && in.opts.RequireSealedSecrets:
			problems = append(problems, fmt.Sprintf("Secret %s/%s: not sealed; this node accepts only sealed Secrets (security.requireSealedSecrets): send it with mqletctl, which seals it to the node's sealingKey", ns, sec.Name))
		case !sealing.IsSealed(sec):
		case in.opts.Unsealer == nil:
			problems = append(problems, fmt.Sprintf("Secret %s/%s: sealed, but this node has no sealing key", ns, sec.Name))
		default:
			if err := in.opts.Unsealer.UnsealSecret(sec); err != nil {
				problems = append(problems, fmt.Sprintf("Secret %s/%s: %v", ns, sec.Name, err))
			}
		}
	}
	return problems
}
