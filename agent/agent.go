// Package agent is mqlet's orchestration core. It wires the command intake,
// the pod workers, the status publisher, the event recorder and the periodic
// loops together, and owns every goroutine it starts. It talks to the MQTT
// layer and the runtime only through small interfaces declared here.
package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/rs/zerolog"
	v1 "k8s.io/api/core/v1"

	"github.com/mqlet/mqlet/agent/eventlog"
	"github.com/mqlet/mqlet/agent/events"
	"github.com/mqlet/mqlet/agent/inflight"
	"github.com/mqlet/mqlet/agent/intake"
	"github.com/mqlet/mqlet/agent/liveconfig"
	"github.com/mqlet/mqlet/agent/pending"
	"github.com/mqlet/mqlet/agent/podworker"
	"github.com/mqlet/mqlet/agent/reply"
	"github.com/mqlet/mqlet/agent/restart"
	"github.com/mqlet/mqlet/agent/statusmgr"
	"github.com/mqlet/mqlet/agent/store"
	"github.com/mqlet/mqlet/agent/streams"
	"github.com/mqlet/mqlet/agent/validate"
	apiv1 "github.com/mqlet/mqlet/api/v1"
	"github.com/mqlet/mqlet/cri"
	"github.com/mqlet/mqlet/internal/redact"
	"github.com/mqlet/mqlet/mqtt/outbox"
	"github.com/mqlet/mqlet/mqtt/session"
)

// Runtime is what the agent needs of the container runtime manager.
type Runtime interface {
	podworker.Runtime
	Run(ctx context.Context)
	Ready() bool
	Changes() <-chan struct{}
	RunPLEG(ctx context.Context, period time.Duration, out chan<- cri.PodLifecycleEvent)
	GarbageCollect(ctx context.Context, policy cri.GCPolicy, isDesired func(uid string) bool) error
	RotateLogs(ctx context.Context, r cri.LogRotation) error
	intake.VerbRuntime
}

// Store is the persisted desired state.
type Store interface {
	intake.Store
	cri.ObjectSource
	Pod(namespace, name string) (*v1.Pod, error)
	RecordReply(requestID string, reply []byte, at time.Time) error
	podworker.Quarantines
	Meta(key string) ([]byte, bool, error)
	SetMeta(key string, value []byte) error
	PruneReplies(now time.Time) (int, error)
	intake.BatchStore
}

// Publisher queues messages for the broker (the outbox).
type Publisher interface {
	Put(m outbox.Message) error
	intake.BatchOutbox
}

// Options are the agent's settings, taken from the configuration.
type Options struct {
	Topics          apiv1.Scheme
	MaxPayloadBytes int
	Policy          validate.Policy
	Workers         int
	Restart         restart.Policy
	ApplyDeadline   time.Duration
	PLEGPeriod      time.Duration
	GCInterval      time.Duration
	GCPolicy        cri.GCPolicy
	PodStatusResync time.Duration
	HostIPs         []string
	// Opener checks signed commands (nil: payloads are taken as they come).
	Opener intake.Opener
	// ProfilePolicy is the policy for pods of a command signed by a key
	// allowed a pod security profile (nil: always the node's policy).
	ProfilePolicy func(node validate.Policy, namespace, profile string) validate.Policy
	MaxPods       int // pods.maxPods; 0: no limit
	// LogRotation bounds container log files, checked every
	// LogRotationPeriod (0: never).
	LogRotation       cri.LogRotation
	LogRotationPeriod time.Duration
	// CommandMarks (one slot) and SyncMarks (Workers slots) are the
	// in-flight mark files (agent/inflight); nil turns the poison guard off.
	CommandMarks, SyncMarks *inflight.File
	// MaxReplyBytes bounds each reply message (0: reply.DefaultMaxReplyBytes).
	MaxReplyBytes int
	// MaxBacklog and MaxBacklogBytes bound the commands waiting to be
	// persisted (0: the intake's defaults).
	MaxBacklog      int
	MaxBacklogBytes int
	// Logs and Exec bound the operator verbs; MaxStreams bounds the logs,
	// exec and restart requests running at once.
	// EventLog, when set, keeps the events published (get Event).
	EventLog *eventlog.Log
	// Live, when set, holds the settings the config verb changes.
	Live       *liveconfig.Settings
	Logs       intake.LogLimits
	Exec       intake.ExecLimits
	MaxStreams int
}

// Agent is the running core.
type Agent struct {
	opts    Options
	store   Store
	out     Publisher
	rt      Runtime
	log     zerolog.Logger
	events  *events.Recorder
	status  *statusmgr.Manager
	tracker *pending.Tracker
	pool    *podworker.Pool
	intake  *intake.Intake
	cmds    *intake.Pipeline // the only caller of intake.Handle
	group   *intake.Group
	backoff *restart.Tracker
	streams *streams.Manager
}

// New builds the agent; Run starts it.
func New(opts Options, st Store, out Publisher, rt Runtime, log zerolog.Logger) *Agent {
	a := &Agent{opts: opts, store: st, out: out, rt: rt, log: log}
	// Replies and events are persisted in groups (see intake.Group).
	a.group = intake.NewGroup(st, out, log.With().Str("component", "intake").Logger())
	a.events = events.New(eventSink{topics: opts.Topics, out: a.group.Publisher(), log: log, history: opts.EventLog}, events.Options{Node: opts.Topics.Node}, log.With().Str("component", "events").Logger())
	a.status = statusmgr.New(opts.Topics, out, st, log.With().Str("component", "status").Logger())
	var replyOpts []reply.Option
	if opts.MaxReplyBytes > 0 {
		replyOpts = append(replyOpts, reply.WithMaxReplyBytes(opts.MaxReplyBytes))
	}
	sender := reply.NewSender(opts.Topics, a.group.Publisher(), a.group.Recorder(), nil, log.With().Str("component", "reply").Logger(), replyOpts...)
	a.tracker = pending.New(sender, nil)
	a.backoff = restart.New(opts.Restart, nil)
	poolOpts := podworker.Options{Workers: opts.Workers, BackoffBase: opts.Restart.Base, BackoffMax: opts.Restart.Max, HostIPs: opts.HostIPs, Quarantines: st}
	intakeOpts := intake.Options{Topics: opts.Topics, MaxPayloadBytes: opts.MaxPayloadBytes, Policy: opts.Policy, ApplyDeadline: opts.ApplyDeadline, MaxPods: opts.MaxPods,
		Opener: opts.Opener, ProfilePolicy: opts.ProfilePolicy}
	// Set only when present: a nil *inflight.File in an interface is not nil.
	if opts.SyncMarks != nil {
		poolOpts.Marks = opts.SyncMarks
	}
	if opts.CommandMarks != nil {
		intakeOpts.Marks = opts.CommandMarks
	}
	a.pool = podworker.New(poolOpts, rt, desired{st}, a.status, a.tracker, a.backoff, a.events, log.With().Str("component", "podworker").Logger())
	a.streams = streams.New(opts.MaxStreams)
	intakeOpts.Verbs = intake.VerbOptions{Runtime: rt, Restarts: a.pool, Streams: a.streams, Logs: opts.Logs, Exec: opts.Exec, RestartTimeout: opts.ApplyDeadline}
	if opts.Live != nil {
		intakeOpts.Verbs.Config = opts.Live
	}
	if opts.EventLog != nil {
		intakeOpts.Verbs.Events = opts.EventLog
	}
	a.intake = intake.New(intakeOpts, st, sender, a.tracker, a.pool, a.events, a.status, log.With().Str("component", "intake").Logger())
	a.cmds = intake.NewPipeline(a.intake, st, out, sender, intake.PipelineOptions{MaxBacklog: opts.MaxBacklog, MaxBacklogBytes: opts.MaxBacklogBytes, Group: a.group}, log.With().Str("component", "intake").Logger())
	a.recoverInFlight()
	return a
}

// recoverInFlight deals with what was in flight when the previous process
// died: the command is answered failed, the pods are quarantined. The marks
// are cleared only once that is persisted, so dying again here repeats it.
func (a *Agent) recoverInFlight() {
	if f := a.opts.CommandMarks; f != nil {
		a.intake.Recover(f.Left())
		if err := f.Reset(); err != nil {
			a.log.Error().Err(err).Msg("clearing command marks")
		}
	}
	if f := a.opts.SyncMarks; f != nil {
		if err := a.pool.Recover(f.Left()); err != nil {
			a.log.Error().Err(err).Msg("quarantining pods whose sync stopped the agent; their marks are kept")
		} else if err := f.Reset(); err != nil {
			a.log.Error().Err(err).Msg("clearing pod sync marks")
		}
	}
}

// HandleCommand queues one message from the command topics for the intake
// and returns at once; the message is acknowledged (m.Ack, the session's
// ManualAck) once the command's effect on the desired state is persisted.
func (a *Agent) HandleCommand(m session.Inbound) {
	a.cmds.Submit(intake.Command{Topic: m.Topic, Payload: m.Payload, Retained: m.Retained, Duplicate: m.Duplicate, Ack: m.Ack})
}

// Events is the event recorder, for components wired outside the agent.
func (a *Agent) Events() *events.Recorder { return a.events }

// Counters are the agent's own figures, published with the metrics.
func (a *Agent) Counters() map[string]uint64 {
	ps := a.pool.Stats()
	received, rejected := a.intake.Stats()
	published, skipped := a.status.Stats()
	es := a.events.Stats()
	return map[string]uint64{
		"commands_received":    received,
		"commands_rejected":    rejected,
		"pod_queue_depth":      uint64(ps.QueueDepth),
		"pod_syncs":            ps.Syncs,
		"pod_sync_failures":    ps.Failures,
		"crashloop_backoffs":   ps.Backoffs,
		"pod_status_published": published,
		"pod_status_unchanged": skipped,
		"events_emitted":       es.Emitted,
		"events_dropped":       es.Dropped,
		"pending_commands":     uint64(a.tracker.Len()),
		"commands_waiting":     uint64(a.cmds.Waiting()),
	}
}

// Run starts every loop and blocks until ctx ends and all have stopped.
func (a *Agent) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	spawn := func(name string, f func(ctx context.Context)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f(ctx)
			a.log.Debug().Str("loop", name).Msg("stopped")
		}()
	}
	spawn("intake", a.cmds.Run)
	spawn("reply-group", a.group.Run)
	spawn("streams", a.streams.Run)
	spawn("runtime", a.rt.Run)
	spawn("workers", a.pool.Run)
	spawn("pending", a.tracker.Run)
	spawn("status-resync", func(ctx context.Context) { a.status.Run(ctx, a.opts.PodStatusResync) })
	spawn("pleg", a.runPLEG)
	spawn("runtime-watch", a.watchRuntime)
	spawn("housekeeping", a.housekeeping)
	if a.opts.LogRotationPeriod > 0 && a.opts.LogRotation.MaxBytes > 0 {
		spawn("log-rotation", a.rotateLogs)
	}
	wg.Wait()
	return nil
}

// reconcile queues every desired pod and every pod the runtime still runs,
// so the workers adopt, start or remove each one.
func (a *Agent) reconcile(ctx context.Context) {
	keys := map[string]bool{}
	pods, err := a.store.ListPods()
	if err != nil {
		a.log.Error().Err(err).Msg("listing desired pods to reconcile")
	}
	for _, p := range pods {
		keys[p.Namespace+"/"+p.Name] = true
	}
	if err == nil {
		desired := maps.Clone(keys)
		if n, err := a.status.ClearStale(func(key string) bool { return desired[key] }); err != nil {
			a.log.Warn().Err(err).Msg("clearing statuses of pods no longer desired")
		} else if n > 0 {
			a.log.Info().Int("pods", n).Msg("cleared retained statuses of pods no longer desired")
		}
	}
	if a.rt.Ready() {
		refs, err := a.rt.ListPods(ctx)
		if err != nil {
			a.log.Warn().Err(err).Msg("listing runtime pods to reconcile")
		}
		for _, r := range refs {
			keys[r.Namespace+"/"+r.Name] = true
		}
	}
	for k := range keys {
		a.pool.Enqueue(k)
	}
	a.log.Info().Int("pods", len(keys)).Msg("reconciling desired state with the runtime")
}

func (a *Agent) runPLEG(ctx context.Context) {
	ch := make(chan cri.PodLifecycleEvent, 128)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		a.rt.RunPLEG(ctx, a.opts.PLEGPeriod, ch)
	}()
	defer wg.Wait()
	for {
		select {
		case <-ctx.Done():
			return
		case ev := <-ch:
			if !a.pool.EnqueueUID(ev.PodUID) {
				a.log.Debug().Str("uid", ev.PodUID).Str("event", string(ev.Type)).Msg("event for a pod not synced yet")
			}
		}
	}
}

// watchRuntime reconciles at start and again whenever the runtime comes
// back, and reports availability changes as node events.
func (a *Agent) watchRuntime(ctx context.Context) {
	first, ready := true, false
	for {
		// Take the change signal before reading the state, so a change in
		// between is not missed.
		changed := a.rt.Changes()
		now := a.rt.Ready()
		switch {
		case now && !ready:
			if !first {
				name, version := a.rt.RuntimeInfo()
				a.events.NodeEvent(v1.EventTypeNormal, "ContainerRuntimeReady", fmt.Sprintf("container runtime %s %s is reachable", name, version))
			}
			a.reconcile(ctx)
		case first:
			// Desired pods are queued even without a runtime, so their status
			// says why they do not run.
			a.reconcile(ctx)
		case !now && ready:
			a.events.NodeEvent(v1.EventTypeWarning, "ContainerRuntimeUnreachable", "container runtime is unreachable; pods keep running, mqlet retries")
		}
		first, ready = false, now
		select {
		case <-ctx.Done():
			return
		case <-changed:
		}
	}
}

// every runs fn each period until ctx ends.
func every(ctx context.Context, period time.Duration, fn func(context.Context)) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		fn(ctx)
	}
}

// rotateLogs keeps container log files within their bound: a pod printing
// as fast as it can would otherwise fill the node's disk in minutes.
func (a *Agent) rotateLogs(ctx context.Context) {
	every(ctx, a.opts.LogRotationPeriod, func(ctx context.Context) {
		if !a.rt.Ready() {
			return
		}
		if err := a.rt.RotateLogs(ctx, a.opts.LogRotation); err != nil {
			a.log.Warn().Err(err).Msg("rotating container logs")
		}
	})
}

func (a *Agent) housekeeping(ctx context.Context) {
	run := every
	if a.opts.Live != nil {
		// gc.interval may be changed over MQTT.
		run = func(ctx context.Context, _ time.Duration, fn func(context.Context)) {
			a.opts.Live.Every(ctx.Done(), "gcInterval", func() { fn(ctx) })
		}
	}
	run(ctx, a.opts.GCInterval, func(ctx context.Context) {
		if _, err := a.store.PruneReplies(time.Now()); err != nil {
			a.log.Warn().Err(err).Msg("pruning request records")
		}
		if a.rt.Ready() {
			a.collectGarbage(ctx)
		}
	})
}

// collectGarbage removes what no desired pod needs, keeping every desired
// pod's images.
func (a *Agent) collectGarbage(ctx context.Context) {
	pods, err := a.store.ListPods()
	if err != nil {
		a.log.Warn().Err(err).Msg("listing desired pods for garbage collection")
		return
	}
	desiredUIDs := map[string]bool{}
	policy := a.opts.GCPolicy
	policy.KeepImages = slices.Clone(policy.KeepImages)
	for _, p := range pods {
		desiredUIDs[string(p.UID)] = true
		for _, c := range slices.Concat(p.Spec.InitContainers, p.Spec.Containers) {
			policy.KeepImages = append(policy.KeepImages, c.Image)
		}
	}
	if err := a.rt.GarbageCollect(ctx, policy, func(uid string) bool { return desiredUIDs[uid] }); err != nil {
		a.log.Warn().Err(err).Msg("garbage collection")
	}
}

// desired adapts the store to what the pod workers ask.
type desired struct{ Store }

func (d desired) DesiredPod(namespace, name string) (*v1.Pod, error) {
	pod, err := d.Pod(namespace, name)
	if errors.Is(err, store.ErrNotFound) {
		return nil, nil
	}
	return pod, err
}

// eventSink publishes events on the events topic.
type eventSink struct {
	topics  apiv1.Scheme
	out     reply.Publisher
	log     zerolog.Logger
	history *eventlog.Log // nil: none kept
}

func (s eventSink) Emit(ev *v1.Event) {
	payload, err := json.Marshal(ev)
	if err != nil {
		s.log.Error().Err(err).Msg("encoding event")
		return
	}
	if s.history != nil {
		s.history.Add(ev)
	}
	if err := s.out.Put(outbox.Message{Topic: s.topics.Events(), Payload: payload, QoS: 1}); err != nil {
		s.log.Warn().Err(err).Str("reason", ev.Reason).Msg("queueing event")
	}
}

// Scrubbed returns a Publisher that removes the node's secret values (as
// scrub knows them at each message) from every payload before next queues
// it: events, pod statuses, replies, node status and metrics alike, so no
// route by which a value reaches a message (a runtime error quoting an
// expanded command, a validation error quoting a field) publishes it.
func Scrubbed(next Publisher, scrub func() *redact.Scrubber) Publisher {
	return scrubbingPublisher{next: next, scrub: scrub}
}

type scrubbingPublisher struct {
	next  Publisher
	scrub func() *redact.Scrubber
}

func (p scrubbingPublisher) Put(m outbox.Message) error {
	m.Payload = p.scrub().JSON(m.Payload)
	return p.next.Put(m)
}

// PutBatch scrubs each message as Put does and queues them together.
func (p scrubbingPublisher) PutBatch(msgs []outbox.Message) error {
	s := p.scrub()
	scrubbed := make([]outbox.Message, len(msgs))
	for i, m := range msgs {
		m.Payload = s.JSON(m.Payload)
		scrubbed[i] = m
	}
	return p.next.PutBatch(scrubbed)
}
