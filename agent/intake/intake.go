// Package intake turns MQTT commands into changes of the desired state:
// it decodes and validates the payload, persists the result, answers
// accepted, and hands the pods to the workers. Every command is answered on
// its reply topic, and a redelivered request id is answered again, not re-run.
package intake

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	v1 "k8s.io/api/core/v1"
	apiruntime "k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"

	"github.com/mqlet/mqlet/agent/manifest"
	"github.com/mqlet/mqlet/agent/pending"
	"github.com/mqlet/mqlet/agent/reply"
	"github.com/mqlet/mqlet/agent/store"
	"github.com/mqlet/mqlet/agent/validate"
	"github.com/mqlet/mqlet/mqtt/topic"
)

// Store is the persisted desired state.
type Store interface {
	Apply(objs []apiruntime.Object) ([]store.Change, error)
	Replace(objs []apiruntime.Object) ([]store.Change, error)
	Delete(kind, namespace, name string) (bool, error)
	ListPods() ([]*v1.Pod, error)
	ListConfigMaps() ([]*v1.ConfigMap, error)
	ListSecrets() ([]*v1.Secret, error)
	LookupReply(requestID string) ([]byte, bool, error)
}

// Sender publishes replies.
type Sender interface {
	Send(r reply.Reply) error
	Resend(requestID string, payload []byte) error
}

// Tracker follows commands until their pods reach a verdict.
type Tracker interface {
	Add(id, verb string, want map[string]pending.Want, deadline time.Time)
}

// Scheduler hands pods to the workers.
type Scheduler interface {
	Enqueue(key string)
	EnqueueDelete(key string, grace *int64)
}

// Recorder publishes events.
type Recorder interface {
	Event(pod *v1.Pod, eventType, reason, message string)
	ObjectEvent(ref v1.ObjectReference, eventType, reason, message string)
}

// StatusSource gives the current status of a pod, for get.
type StatusSource interface {
	Get(namespace, name string) (*v1.Pod, bool)
}

// Options are the intake's settings.
type Options struct {
	Topics          topic.Scheme
	MaxPayloadBytes int
	Policy          validate.Policy
	ApplyDeadline   time.Duration
}

// Intake handles commands. Handle is called by the MQTT session for every
// message on the command topics, one at a time.
type Intake struct {
	opts    Options
	store   Store
	replies Sender
	tracker Tracker
	pods    Scheduler
	events  Recorder
	status  StatusSource
	now     func() time.Time
	log     zerolog.Logger

	received, rejected atomic.Uint64 // read by the metrics loop while commands arrive
}

// New returns an Intake.
func New(opts Options, st Store, replies Sender, tracker Tracker, pods Scheduler, events Recorder, status StatusSource, log zerolog.Logger) *Intake {
	return &Intake{opts: opts, store: st, replies: replies, tracker: tracker, pods: pods, events: events, status: status, now: time.Now, log: log}
}

// Handle processes one command message. It returns after the desired state
// is persisted and the first reply is queued, so the broker's QoS 1 ack
// follows persistence.
func (in *Intake) Handle(topicName string, payload []byte) {
	in.received.Add(1)
	verb, id, err := in.opts.Topics.ParseCommand(topicName)
	if id == "" {
		id = DeriveRequestID(topicName, payload)
	}
	log := in.log.With().Str("requestId", id).Str("verb", verb).Logger()
	if err != nil {
		if topic.ValidateRequestID(id) != nil {
			id = DeriveRequestID(topicName, payload)
		}
		in.fail(id, verb, fmt.Errorf("bad command topic %q: %w", topicName, err))
		return
	}
	if recorded, ok, err := in.store.LookupReply(id); err != nil {
		log.Error().Err(err).Msg("looking up request record")
	} else if ok {
		log.Info().Msg("request already handled; answering again")
		_ = in.replies.Resend(id, recorded)
		return
	}
	if in.opts.MaxPayloadBytes > 0 && len(payload) > in.opts.MaxPayloadBytes {
		in.fail(id, verb, fmt.Errorf("payload of %d bytes exceeds the limit of %d bytes", len(payload), in.opts.MaxPayloadBytes))
		return
	}
	log.Info().Int("bytes", len(payload)).Msg("command received")
	switch verb {
	case "apply":
		in.apply(id, payload, false)
	case "sync":
		in.apply(id, payload, true)
	case "delete":
		in.delete(id, payload)
	case "get":
		in.get(id, payload)
	case "restart", "logs", "exec", "config":
		in.fail(id, verb, fmt.Errorf("verb %q is not supported yet by this mqlet", verb))
	default:
		in.fail(id, verb, fmt.Errorf("unknown verb %q (known: apply, delete, sync, get, restart, logs, exec, config)", verb))
	}
}

// Stats returns how many commands were received and rejected.
func (in *Intake) Stats() (received, rejected uint64) {
	return in.received.Load(), in.rejected.Load()
}

// DeriveRequestID names a request that came without an id: the same topic
// and payload always give the same id, so a redelivery is recognised.
func DeriveRequestID(topicName string, payload []byte) string {
	h := sha256.New()
	h.Write([]byte(topicName))
	h.Write([]byte{0})
	h.Write(payload)
	return "auto-" + hex.EncodeToString(h.Sum(nil))[:20]
}

func (in *Intake) fail(id, verb string, err error, details ...string) {
	in.rejected.Add(1)
	in.log.Warn().Str("requestId", id).Str("verb", verb).Err(err).Msg("command failed")
	_ = in.replies.Send(reply.Reply{RequestID: id, Verb: verb, Phase: reply.Failed, Message: err.Error(), Errors: details})
}

func (in *Intake) apply(id string, payload []byte, replaceAll bool) {
	verb := "apply"
	if replaceAll {
		verb = "sync"
	}
	objs, err := manifest.Decode(payload)
	if err != nil && !(replaceAll && isEmptyList(payload)) {
		in.fail(id, verb, fmt.Errorf("decoding manifest: %w", err))
		in.events.ObjectEvent(v1.ObjectReference{Kind: "Node", Name: in.opts.Topics.Node}, v1.EventTypeWarning, "FailedDecode", fmt.Sprintf("request %s: %v", id, err))
		return
	}
	if problems := in.validateAll(objs); len(problems) > 0 {
		in.fail(id, verb, fmt.Errorf("%d object(s) rejected, nothing applied: %s", len(problems), strings.Join(problems, "; ")), problems...)
		return
	}
	var changes []store.Change
	if replaceAll {
		changes, err = in.store.Replace(objs)
	} else {
		changes, err = in.store.Apply(objs)
	}
	if err != nil {
		in.fail(id, verb, fmt.Errorf("storing desired state: %w", err))
		return
	}
	want := map[string]pending.Want{}
	results := make([]ChangeResult, 0, len(changes))
	var summary []string
	var created []*v1.Pod
	for _, c := range changes {
		cr := ChangeResult{Kind: c.Kind, Key: c.Key, Action: string(c.Action)}
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
	_ = in.replies.Send(reply.Reply{RequestID: id, Verb: verb, Phase: reply.Accepted, Message: "stored: " + strings.Join(summary, ", "), Result: results})
	in.tracker.Add(id, verb, want, in.now().Add(in.opts.ApplyDeadline))
	keys := sortedKeys(want)
	for _, key := range keys {
		in.pods.Enqueue(key)
	}
	for _, pod := range created {
		in.events.Event(pod, v1.EventTypeNormal, "Scheduled", "Successfully assigned "+pod.Namespace+"/"+pod.Name+" to "+in.opts.Topics.Node)
	}
	if len(keys) > 0 {
		_ = in.replies.Send(reply.Reply{RequestID: id, Verb: verb, Phase: reply.InProgress, Message: "waiting for " + strings.Join(keys, ", ")})
	}
}

// ChangeResult is one stored change, as the accepted reply reports it
// (never an object's content, so no secret value is echoed).
type ChangeResult struct {
	Kind       string `json:"kind"`
	Key        string `json:"key"`
	Action     string `json:"action"`
	UID        string `json:"uid,omitempty"`
	Generation int64  `json:"generation,omitempty"`
}

// validateAll defaults and validates every object; it returns one readable
// problem per invalid object, and publishes a Warning event for each.
func (in *Intake) validateAll(objs []apiruntime.Object) []string {
	var problems []string
	for _, o := range objs {
		switch obj := o.(type) {
		case *v1.Pod:
			if obj.Namespace == "" {
				obj.Namespace = v1.NamespaceDefault
			}
			validate.DefaultPod(obj)
			if errs := validate.ValidatePod(obj, in.opts.Topics.Node, in.opts.Policy); len(errs) > 0 {
				msg := fmt.Sprintf("Pod %s/%s: %s", obj.Namespace, obj.Name, validate.FormatErrors(errs))
				problems = append(problems, msg)
				in.events.Event(obj, v1.EventTypeWarning, "FailedValidation", msg)
			}
		case *v1.ConfigMap:
			if obj.Namespace == "" {
				obj.Namespace = v1.NamespaceDefault
			}
			if errs := validate.ValidateConfigMap(obj); len(errs) > 0 {
				msg := fmt.Sprintf("ConfigMap %s/%s: %s", obj.Namespace, obj.Name, validate.FormatErrors(errs))
				problems = append(problems, msg)
				in.events.ObjectEvent(v1.ObjectReference{Kind: "ConfigMap", APIVersion: "v1", Namespace: obj.Namespace, Name: obj.Name}, v1.EventTypeWarning, "FailedValidation", msg)
			}
		case *v1.Secret:
			if obj.Namespace == "" {
				obj.Namespace = v1.NamespaceDefault
			}
			if errs := validate.ValidateSecret(obj); len(errs) > 0 {
				// Kubernetes' secret validation redacts values; only keys and paths appear.
				msg := fmt.Sprintf("Secret %s/%s: %s", obj.Namespace, obj.Name, validate.FormatErrors(errs))
				problems = append(problems, msg)
				in.events.ObjectEvent(v1.ObjectReference{Kind: "Secret", APIVersion: "v1", Namespace: obj.Namespace, Name: obj.Name}, v1.EventTypeWarning, "FailedValidation", msg)
			}
		default:
			problems = append(problems, fmt.Sprintf("unsupported object %T", o))
		}
	}
	return problems
}

func (in *Intake) delete(id string, payload []byte) {
	refs, grace, err := manifest.DecodeRef(payload)
	if err != nil {
		in.fail(id, "delete", fmt.Errorf("decoding delete request: %w", err))
		return
	}
	if grace != nil && *grace < 0 {
		in.fail(id, "delete", errors.New("gracePeriodSeconds must not be negative"))
		return
	}
	want := map[string]pending.Want{}
	var deleted, missing []string
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
	_ = in.replies.Send(reply.Reply{RequestID: id, Verb: "delete", Phase: reply.Accepted, Message: msg})
	in.tracker.Add(id, "delete", want, in.now().Add(in.opts.ApplyDeadline))
	for _, key := range sortedKeys(want) {
		in.pods.EnqueueDelete(key, grace)
	}
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
