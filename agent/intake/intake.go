// Package intake turns MQTT commands into changes of the desired state:
// it decodes and validates the payload, persists the result, answers
// accepted, and hands the pods to the workers. Every command is answered on
// its reply topic, and a redelivered request id is answered again, not re-run.
package intake

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"runtime/debug"
	"strings"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	v1 "k8s.io/api/core/v1"
	apiruntime "k8s.io/apimachinery/pkg/runtime"

	"github.com/mqlet/mqlet/agent/pending"
	"github.com/mqlet/mqlet/agent/store"
	"github.com/mqlet/mqlet/agent/validate"
	apiv1 "github.com/mqlet/mqlet/api/v1"
	"github.com/mqlet/mqlet/internal/runtimeclass"
)

// Store is the persisted desired state.
type Store interface {
	Apply(objs []apiruntime.Object) ([]store.Change, error)
	Replace(objs []apiruntime.Object, scope store.Scope) ([]store.Change, error)
	Delete(kind, namespace, name string) (bool, error)
	// CheckSource refuses, with a *store.RejectedError, a change by a
	// command of source to an object stored from another.
	CheckSource(source, kind, namespace, name string) error
	ListPods() ([]*v1.Pod, error)
	ListConfigMaps() ([]*v1.ConfigMap, error)
	ListSecrets() ([]*v1.Secret, error)
	LookupReply(requestID string) ([]byte, bool, error)
	// BindRequest keeps the digest of the command a request id names;
	// RequestDigest returns it (nil: none).
	BindRequest(requestID string, digest []byte) error
	RequestDigest(requestID string) ([]byte, error)
	// PutPending records that the request is owed a final reply, with the
	// command's changes (see store.PendingReply).
	PutPending(p store.PendingReply) error
	// GroupApplied is the last document of a group applied;
	// SetGroupApplied records one (nil: forgets it).
	GroupApplied(group string) (store.GroupApplied, bool, error)
	SetGroupApplied(group string, g *store.GroupApplied) error
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

// StatusSource gives the current status of a pod, for get, and the pods
// deleted from the desired state that still terminate (their grace period).
type StatusSource interface {
	Get(namespace, name string) (*v1.Pod, bool)
	Terminating() []*v1.Pod
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
	// Unsealer, if set, opens sealed Secrets (nil: a sealed Secret is refused).
	Unsealer Unsealer
	// RequireSealedSecrets refuses an apply or sync holding a Secret that
	// is not sealed (security.requireSealedSecrets).
	RequireSealedSecrets bool
	// MaxPods is the node's pod capacity (pods.maxPods); an apply or sync
	// that would make more pods desired is refused OutOfpods. 0: no limit.
	MaxPods int
	// NodeLabels are the node's labels as published (the configured ones
	// and the well-known ones); a pod whose nodeSelector or required node
	// affinity they do not match is refused NodeAffinity.
	NodeLabels map[string]string
	// LiveLabels, when set, gives the labels that change while the node
	// runs (its configured nodeLabels and its groups'), added to NodeLabels.
	LiveLabels func() map[string]string
	// Allocatable is the node's allocatable cpu and memory; a pod whose
	// requests exceed what the stored pods leave of it is refused OutOfcpu
	// or OutOfmemory. A resource missing here is not checked.
	Allocatable v1.ResourceList
	// Pressure, when set, refuses new pods while the node is under
	// pressure (the eviction manager's Admit).
	Pressure PressureAdmitter
	// RuntimeClasses are the classes a pod's runtimeClassName may name;
	// their overhead is counted and their nodeSelector matched at admission.
	RuntimeClasses runtimeclass.Set
	// Marks, when set, holds the in-flight mark of each command.
	Marks Marker
	// Verbs wire the operator verbs (logs, exec, restart, cancel; verbs.go).
	Verbs VerbOptions
	// Groups, if set, gives the groups the node is in now; a command on
	// the topic of any other group is refused. nil: none.
	Groups func() []string
	// DocumentOpener, if set, checks the signature of group documents
	// (nil: a signed document is refused, an unsigned one taken).
	DocumentOpener DocumentOpener
	// OnGroupApplied, if set, is told each group document applied, once
	// it is durable (the node's state then names its generation).
	OnGroupApplied func(group string, generation uint64)
}

// Reasons of the intake's events and failed replies.
const (
	ReasonOutOfPods           = "OutOfpods" // the kubelet's spelling
	ReasonFailedValidation    = "FailedValidation"
	ReasonFailedDecode        = "FailedDecode"
	ReasonCommandPanicked     = "CommandPanicked"
	ReasonCommandStoppedAgent = "CommandStoppedAgent"
	ReasonRetainedCommand     = "RetainedCommand"
	ReasonOutOfScope          = "OutOfScope"
	ReasonRequestIDReused     = "RequestIDReused"
)

// Messages of refusals operators act on.
const (
	MsgRetainedRefused = "retained command refused: publish commands without the retain flag; clear it with an empty retained message"
	MsgStoppedAgent    = "this command stopped the agent: mqlet was handling it when it died, so it is not run again; fix it and send it with a new request id"
	MsgInternalError   = "internal error while handling this command; it was not applied"
	MsgEmptyPayload    = "empty payload: nothing to do (an empty message clears a retained one; the request id stays unused)"
	MsgRequestIDReused = "request id already used by a different command: this command was not run and the earlier one's answer does not apply to it; send it under a new request id"
)

// Intake handles commands. Handle is called by the MQTT session for every
// message on the command topics, one at a time.
type Intake struct {
	opts    Options
	verbs   verbTable
	store   Store
	replies Sender
	tracker Tracker
	pods    Scheduler
	events  Recorder
	status  StatusSource
	now     func() time.Time
	log     zerolog.Logger

	received, rejected atomic.Uint64 // read by the metrics loop while commands arrive

	// cmdProfile is the signed profile of the command being handled, and
	// scope what it may touch; Handle runs one command at a time.
	cmdProfile string
	// cmdRequester names who sent it: the signing key's id, or empty
	// (MQTT 3.1.1 carries no publisher identity).
	cmdRequester string
	scope        cmdScope
}

// New returns an Intake.
func New(opts Options, st Store, replies Sender, tracker Tracker, pods Scheduler, events Recorder, status StatusSource, log zerolog.Logger) *Intake {
	return &Intake{opts: opts, verbs: newVerbTable(), store: st, replies: replies, tracker: tracker, pods: pods, events: events, status: status, now: time.Now, log: log}
}

// Handle processes one command message. It returns after the desired state
// is persisted and the first reply is queued, so the broker's QoS 1 ack
// follows persistence.
func (in *Intake) Handle(cmd Command) {
	in.received.Add(1)
	topicName, payload := cmd.Topic, cmd.Payload
	if group, ok, err := in.opts.Topics.ParseGroupDesired(topicName); ok {
		in.handleDocument(cmd, group, err)
		return
	}
	ct, err := in.opts.Topics.ParseCommand(topicName)
	verb, id := ct.Verb, ct.RequestID
	derived := id == ""
	if derived {
		id = DeriveRequestID(topicName, payload)
	}
	log := in.log.With().Str("requestId", id).Str("verb", verb).Logger()

	recorded, handled, lookupErr := in.store.LookupReply(id)
	if lookupErr != nil {
		log.Error().Err(lookupErr).Msg("looking up request record")
	}
	// A request id is bound to the command that first used it: another
	// command under it (someone who published that id first, or a reuse) is
	// refused loudly, never answered from the first one's record.
	digest := commandDigest(topicName, payload)
	if bound, err := in.store.RequestDigest(id); err != nil {
		log.Error().Err(err).Msg("looking up the command bound to the request id")
	} else if bound != nil && !bytes.Equal(bound, digest) && len(payload) > 0 {
		log.Warn().Msg("request id already used by a different command; refused")
		in.nodeEvent(v1.EventTypeWarning, ReasonRequestIDReused, fmt.Sprintf("request %s (%s) on %s: %s", id, verb, topicName, MsgRequestIDReused))
		in.refuseUnrecorded(id, verb, errors.New(MsgRequestIDReused))
		return
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
	// Unrecorded: a stale subscription must not use up the request id.
	if err := in.checkMember(ct.Scope); err != nil {
		in.refuseUnrecorded(id, verb, err)
		return
	}
	// A command without a request id is named by its topic and payload, so
	// a deliberate repeat (the same delete after the pod was applied again)
	// gets the first one's id: only the broker's redelivery (the DUP flag)
	// is the same command, answered from the record; a repeat runs again
	// under that id, and its replies replace the record.
	// One that stopped the agent keeps its answer: it must not crash it twice.
	if handled && derived && !cmd.Duplicate && !stoppedAgent(recorded) {
		log.Info().Msg("repeat of a command without a request id; running it again")
		handled = false
	}
	if handled {
		log.Info().Msg("request already handled; answering again")
		_ = in.replies.Resend(id, recorded)
		return
	}
	// An empty message is how a retained command is cleared; it must not
	// use up the request id (only a verb whose arguments are all optional,
	// like get, takes no payload).
	if len(payload) == 0 && !in.verbs.takesEmpty(verb) {
		in.refuseUnrecorded(id, verb, errors.New(MsgEmptyPayload))
		return
	}
	// Poison guard: the command is marked in-flight before its envelope is opened or it is decoded
	// (a command that kills the process is answered failed at the next
	// start, see Recover), and a panic while handling it is answered
	// failed here instead of taking the agent down.
	defer in.markInFlight(id, verb, log)()
	defer in.recoverPanic(id, verb, log)

	payload, ok := in.open(id, verb, ct.Scope, payload)
	if !ok {
		return // refused unrecorded: the id stays free
	}
	if err := in.store.BindRequest(id, digest); err != nil {
		log.Error().Err(err).Msg("binding the request id to its command; a different command under it would not be told apart")
	}
	// A command that should not run after a time (mqletctl --expires)
	// carries it in an envelope, inside the signature when signed.
	payload, expires, err := apiv1.OpenEnvelope(payload)
	if err != nil {
		in.fail(id, verb, err)
		return
	}
	if now := in.now(); !expires.IsZero() && now.After(expires) {
		in.fail(id, verb, fmt.Errorf("expired: the command expired at %s and reached the node at %s; not run", expires.UTC().Format(time.RFC3339), now.UTC().Format(time.RFC3339)))
		return
	}
	if in.opts.MaxPayloadBytes > 0 && len(payload) > in.opts.MaxPayloadBytes {
		in.fail(id, verb, fmt.Errorf("payload of %d bytes exceeds the limit of %d bytes", len(payload), in.opts.MaxPayloadBytes))
		return
	}

	log.Info().Int("bytes", len(payload)).Msg("command received")
	in.dispatch(request{id: id, verb: verb, payload: payload})
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

// follow hands an accepted request to the tracker after recording, with
// the command's changes, that it is owed a final reply: a kill before that
// reply is queued leaves the entry for the next start (Group.RestorePending).
func (in *Intake) follow(id, verb string, want map[string]pending.Want) {
	deadline := in.now().Add(in.opts.ApplyDeadline)
	p := store.PendingReply{RequestID: id, Verb: verb, Want: make(map[string]store.PendingWant, len(want)), Deadline: deadline}
	for k, w := range want {
		p.Want[k] = store.PendingWant{Generation: w.Generation, Gone: w.Gone}
	}
	if err := in.store.PutPending(p); err != nil {
		in.log.Error().Err(err).Str("requestId", id).Msg("recording the pending final reply; a kill before it is sent would lose it")
	}
	in.tracker.Add(id, verb, want, deadline)
}

// Stats returns how many commands were received and rejected.
func (in *Intake) Stats() (received, rejected uint64) {
	return in.received.Load(), in.rejected.Load()
}

// stoppedAgent reports whether a recorded reply is Recover's answer to a
// command that was being handled when the agent died.
func stoppedAgent(recorded []byte) bool {
	r, err := apiv1.DecodeReply(recorded)
	return err == nil && r.Phase == apiv1.Failed && r.Message == MsgStoppedAgent
}

// commandDigest identifies a command by its topic and payload (the
// envelope as received, so a signed command's nonce counts).
func commandDigest(topicName string, payload []byte) []byte {
	h := sha256.New()
	h.Write([]byte(topicName))
	h.Write([]byte{0})
	h.Write(payload)
	return h.Sum(nil)
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
	payload, mErr := json.Marshal(apiv1.Reply{RequestID: id, Node: in.opts.Topics.Node, Verb: verb, Phase: apiv1.Failed, Message: err.Error(), TS: in.now().UTC()})
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
