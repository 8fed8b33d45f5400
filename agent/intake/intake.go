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
	"runtime/debug"
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
	"github.com/mqlet/mqlet/agent/store"
	"github.com/mqlet/mqlet/agent/validate"
	apiv1 "github.com/mqlet/mqlet/api/v1"
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
	Send(r apiv1.Reply) error
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

// Marker remembers the command being handled (agent/inflight), so that one
// that stops the agent is answered failed at the next start instead of run
// again. Slot 0 is the intake's: commands are handled one at a time.
type Marker interface {
	Set(slot int, value string) error
	Clear(slot int) error
}

// Options are the intake's settings.
type Options struct {
	Topics          apiv1.Scheme
	MaxPayloadBytes int
	Policy          validate.Policy
	ApplyDeadline   time.Duration
	// Opener, if set, checks signed commands (and whether one is required)
	// before a payload is decoded.
	Opener Opener
	// ProfilePolicy, if set, gives the policy for a pod in namespace of a
	// command signed by a key allowed a pod security profile (its
	// MaxProfile); it must only ever loosen the node's policy.
	ProfilePolicy func(node validate.Policy, namespace, profile string) validate.Policy
	// MaxPods is the node's pod capacity (pods.maxPods); an apply or sync
	// that would make more pods desired is refused OutOfpods. 0: no limit.
	MaxPods int
	// Marks, when set, holds the in-flight mark of each command.
	Marks Marker
	// Verbs wire the operator verbs (logs, exec, restart, cancel; verbs.go).
	Verbs VerbOptions
}

// Reasons of the intake's events and failed replies.
const (
	ReasonOutOfPods           = "OutOfpods" // the kubelet's spelling
	ReasonFailedValidation    = "FailedValidation"
	ReasonFailedDecode        = "FailedDecode"
	ReasonCommandPanicked     = "CommandPanicked"
	ReasonCommandStoppedAgent = "CommandStoppedAgent"
	ReasonRetainedCommand     = "RetainedCommand"
)

// Messages of refusals operators act on.
const (
	MsgRetainedRefused = "retained command refused: publish commands without the retain flag; clear it with an empty retained message"
	MsgStoppedAgent    = "this command stopped the agent: mqlet was handling it when it died, so it is not run again; fix it and send it with a new request id"
	MsgInternalError   = "internal error while handling this command; it was not applied"
	MsgEmptyPayload    = "empty payload: nothing to do (an empty message clears a retained one; the request id stays unused)"
)

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

	// cmdProfile is the signed profile of the command being handled; Handle
	// runs one command at a time.
	cmdProfile string
}

// New returns an Intake.
func New(opts Options, st Store, replies Sender, tracker Tracker, pods Scheduler, events Recorder, status StatusSource, log zerolog.Logger) *Intake {
	return &Intake{opts: opts, store: st, replies: replies, tracker: tracker, pods: pods, events: events, status: status, now: time.Now, log: log}
}

// Handle processes one command message. It returns after the desired state
// is persisted and the first reply is queued, so the broker's QoS 1 ack
// follows persistence.
func (in *Intake) Handle(cmd Command) {
	in.received.Add(1)
	topicName, payload := cmd.Topic, cmd.Payload
	verb, id, err := in.opts.Topics.ParseCommand(topicName)
	if id == "" {
		id = DeriveRequestID(topicName, payload)
	}
	if err != nil && apiv1.ValidateRequestID(id) != nil {
		id = DeriveRequestID(topicName, payload)
	}
	log := in.log.With().Str("requestId", id).Str("verb", verb).Logger()

	recorded, handled, lookupErr := in.store.LookupReply(id)
	if lookupErr != nil {
		log.Error().Err(lookupErr).Msg("looking up request record")
	}

	// A retained command is replayed on every subscription: it never runs.
	// A replay of a handled request gets its recorded answer (the live
	// publish, which MQTT 3.1.1 delivers without the flag, ran); any other
	// is refused unrecorded, so the same id published without the flag
	// still runs. Either way the operator is told to clear it.
	if cmd.Retained {
		in.nodeEvent(v1.EventTypeWarning, ReasonRetainedCommand, fmt.Sprintf("request %s (%s) on %s: %s", id, verb, topicName, MsgRetainedRefused))
		if handled {
			_ = in.replies.Resend(id, recorded)
			return
		}
		in.refuseUnrecorded(id, verb, errors.New(MsgRetainedRefused))
		return
	}
	if err != nil {
		in.fail(id, verb, fmt.Errorf("bad command topic %q: %w", topicName, err))
		return
	}
	if handled {
		log.Info().Msg("request already handled; answering again")
		_ = in.replies.Resend(id, recorded)
		return
	}
	// An empty message is how a retained command is cleared; it must not
	// use up the request id (only get takes no payload).
	if len(payload) == 0 && verb != "get" {
		in.refuseUnrecorded(id, verb, errors.New(MsgEmptyPayload))
		return
	}
	// Poison guard: the command is marked in-flight before its envelope is opened or it is decoded
	// (a command that kills the process is answered failed at the next
	// start, see Recover), and a panic while handling it is answered
	// failed here instead of taking the agent down.
	defer in.markInFlight(id, verb, log)()
	defer in.recoverPanic(id, verb, log)

	payload, ok := in.open(id, verb, payload)
	if !ok {
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
	case "logs":
		in.logs(id, payload)
	case "exec":
		in.exec(id, payload)
	case "restart":
		in.restart(id, payload)
	case "cancel":
		in.cancel(id, payload)
	case "config":
		in.config(id, payload)
	default:
		in.fail(id, verb, fmt.Errorf("unknown verb %q (known: apply, delete, sync, get, restart, logs, exec, cancel, config)", verb))
	}
}

// markInFlight sets the command's mark and returns what clears it. A mark
// that cannot be written is logged: the command still runs, unguarded.
func (in *Intake) markInFlight(id, verb string, log zerolog.Logger) (clearMark func()) {
	if in.opts.Marks == nil {
		return func() {}
	}
	if err := in.opts.Marks.Set(0, verb+" "+id); err != nil {
		log.Error().Err(err).Msg("marking command in flight; a crash in it would not be caught at restart")
	}
	return func() {
		if err := in.opts.Marks.Clear(0); err != nil {
			log.Error().Err(err).Msg("clearing the in-flight mark of a command")
		}
	}
}

// recoverPanic turns a panic of a handler into a failed reply, a logged
// stack and a Warning event; the agent goes on with the next command.
func (in *Intake) recoverPanic(id, verb string, log zerolog.Logger) {
	r := recover()
	if r == nil {
		return
	}
	log.Error().Str("panic", fmt.Sprint(r)).Str("stack", string(debug.Stack())).Msg("command handler panicked")
	in.fail(id, verb, errors.New(MsgInternalError))
	in.nodeEvent(v1.EventTypeWarning, ReasonCommandPanicked, fmt.Sprintf("request %s (%s): %s", id, verb, MsgInternalError))
}

// Recover answers the commands that were in flight when the previous
// process died (marks as "verb id"): each is answered failed and recorded,
// so the broker's redelivery is answered from the record and acked instead
// of run again. A command whose reply was recorded already got past its
// decoding and storing; it keeps its reply.
func (in *Intake) Recover(marks []string) {
	for _, m := range marks {
		verb, id, ok := strings.Cut(m, " ")
		if !ok || apiv1.ValidateRequestID(id) != nil {
			in.log.Warn().Str("mark", m).Msg("ignoring an unreadable in-flight mark")
			continue
		}
		if _, done, err := in.store.LookupReply(id); err == nil && done {
			in.log.Info().Str("requestId", id).Msg("in-flight command at the last stop had been answered; keeping its reply")
			continue
		}
		in.log.Error().Str("requestId", id).Str("verb", verb).Msg("this command was being handled when the agent died; answering it failed instead of running it again")
		in.fail(id, verb, errors.New(MsgStoppedAgent))
		in.nodeEvent(v1.EventTypeWarning, ReasonCommandStoppedAgent, fmt.Sprintf("request %s (%s): %s", id, verb, MsgStoppedAgent))
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

// refuseUnrecorded answers failed without recording the reply, so the
// request id stays free.
func (in *Intake) refuseUnrecorded(id, verb string, err error) {
	in.rejected.Add(1)
	in.log.Warn().Str("requestId", id).Str("verb", verb).Err(err).Msg("command refused")
	payload, mErr := json.Marshal(apiv1.Reply{RequestID: id, Verb: verb, Phase: apiv1.Failed, Message: err.Error(), TS: in.now().UTC()})
	if mErr != nil {
		in.log.Error().Err(mErr).Msg("encoding reply")
		return
	}
	_ = in.replies.Resend(id, payload)
}

func (in *Intake) nodeEvent(eventType, reason, message string) {
	in.events.ObjectEvent(v1.ObjectReference{Kind: "Node", Name: in.opts.Topics.Node}, eventType, reason, message)
}

func (in *Intake) fail(id, verb string, err error, details ...string) {
	in.rejected.Add(1)
	in.log.Warn().Str("requestId", id).Str("verb", verb).Err(err).Msg("command failed")
	_ = in.replies.Send(apiv1.Reply{RequestID: id, Verb: verb, Phase: apiv1.Failed, Message: err.Error(), Errors: details})
}

func (in *Intake) apply(id string, payload []byte, replaceAll bool) {
	verb := "apply"
	if replaceAll {
		verb = "sync"
	}
	objs, err := manifest.Decode(payload)
	// Only an empty payload is looked at again: it passed the bounds.
	if err != nil && !(replaceAll && errors.Is(err, manifest.ErrEmpty) && isEmptyList(payload)) {
		in.fail(id, verb, fmt.Errorf("decoding manifest: %w", err))
		in.nodeEvent(v1.EventTypeWarning, ReasonFailedDecode, fmt.Sprintf("request %s: %v", id, err))
		return
	}
	if problems := in.validateAll(id, objs); len(problems) > 0 {
		in.fail(id, verb, fmt.Errorf("%d object(s) rejected, nothing applied: %s", len(problems), summarize(problems)), problems...)
		return
	}
	if err := in.checkCapacity(id, objs, replaceAll); err != nil {
		in.fail(id, verb, err)
		return
	}
	if err := in.checkHostPorts(id, objs, replaceAll); err != nil {
		in.fail(id, verb, err)
		return
	}
	var changes []store.Change
	if replaceAll {
		changes, err = in.store.Replace(objs)
	} else {
		changes, err = in.store.Apply(objs)
	}
	var rejected *store.RejectedError
	if errors.As(err, &rejected) {
		msg := rejected.Error()
		in.fail(id, verb, fmt.Errorf("1 object(s) rejected, nothing applied: %s", msg), msg)
		in.nodeEvent(v1.EventTypeWarning, ReasonFailedValidation, fmt.Sprintf("request %s: %s", id, msg))
		return
	}
	if err != nil {
		in.fail(id, verb, fmt.Errorf("storing desired state: %w", err))
		return
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
	_ = in.replies.Send(apiv1.Reply{RequestID: id, Verb: verb, Phase: apiv1.Accepted, Message: "stored: " + strings.Join(summary, ", "), Result: results})
	in.tracker.Add(id, verb, want, in.now().Add(in.opts.ApplyDeadline))
	keys := sortedKeys(want)
	for _, key := range keys {
		in.pods.Enqueue(key)
	}
	for _, pod := range created {
		in.events.Event(pod, v1.EventTypeNormal, "Scheduled", "Successfully assigned "+pod.Namespace+"/"+pod.Name+" to "+in.opts.Topics.Node)
	}
	if len(keys) > 0 {
		_ = in.replies.Send(apiv1.Reply{RequestID: id, Verb: verb, Phase: apiv1.InProgress, Message: "waiting for " + strings.Join(keys, ", ")})
	}
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
			if errs := validate.ValidatePod(obj, in.opts.Topics.Node, in.podPolicy(obj.Namespace)); len(errs) > 0 {
				note(v1.ObjectReference{}, obj, fmt.Sprintf("Pod %s/%s: %s", obj.Namespace, obj.Name, validate.FormatErrors(errs)))
			}
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
	_ = in.replies.Send(apiv1.Reply{RequestID: id, Verb: "delete", Phase: apiv1.Accepted, Message: msg})
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
