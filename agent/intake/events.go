package intake

import (
	"errors"
	"fmt"

	v1 "k8s.io/api/core/v1"

	apiv1 "github.com/mqlet/mqlet/api/v1"
)

// EventHistory is the node's kept events (agent/eventlog).
type EventHistory interface {
	List(match func(*v1.Event) bool) []*v1.Event
}

// getEvents answers get {"kind":"Event"}: the kept events, oldest first,
// of one involved object and namespace when given.
func (in *Intake) getEvents(id string, args apiv1.GetRequest) {
	h := in.opts.Verbs.Events
	switch {
	case h == nil:
		in.fail(id, "get", errors.New("kind Event is not supported by this mqlet"))
		return
	case args.Name != "" || args.LabelSelector != "":
		in.fail(id, "get", errors.New("kind Event takes namespace and involvedObject, not name or labelSelector"))
		return
	}
	ref := args.InvolvedObject
	if ref != nil && ref.Name == "" {
		in.fail(id, "get", errors.New("involvedObject.name: required"))
		return
	}
	if in.scope.namespaced() && ref != nil {
		if ref.Kind == "Node" {
			in.fail(id, "get", in.scope.nodeWide("the events of the node"))
			return
		}
		ns, err := in.scope.namespace(ref.Kind, ref.Namespace, ref.Name)
		if err != nil {
			in.fail(id, "get", err)
			return
		}
		ref.Namespace = ns
	}
	// A pod that exists is the pod of its current uid, as kubectl's --for
	// reads it: an earlier, deleted pod of that name is another object.
	uid := ""
	if ref != nil && ref.Kind == apiv1.KindPod {
		if pod, err := in.findPod(ref.Namespace, ref.Name); err == nil {
			uid = string(pod.UID)
		}
	}
	events := h.List(func(ev *v1.Event) bool {
		o := ev.InvolvedObject
		if args.Namespace != "" && o.Namespace != args.Namespace {
			return false
		}
		if ref == nil {
			return true
		}
		ns := ref.Namespace
		if ns == "" && ref.Kind != "Node" {
			ns = v1.NamespaceDefault
		}
		return o.Name == ref.Name && (ref.Kind == "" || o.Kind == ref.Kind) && (ref.Kind == "Node" || o.Namespace == ns) &&
			(uid == "" || o.UID == "" || string(o.UID) == uid)
	})
	_ = in.replies.Send(apiv1.Reply{RequestID: id, Verb: "get", Phase: apiv1.Succeeded,
		Message: fmt.Sprintf("%d events", len(events)), Result: apiv1.EventList{Events: events}})
}
