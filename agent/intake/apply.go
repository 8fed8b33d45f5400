package intake

import (
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	apiruntime "k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"

	"github.com/mqlet/mqlet/agent/manifest"
	"github.com/mqlet/mqlet/agent/pending"
	"github.com/mqlet/mqlet/agent/store"
	"github.com/mqlet/mqlet/agent/validate"
	apiv1 "github.com/mqlet/mqlet/api/v1"
)

// handleApply upserts the objects of a manifest into the desired state.
func (in *Intake) handleApply(r request) { in.applyObjects(r.id, apiv1.VerbApply, r.payload, false) }

// applyObjects stores the objects of an apply, or with replaceAll of a
// sync (or a group document, verb apiv1.VerbDesired), and hands their pods
// to the workers and the tracker. It reports whether they were stored.
func (in *Intake) applyObjects(id, verb string, payload []byte, replaceAll bool) (stored bool) {
	objs, err := manifest.Decode(payload)
	// Only an empty payload is looked at again: it passed the bounds.
	if err != nil && !(replaceAll && errors.Is(err, manifest.ErrEmpty) && isEmptyList(payload)) {
		in.fail(id, verb, fmt.Errorf("decoding manifest: %w", err))
		in.nodeEvent(v1.EventTypeWarning, ReasonFailedDecode, fmt.Sprintf("request %s: %v", id, err))
		return false
	}
	if problems := in.scope.scopeObjects(objs); len(problems) > 0 {
		in.fail(id, verb, fmt.Errorf("%d object(s) refused, nothing applied: %s", len(problems), summarize(problems)), problems...)
		in.nodeEvent(v1.EventTypeWarning, ReasonOutOfScope, fmt.Sprintf("request %s: %s", id, summarize(problems)))
		return false
	}
	// After scoping, which gives objects their namespace: a sealed value
	// opens only in the namespace it was sealed for.
	if problems := in.unsealAll(objs); len(problems) > 0 {
		in.fail(id, verb, fmt.Errorf("%d Secret(s) refused, nothing applied: %s", len(problems), summarize(problems)), problems...)
		in.nodeEvent(v1.EventTypeWarning, ReasonFailedUnseal, fmt.Sprintf("request %s: %s", id, summarize(problems)))
		return false
	}
	if problems := in.validateAll(id, objs); len(problems) > 0 {
		in.fail(id, verb, fmt.Errorf("%d object(s) rejected, nothing applied: %s", len(problems), summarize(problems)), problems...)
		return false
	}
	if err := in.checkCapacity(id, objs, replaceAll); err != nil {
		in.fail(id, verb, err)
		return false
	}
	if err := in.checkAdmission(id, objs, replaceAll); err != nil {
		in.fail(id, verb, err)
		return false
	}
	if err := in.checkHostPorts(id, objs, replaceAll); err != nil {
		in.fail(id, verb, err)
		return false
	}
	if err := in.checkProtected(objs, replaceAll); err != nil {
		in.fail(id, verb, err)
		return false
	}
	var changes []store.Change
	var kept string
	if replaceAll {
		sc, scErr := in.scope.storeScope()
		if scErr != nil {
			in.fail(id, verb, scErr)
			return false
		}
		changes, err = in.store.Replace(objs, sc)
		if err == nil {
			kept = in.keptOutside(sc)
		}
	} else {
		changes, err = in.store.Apply(objs)
	}
	var rejected *store.RejectedError
	if errors.As(err, &rejected) {
		msg := rejected.Error()
		in.fail(id, verb, fmt.Errorf("1 object(s) rejected, nothing applied: %s", msg), msg)
		in.nodeEvent(v1.EventTypeWarning, ReasonFailedValidation, fmt.Sprintf("request %s: %s", id, msg))
		return false
	}
	if err != nil {
		in.fail(id, verb, fmt.Errorf("storing desired state: %w", err))
		return false
	}
	want := map[string]pending.Want{}
	results := make([]apiv1.ChangeResult, 0, len(changes))
	var summary []string
	var created []*v1.Pod
	for _, c := range changes {
		cr := apiv1.ChangeResult{Kind: c.Kind, Key: c.Key, Action: string(c.Action)}
		if pod, ok := c.Object.(*v1.Pod); ok {
			cr.Generation, cr.UID = pod.Generation, string(pod.UID)
			if c.Action == store.Created {
				created = append(created, pod)
			}
		}
		results = append(results, cr)
		summary = append(summary, c.Kind+" "+c.Key+" "+string(c.Action))
		if c.Kind != store.KindPod {
			continue
		}
		if c.Action == store.Deleted {
			want[c.Key] = pending.Want{Gone: true}
		} else {
			want[c.Key] = pending.Want{Generation: cr.Generation}
		}
	}
	_ = in.replies.Send(apiv1.Reply{RequestID: id, Verb: verb, Phase: apiv1.Accepted, Message: "stored: " + strings.Join(summary, ", ") + kept, Result: results})
	keys := sortedKeys(want)
	// in_progress goes out before the tracker hears of the request: the
	// tracker may answer it at once (a re-apply of a running pod), and no
	// reply may follow the final one.
	if len(keys) > 0 {
		_ = in.replies.Send(apiv1.Reply{RequestID: id, Verb: verb, Phase: apiv1.InProgress, Message: "waiting for " + strings.Join(keys, ", ")})
	}
	in.follow(id, verb, want)
	for _, key := range keys {
		in.pods.Enqueue(key)
	}
	in.enqueueUsers(changes, want)
	for _, pod := range created {
		in.events.Event(pod, v1.EventTypeNormal, "Scheduled", "Successfully assigned "+pod.Namespace+"/"+pod.Name+" to "+in.opts.Topics.Node)
	}
	return true
}

// validateAll defaults and validates every object; it returns one readable
// problem per invalid object, and publishes one Warning event for the whole
// command (a List of thousands of invalid pods is one event, not thousands).
func (in *Intake) validateAll(id string, objs []apiruntime.Object) []string {
	var problems []string
	var only *v1.ObjectReference // the invalid object when there is exactly one
	var onlyPod *v1.Pod
	note := func(ref v1.ObjectReference, pod *v1.Pod, msg string) {
		problems = append(problems, msg)
		if len(problems) == 1 {
			only, onlyPod = &ref, pod
		} else {
			only, onlyPod = nil, nil
		}
	}
	for _, o := range objs {
		switch obj := o.(type) {
		case *v1.Pod:
			if obj.Namespace == "" {
				obj.Namespace = v1.NamespaceDefault
			}
			validate.DefaultPod(obj)
			errs := validate.ValidatePod(obj, in.opts.Topics.Node, in.podPolicy(obj.Namespace))
			if len(errs) == 0 {
				// As the API server's RuntimeClass admission: an unknown
				// class refused naming it, the class's overhead set.
				errs = in.opts.RuntimeClasses.Admit(obj)
			}
			if len(errs) > 0 {
				note(v1.ObjectReference{}, obj, fmt.Sprintf("Pod %s/%s: %s", obj.Namespace, obj.Name, validate.FormatErrors(errs)))
			}
			// Bound to this node, as the scheduler would: the downward API
			// and the published pod show it.
			obj.Spec.NodeName = in.opts.Topics.Node
		case *v1.ConfigMap:
			if obj.Namespace == "" {
				obj.Namespace = v1.NamespaceDefault
			}
			if errs := validate.ValidateConfigMap(obj); len(errs) > 0 {
				note(v1.ObjectReference{Kind: "ConfigMap", APIVersion: "v1", Namespace: obj.Namespace, Name: obj.Name}, nil,
					fmt.Sprintf("ConfigMap %s/%s: %s", obj.Namespace, obj.Name, validate.FormatErrors(errs)))
			}
		case *v1.Secret:
			if obj.Namespace == "" {
				obj.Namespace = v1.NamespaceDefault
			}
			if errs := validate.ValidateSecret(obj); len(errs) > 0 {
				// Kubernetes' secret validation redacts values; only keys and paths appear.
				note(v1.ObjectReference{Kind: "Secret", APIVersion: "v1", Namespace: obj.Namespace, Name: obj.Name}, nil,
					fmt.Sprintf("Secret %s/%s: %s", obj.Namespace, obj.Name, validate.FormatErrors(errs)))
			}
		default:
			problems = append(problems, fmt.Sprintf("unsupported object %T", o))
		}
	}
	switch {
	case len(problems) == 0:
	case onlyPod != nil:
		in.events.Event(onlyPod, v1.EventTypeWarning, ReasonFailedValidation, problems[0])
	case only != nil:
		in.events.ObjectEvent(*only, v1.EventTypeWarning, ReasonFailedValidation, problems[0])
	default:
		in.nodeEvent(v1.EventTypeWarning, ReasonFailedValidation,
			fmt.Sprintf("request %s: %d of %d objects rejected, nothing applied: %s", id, len(problems), len(objs), summarize(problems)))
	}
	return problems
}

// maxSummarized is how many problems a message or event spells out; the
// rest are counted.
const maxSummarized = 5

// summarize joins the first problems and counts the others.
func summarize(problems []string) string {
	if len(problems) <= maxSummarized {
		return strings.Join(problems, "; ")
	}
	return fmt.Sprintf("%s; and %d more", strings.Join(problems[:maxSummarized], "; "), len(problems)-maxSummarized)
}

// checkCapacity refuses a command that would make more pods desired than
// the node's capacity (the kubelet's OutOfpods admission): updates of stored
// pods are free, new pods need room.
func (in *Intake) checkCapacity(id string, objs []apiruntime.Object, replaceAll bool) error {
	if in.opts.MaxPods <= 0 {
		return nil
	}
	stored, err := in.store.ListPods()
	if err != nil {
		return fmt.Errorf("reading stored pods to check capacity: %w", err)
	}
	have := make(map[string]bool, len(stored))
	for _, p := range stored {
		have[store.Key(p.Namespace, p.Name)] = true
	}
	seen := map[string]bool{}
	var newPods []*v1.Pod
	kept := 0
	for _, o := range objs {
		p, ok := o.(*v1.Pod)
		if !ok || seen[store.Key(p.Namespace, p.Name)] {
			continue
		}
		key := store.Key(p.Namespace, p.Name)
		seen[key] = true
		if have[key] {
			kept++
		} else {
			newPods = append(newPods, p)
		}
	}
	used := len(stored)
	if replaceAll {
		used = kept // sync drops the stored pods it does not name
	}
	if len(newPods) == 0 || used+len(newPods) <= in.opts.MaxPods {
		return nil
	}
	msg := fmt.Sprintf("Node didn't have enough resource: pods, requested: %d, used: %d, capacity: %d", len(newPods), used, in.opts.MaxPods)
	if len(newPods) == 1 {
		in.events.Event(newPods[0], v1.EventTypeWarning, ReasonOutOfPods, msg)
	} else {
		in.nodeEvent(v1.EventTypeWarning, ReasonOutOfPods, fmt.Sprintf("request %s: %s", id, msg))
	}
	return fmt.Errorf("%s: %s; nothing applied", ReasonOutOfPods, msg)
}

func sortedKeys(m map[string]pending.Want) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// isEmptyList reports whether payload is a List with no items, which sync
// accepts as "run nothing".
func isEmptyList(payload []byte) bool {
	var l struct {
		Kind  string            `json:"kind"`
		Items []json.RawMessage `json:"items"`
	}
	return yaml.Unmarshal(payload, &l) == nil && l.Kind == "List" && len(l.Items) == 0
}

// keptOutside says which stored objects a node sync of scope sc left
// alone because a group owns them, so its reply does not read as if it replaced everything: "" when
// there are none. The count is read after the sync's own transaction; it
// is what the reply says, not what the sync decided on.
func (in *Intake) keptOutside(sc store.Scope) string {
	// Only a node sync says so: a group's commands see only that group's
	// objects, so naming other sources and their counts to a group would
	// tell it what it may not read.
	if sc.Source != apiv1.SourceNode {
		return ""
	}
	bySource := map[string]int{}
	count := func(m *metav1.ObjectMeta) {
		if sc.Namespace != "" && m.Namespace != sc.Namespace {
			return
		}
		if src := store.SourceOf(m); src != sc.Source {
			bySource[src]++
		}
	}
	pods, err1 := in.store.ListPods()
	cms, err2 := in.store.ListConfigMaps()
	secrets, err3 := in.store.ListSecrets()
	if err := errors.Join(err1, err2, err3); err != nil {
		return "; objects of other sources were kept (they could not be counted: " + err.Error() + ")"
	}
	for _, p := range pods {
		count(&p.ObjectMeta)
	}
	for _, c := range cms {
		count(&c.ObjectMeta)
	}
	for _, s := range secrets {
		count(&s.ObjectMeta)
	}
	if len(bySource) == 0 {
		return ""
	}
	sources := make([]string, 0, len(bySource))
	total := 0
	for src, n := range bySource {
		sources = append(sources, fmt.Sprintf("%s: %d", src, n))
		total += n
	}
	sort.Strings(sources)
	return fmt.Sprintf("; kept %d object(s) of other sources, which a %s sync does not replace (%s)", total, sc.Source, strings.Join(sources, ", "))
}
