package intake

import (
	"errors"
	"fmt"
	"github.com/mqlet/mqlet/agent/store"
	"strings"

	"github.com/mqlet/mqlet/agent/manifest"
	"github.com/mqlet/mqlet/agent/pending"
	apiv1 "github.com/mqlet/mqlet/api/v1"
)

// handleDelete removes objects from the desired state; their pods are
// killed gracefully.
func (in *Intake) handleDelete(r request) {
	id, payload := r.id, r.payload
	refs, grace, err := manifest.DecodeRefIn(payload, in.scope.defaultNamespace())
	if err != nil {
		in.fail(id, "delete", fmt.Errorf("decoding delete request: %w", err))
		return
	}
	var outside []string
	for _, r := range refs {
		if !in.scope.allows(r.Namespace) {
			outside = append(outside, in.scope.outside(r.Kind, r.Namespace, r.Name).Error())
		}
	}
	for _, r := range refs {
		if len(outside) > 0 {
			break
		}
		var rejected *store.RejectedError
		if err := in.store.CheckSource(in.scope.Source(), r.Kind, r.Namespace, r.Name); errors.As(err, &rejected) {
			outside = append(outside, rejected.Error())
		} else if err != nil {
			in.fail(id, "delete", fmt.Errorf("deleting %s: %w", r, err))
			return
		}
	}
	if len(outside) > 0 {
		in.fail(id, "delete", fmt.Errorf("%d object(s) refused, nothing deleted: %s", len(outside), summarize(outside)), outside...)
		return
	}
	if grace != nil && *grace < 0 {
		in.fail(id, "delete", errors.New("gracePeriodSeconds must not be negative"))
		return
	}
	var objs []string
	for _, r := range refs {
		if r.Kind == store.KindConfigMap || r.Kind == store.KindSecret {
			objs = append(objs, objRef(r.Kind, r.Namespace, r.Name))
		}
	}
	if err := in.checkProtectedDeletes(objs); err != nil {
		in.fail(id, "delete", err)
		return
	}
	want := map[string]pending.Want{}
	var deleted, missing []string
	var objChanges []store.Change
	for _, r := range refs {
		existed, err := in.store.Delete(r.Kind, r.Namespace, r.Name)
		if err != nil {
			in.fail(id, "delete", fmt.Errorf("deleting %s: %w", r, err))
			return
		}
		if !existed {
			missing = append(missing, r.String())
			continue
		}
		deleted = append(deleted, r.String())
		if r.Kind == store.KindConfigMap || r.Kind == store.KindSecret {
			objChanges = append(objChanges, store.Change{Kind: r.Kind, Key: r.Namespace + "/" + r.Name, Action: store.Deleted})
		}
		if r.Kind == "Pod" {
			want[r.Namespace+"/"+r.Name] = pending.Want{Gone: true}
		}
	}
	if len(deleted) == 0 {
		in.fail(id, "delete", fmt.Errorf("not found: %s", strings.Join(missing, ", ")))
		return
	}
	msg := "deleted from desired state: " + strings.Join(deleted, ", ")
	if len(missing) > 0 {
		msg += "; not found: " + strings.Join(missing, ", ")
	}
	_ = in.replies.Send(apiv1.Reply{RequestID: id, Verb: "delete", Phase: apiv1.Accepted, Message: msg})
	in.follow(id, "delete", want)
	for _, key := range sortedKeys(want) {
		in.pods.EnqueueDelete(key, grace)
	}
	in.enqueueUsers(objChanges, want)
}
