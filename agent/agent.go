// Package agent is mqlet's orchestration core. It wires the command intake,
// the pod workers, the status publisher, the event recorder, the MQTT
// session with the node's presence, telemetry and the periodic loops
// together, and owns every goroutine it starts. It talks to the stores and
// the runtime only through small interfaces declared here.
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
	"github.com/mqlet/mqlet/agent/eviction"
	"github.com/mqlet/mqlet/agent/inflight"
	"github.com/mqlet/mqlet/agent/intake"
	"github.com/mqlet/mqlet/agent/liveconfig"
	"github.com/mqlet/mqlet/agent/outboxdrops"
	"github.com/mqlet/mqlet/agent/pending"
	"github.com/mqlet/mqlet/agent/podworker"
	"github.com/mqlet/mqlet/agent/presence"
	"github.com/mqlet/mqlet/agent/prober"
	"github.com/mqlet/mqlet/agent/reply"
	"github.com/mqlet/mqlet/agent/restart"
	"github.com/mqlet/mqlet/agent/retained"
	"github.com/mqlet/mqlet/agent/shell"
	"github.com/mqlet/mqlet/agent/statusmgr"
	"github.com/mqlet/mqlet/agent/store"
	"github.com/mqlet/mqlet/agent/streams"
	"github.com/mqlet/mqlet/agent/telemetry"
	"github.com/mqlet/mqlet/agent/validate"
	apiv1 "github.com/mqlet/mqlet/api/v1"
	"github.com/mqlet/mqlet/cri"
	"github.com/mqlet/mqlet/internal/crashout"
	"github.com/mqlet/mqlet/internal/liveperiod"
	"github.com/mqlet/mqlet/internal/redact"
	"github.com/mqlet/mqlet/internal/runtimeclass"
	"github.com/mqlet/mqlet/mqtt/outbox"
	"github.com/mqlet/mqlet/mqtt/session"
)

// Runtime is what the agent needs of the container runtime manager.
type Runtime interface {
	podworker.Runtime
	telemetry.Runtime
	telemetry.CRICallStats
	prober.Execer
	Run(ctx context.Context)
	Ready() bool
	Changes() <-chan struct{}
	RunPLEG(ctx context.Context, period liveperiod.Source, out chan<- cri.PodLifecycleEvent)
	GarbageCollect(ctx context.Context, policy cri.GCPolicy, isDesired func(uid string) bool) error
	RotateLogs(ctx context.Context, r cri.LogRotation) error
	intake.VerbRuntime
	shell.Runtime
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
	intake.PendingStore
	presence.SeqSource
	GroupGenerations() (map[string]uint64, error)
}

// Publisher queues messages for the broker (the outbox).
type Publisher interface {
	Put(m outbox.Message) error
	intake.BatchOutbox
}

// Outbox is the persistent queue of outgoing messages and its sender loop.
type Outbox interface {
	Publisher
	Run(ctx context.Context, pub outbox.Publisher) error
	Stats() outbox.Stats
}

// Deps are the parts the agent is built on; the caller opens and closes them.
type Deps struct {
	Store   Store
	Outbox  Outbox
	Runtime Runtime
	// ScrubPod gives the scrubber of the text a pod's containers and the
	// runtime produce for it (redact.Live.ForPod): logs, exec output and
	// probe output are scrubbed with it (the runtime's errors and messages
	// are scrubbed by the runtime with the same). Nothing else is: the
	// protocol's own words (phases, reasons, conditions) and what a
	// requester sent in are never replaced. nil: nothing is scrubbed.
	ScrubPod func(namespace, name string) *redact.Scrubber
}

// Options are the agent's settings, taken from the configuration.
type Options struct {
	Topics          apiv1.Scheme
	MaxPayloadBytes int
	Policy          validate.Policy
	Workers         int
	Restart         restart.Policy
	PodResync       time.Duration // every known pod synced again (jittered); 0: never
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
	// Unsealer opens sealed Secrets, and its public key is published in
	// the node's state (nil: sealed Secrets are refused).
	Unsealer intake.Unsealer
	// RequireSealedSecrets refuses Secrets that come unsealed.
	RequireSealedSecrets bool
	MaxPods              int // pods.maxPods; 0: no limit
	// NodeLabels (the well-known ones; the configured ones are
	// Telemetry.NodeLabels, or Live's) and Allocatable are what pods are
	// admitted against
	// (see intake.Options).
	NodeLabels  map[string]string
	Allocatable v1.ResourceList
	// RuntimeClasses are the classes a pod's runtimeClassName may name.
	RuntimeClasses runtimeclass.Set
	// LogRotation bounds container log files, checked every
	// LogRotationPeriod (0: never).
	LogRotation       cri.LogRotation
	LogRotationPeriod time.Duration
	// CommandMarks (one slot) and SyncMarks (Workers slots) are the
	// in-flight mark files (agent/inflight); nil turns the poison guard off.
	CommandMarks, SyncMarks *inflight.File
	// Crash is the previous process's Go crash report (internal/crashout;
	// empty when it did not crash): with SyncMarks it tells which pod's
	// sync crashed the agent.
	Crash crashout.Report
	// MaxReplyBytes bounds each reply message (0: reply.DefaultMaxReplyBytes).
	MaxReplyBytes int
	// MaxBacklog and MaxBacklogBytes bound the commands waiting to be
	// persisted (0: the intake's defaults).
	MaxBacklog      int
	MaxBacklogBytes int
	// Logs and Exec bound the operator verbs; Streams bounds the logs,
	// exec and restart requests running at once.
	Logs    intake.LogLimits
	Exec    intake.ExecLimits
	Streams streams.Limits
	// EventLog, when set, keeps the events published (get Event).
	EventLog *eventlog.Log
	// Live, when set, holds the settings the config verb changes.
	Live *liveconfig.Settings
	// Groups are the node's groups when Live is not set (Live's groups
	// are live).
	Groups []string
	// LogLevel, when set with Live, is set to Live's logLevel at each change.
	LogLevel LogLevel

	// Version is mqlet's, published in the presence and node status.
	Version string
	// Session is the MQTT connection; the agent fills in the command
	// filter, the handler, the will and the birth message.
	Session session.Options
	// Telemetry configures node status and metrics; Topics is the agent's.
	Telemetry telemetry.Config
	// Preload, when set, imports image tarballs from a directory.
	Preload *cri.PreloadConfig
	// Eviction, when set, runs the eviction manager (agent/eviction):
	// ephemeral storage limits and node-pressure eviction; its pressure
	// conditions are published on the node and refuse new pods.
	Eviction *EvictionOptions
}

// LogLevel is the log level that follows logLevel (logging.Level).
type LogLevel interface {
	Set(level string) error
}

// Agent is the running core.
type Agent struct {
	opts     Options
	store    Store
	box      Outbox
	out      Publisher // box, scrubbed
	rt       Runtime
	log      zerolog.Logger
	presence *presence.Presence
	retained *retained.Registry
	sess     *session.Session
	tel      *telemetry.Telemetry
	events   *events.Recorder
	status   *statusmgr.Manager
	tracker  *pending.Tracker
	pool     *podworker.Pool
	intake   *intake.Intake
	cmds     *intake.Pipeline // the only caller of intake.Handle
	group    *intake.Group
	owed     []string // pod keys that final replies owed at start wait on
	probes   *prober.Manager
	streams  *streams.Manager
	shells   *shell.Manager
	drops    *outboxdrops.Reporter // nil: the outbox signals no drops
	eviction *eviction.Manager     // nil: no eviction
	// stateChanged asks for the node state to be published again.
	stateChanged chan struct{}
}

// New builds the agent and everything it runs; Run starts it.
func New(ctx context.Context, opts Options, deps Deps, log zerolog.Logger) (*Agent, error) {
	st, rt := deps.Store, deps.Runtime
	var out Publisher = deps.Outbox
	scrubPod := deps.ScrubPod
	if scrubPod == nil {
		scrubPod = func(string, string) *redact.Scrubber { return nil }
	}
	a := &Agent{opts: opts, store: st, box: deps.Outbox, out: out, rt: rt, log: log, stateChanged: make(chan struct{}, 1)}
	// Replies and events are persisted in groups (see intake.Group).
	a.group = intake.NewGroup(st, out, log.With().Str("component", "intake").Logger())
	a.events = events.New(eventSink{topics: opts.Topics, out: a.group.Publisher(), log: log, history: opts.EventLog}, events.Options{Node: opts.Topics.Node}, log.With().Str("component", "events").Logger())
	reg, err := retained.New(out, st, opts.Session.BrokerIDs(), log.With().Str("component", "retained").Logger())
	if err != nil {
		return nil, err
	}
	a.retained = reg
	a.status = statusmgr.New(opts.Topics, reg, st, log.With().Str("component", "status").Logger())
	var replyOpts []reply.Option
	if opts.MaxReplyBytes > 0 {
		replyOpts = append(replyOpts, reply.WithMaxReplyBytes(opts.MaxReplyBytes))
	}
	sender := reply.NewSender(opts.Topics, a.group.Publisher(), a.group.Recorder(), nil, log.With().Str("component", "reply").Logger(), replyOpts...)
	a.tracker = pending.New(a.group.Finals(sender), nil)
	// A probe result that changes syncs the pod at once: its status (Ready)
	// is published, or its container killed for a failed liveness probe.
	a.probes = prober.New(prober.Options{Exec: rt, Events: podScrubbingEvents{next: a.events, scrub: scrubPod}, Log: log.With().Str("component", "prober").Logger(),
		OnChange: func(uid string) { a.pool.EnqueueUID(uid) }})
	poolOpts := podworker.Options{Workers: opts.Workers, BackoffBase: opts.Restart.Base, BackoffMax: opts.Restart.Max, Restart: opts.Restart,
		Resync: opts.PodResync, HostIPs: opts.HostIPs, Quarantines: st, Deaths: st, Probes: a.probes, Evictions: st}
	if er, ok := rt.(EvictionRuntime); ok {
		poolOpts.ReleaseStorage = func(_ context.Context, p *v1.Pod) error { return er.ReleasePodStorage(string(p.UID)) }
	}
	intakeOpts := intake.Options{Topics: opts.Topics, MaxPayloadBytes: opts.MaxPayloadBytes, Policy: opts.Policy, ApplyDeadline: opts.ApplyDeadline, MaxPods: opts.MaxPods,
		NodeLabels: opts.NodeLabels, Allocatable: opts.Allocatable, RuntimeClasses: opts.RuntimeClasses, Opener: opts.Opener, ProfilePolicy: opts.ProfilePolicy,
		Unsealer: opts.Unsealer, RequireSealedSecrets: opts.RequireSealedSecrets}
	// Set only when present: a nil *inflight.File in an interface is not nil.
	if opts.SyncMarks != nil {
		poolOpts.Marks = opts.SyncMarks
	}
	if opts.CommandMarks != nil {
		intakeOpts.Marks = opts.CommandMarks
	}
	a.pool = podworker.New(poolOpts, rt, desired{Store: st, node: opts.Topics.Node}, a.status, a.tracker, a.events, log.With().Str("component", "podworker").Logger())
	if err := a.buildEviction(opts.Eviction); err != nil {
		return nil, err
	}
	if a.eviction != nil {
		intakeOpts.Pressure = a.eviction
	}
	a.streams = streams.New(opts.Streams)
	intakeOpts.Verbs = intake.VerbOptions{Runtime: rt, Restarts: a.pool, Streams: a.streams, Logs: opts.Logs, Exec: opts.Exec, RestartTimeout: opts.ApplyDeadline, Scrub: scrubPod}
	if opts.Exec.Enabled {
		a.shells = shell.New(rt, shellOutput{a}, opts.Exec.IdleTimeout, log.With().Str("component", "shell").Logger())
		intakeOpts.Verbs.Shell = a.shells
	}
	intakeOpts.Groups = a.groups
	intakeOpts.LiveLabels = a.liveLabels
	if d, ok := opts.Opener.(intake.DocumentOpener); ok {
		intakeOpts.DocumentOpener = d
	}
	intakeOpts.OnGroupApplied = a.groupApplied
	if opts.Live != nil {
		intakeOpts.Verbs.Config = opts.Live
	}
	if opts.EventLog != nil {
		intakeOpts.Verbs.Events = opts.EventLog
	}
	// Telemetry is built below; commands are handled only once Run starts.
	intakeOpts.Verbs.Node = nodeOf{a}
	a.intake = intake.New(intakeOpts, st, sender, a.tracker, a.pool, a.events, a.status, log.With().Str("component", "intake").Logger())
	a.cmds = intake.NewPipeline(a.intake, st, out, sender, intake.PipelineOptions{MaxBacklog: opts.MaxBacklog, MaxBacklogBytes: opts.MaxBacklogBytes, Group: a.group}, log.With().Str("component", "intake").Logger())
	a.recoverInFlight()
	// Before the workers run, so what they observe answers these too.
	owed, err := a.group.RestorePending(st, a.tracker)
	if err != nil {
		a.log.Error().Err(err).Msg("restoring the final replies owed at the last stop")
	}
	a.owed = owed

	if err := a.buildSession(); err != nil {
		return nil, err
	}
	telCfg := opts.Telemetry
	telCfg.Topics, telCfg.Version = opts.Topics, opts.Version
	// The node object carries the configured and the groups' labels,
	// following live changes.
	telCfg.NodeLabels, telCfg.LiveLabels = nil, a.liveLabels
	if opts.Live != nil {
		telCfg.LabelsChanged = opts.Live.Changes
	}
	counters := telemetry.Counters(telemetry.Merge(a.Counters, telemetry.CRICounters(rt)), deps.Outbox, a.sess)
	telDeps := telemetry.Deps{Runtime: rt, Out: out, Retained: a.retained, Events: a.events, Counters: counters}
	if a.eviction != nil {
		telDeps.Pressure = pressure(a.eviction)
	}
	tel, err := telemetry.New(ctx, telCfg, telDeps, log)
	if err != nil {
		return nil, fmt.Errorf("setting up telemetry: %w", err)
	}
	a.tel = tel
	if src, ok := deps.Outbox.(outboxdrops.Source); ok {
		a.drops = outboxdrops.New(src, a.events, 0, 0, log.With().Str("component", "outbox").Logger())
	}
	return a, nil
}

// buildSession makes the MQTT session: commands go to the intake, the will
// says offline, and each connect publishes online with the next sequence.
func (a *Agent) buildSession() error {
	var sealingKey string
	if a.opts.Unsealer != nil {
		sealingKey = a.opts.Unsealer.Recipient()
	}
	a.presence = presence.New(a.opts.Topics.State(), a.opts.Version, sealingKey, a.store, nil)
	a.presence.SetGroups(a.groups)
	a.presence.SetGenerations(a.groupGenerations)
	// The will is made after the groups are known: a will without them
	// (retained once the broker publishes it) takes the node out of its
	// groups for every fleet command (a rollout started without it: CI).
	will := a.presence.Offline()
	so := a.opts.Session
	so.CommandFilters = a.commandFilters(a.groups())
	so.InputFilter = a.opts.Topics.InputFilter()
	so.Handler = a.HandleCommand
	so.WatchFilter = a.opts.Topics.PodFilter()
	so.WatchHandler = a.handlePodTopic
	so.ManualAck = true // the agent acknowledges each command once it is persisted
	so.Will = &will
	// Every connect, to the same broker or another, publishes the node's
	// whole retained state: the broker may have lost it or never had it.
	so.OnConnect = func(ctx context.Context) error {
		online, err := a.presence.Online()
		if err != nil {
			return err
		}
		return a.retained.Republish(ctx, a.sess.Broker(), a.sess, online)
	}
	sess, err := session.New(so, a.log)
	if err != nil {
		return fmt.Errorf("configuring the MQTT session: %w", err)
	}
	a.sess = sess
	return nil
}

// BootID is this process's boot id, as published in the presence.
func (a *Agent) BootID() string { return a.presence.BootID() }

// recoverInFlight deals with what was in flight when the previous process
// died: the command is answered failed; a pod proven to stop the agent
// (podworker.Recover) is quarantined. The marks are cleared only once that
// is persisted, so dying again here repeats it.
func (a *Agent) recoverInFlight() {
	if f := a.opts.CommandMarks; f != nil {
		a.intake.Recover(f.Left())
		if err := f.Reset(); err != nil {
			a.log.Error().Err(err).Msg("clearing command marks")
		}
	}
	if f := a.opts.SyncMarks; f != nil {
		death := podworker.Death{Crashed: a.opts.Crash.Crashed(), Goroutines: a.opts.Crash.Goroutines()}
		if death.Crashed {
			a.log.Error().Uints64("goroutines", death.Goroutines).Msg("the previous mqlet crashed (Go runtime error); its report is in the log of that process")
		}
		if err := a.pool.Recover(f.Left(), death); err != nil {
			a.log.Error().Err(err).Msg("quarantining pods whose sync stopped the agent; their marks are kept")
		} else if err := f.Reset(); err != nil {
			a.log.Error().Err(err).Msg("clearing pod sync marks")
		}
	}
}

// HandleCommand queues one message from the command topics for the intake
// and returns at once; the message is acknowledged (m.Ack, the session's
// ManualAck) once the command's effect on the desired state is persisted.
//
// A message on a running request's input topic is not a command: it says
// the request's reader is still there, and is neither persisted nor
// answered.
func (a *Agent) HandleCommand(m session.Inbound) {
	if id, err := a.opts.Topics.ParseInput(m.Topic); err == nil {
		m.Ack()
		if m.Retained {
			return // a stale message kept by the broker says nothing now
		}
		if len(m.Payload) > 0 && (a.shells == nil || !a.shells.Input(id, m.Payload)) {
			return // input for no running session
		}
		a.streams.Touch(id)
		return
	}
	a.cmds.Submit(intake.Command{Topic: m.Topic, Payload: m.Payload, Retained: m.Retained, Duplicate: m.Duplicate, Ack: m.Ack})
}

// handlePodTopic clears a status on the node's pod topics that the node
// did not publish: a retained one found at a (re)connect, or one published
// meanwhile (MQTT 3.1.1 delivers it without the retain flag, so any
// non-empty status of a pod the node does not hold counts). The node's own
// statuses come back here too and are left alone.
func (a *Agent) handlePodTopic(m session.Inbound) {
	if len(m.Payload) == 0 {
		return
	}
	ns, name, ok := a.opts.Topics.ParsePod(m.Topic)
	if !ok {
		return
	}
	// Only a pod the store says it does not have is foreign; a failed
	// read keeps the topic.
	_, err := a.store.Pod(ns, name)
	desired := !errors.Is(err, store.ErrNotFound)
	cleared, err := a.status.ClearForeign(ns, name, desired)
	if err != nil {
		a.log.Warn().Err(err).Str("topic", m.Topic).Msg("clearing a pod status the node did not publish")
		return
	}
	if cleared {
		a.log.Warn().Str("topic", m.Topic).Bool("retained", m.Retained).Msg("cleared a pod status the node did not publish")
	}
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
		"events_overflowed":    es.Overflowed,
		"pending_commands":     uint64(a.tracker.Len()),
		"commands_waiting":     uint64(a.cmds.Waiting()),
	}
}

// Shutdown bounds: the goodbye is best effort (the broker's will says
// offline anyway); the quiesce lets paho flush what is in flight.
const (
	goodbyeTimeout    = 3 * time.Second
	disconnectQuiesce = 250 * time.Millisecond
)

// Run starts every part and blocks until ctx ends and all have stopped.
//
// The parts run on runCtx, not ctx: runCtx outlives ctx (the signal) so that,
// once the signal comes, the MQTT session is still up to publish the
// offline state, and the outbox and workers are not cut off mid-write. The
// order is then: 1. offline state through the live session; 2. disconnect
// (a clean one: the broker drops the will); 3. cancel runCtx, stopping every
// loop; 4. wait for all of them. The caller closes the stores only after
// Run returns, so no loop writes into a closed store.
func (a *Agent) Run(ctx context.Context) error {
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	spawn := func(name string, f func(ctx context.Context) error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(runCtx); err != nil && runCtx.Err() == nil {
				a.log.Error().Err(err).Str("part", name).Msg("stopped unexpectedly")
			}
			a.log.Debug().Str("part", name).Msg("stopped")
		}()
	}
	loop := func(f func(ctx context.Context)) func(ctx context.Context) error {
		return func(ctx context.Context) error { f(ctx); return nil }
	}
	spawn("intake", loop(a.cmds.Run))
	spawn("reply-group", loop(a.group.Run))
	spawn("streams", loop(a.streams.Run))
	spawn("runtime", loop(a.rt.Run))
	spawn("workers", loop(a.pool.Run))
	spawn("prober", loop(a.probes.Run))
	spawn("pending", loop(a.tracker.Run))
	spawn("status-resync", loop(func(ctx context.Context) { a.status.Run(ctx, a.period("podStatusResync", a.opts.PodStatusResync)) }))
	spawn("pleg", loop(a.runPLEG))
	spawn("runtime-watch", loop(a.watchRuntime))
	spawn("housekeeping", loop(a.housekeeping))
	if a.opts.Live != nil && a.opts.LogLevel != nil {
		spawn("log-level", loop(a.followLogLevel))
	}
	if a.opts.Live != nil {
		spawn("groups", loop(a.followGroups))
	}
	if a.opts.LogRotationPeriod > 0 && a.opts.LogRotation.MaxBytes > 0 {
		spawn("log-rotation", loop(a.rotateLogs))
	}
	spawn("mqtt", a.sess.Run)
	spawn("outbox", func(ctx context.Context) error { return a.box.Run(ctx, a.sess) })
	if a.drops != nil {
		spawn("outbox-drops", loop(a.drops.Run))
	}
	spawn("telemetry", a.tel.Run)
	if a.eviction != nil {
		spawn("eviction", loop(a.eviction.Run))
	}
	if a.opts.Preload != nil && a.opts.Preload.Dir != "" {
		spawn("preload", cri.NewPreloader(*a.opts.Preload, a.events, a.log).Run)
	}
	<-ctx.Done()
	a.log.Info().Msg("stopping: publishing offline state")
	byeCtx, byeCancel := context.WithTimeout(runCtx, goodbyeTimeout)
	if err := a.sess.Publish(byeCtx, a.presence.Offline()); err != nil {
		a.log.Warn().Err(err).Msg("could not publish offline state; the broker's will says it")
	}
	byeCancel()
	a.sess.Disconnect(disconnectQuiesce)
	cancel()
	wg.Wait()
	a.log.Info().Msg("mqlet stopped")
	return nil
}

// followLogLevel sets the log level to logLevel at each change of the live
// settings.
func (a *Agent) followLogLevel(ctx context.Context) {
	current := ""
	for {
		changed := a.opts.Live.Changes()
		if next := a.opts.Live.LogLevel(); next != current {
			if err := a.opts.LogLevel.Set(next); err != nil {
				a.log.Error().Err(err).Msg("setting the log level")
			} else if current != "" {
				a.log.Info().Str("logLevel", next).Msg("log level changed")
			}
			current = next
		}
		select {
		case <-ctx.Done():
			return
		case <-changed:
		}
	}
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
	// A delete owed its reply may wait on a pod that went while mqlet
	// was down: looked at, it is reported gone.
	for _, k := range a.owed {
		keys[k] = true
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
		a.rt.RunPLEG(ctx, a.period("plegPeriod", a.opts.PLEGPeriod), ch)
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

// period is the live setting key when the config verb may change it, else
// the fixed d.
func (a *Agent) period(key string, d time.Duration) liveperiod.Source {
	if a.opts.Live != nil {
		return a.opts.Live.Period(key)
	}
	return liveperiod.Fixed(d)
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
			a.opts.Live.Every(ctx, "gcInterval", func() { fn(ctx) })
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
func (a *Agent) collectGarbage(ctx context.Context) { a.collectGarbageWith(ctx, a.opts.GCPolicy) }

// collectGarbageWith is collectGarbage with policy.
func (a *Agent) collectGarbageWith(ctx context.Context, policy cri.GCPolicy) {
	pods, err := a.store.ListPods()
	if err != nil {
		a.log.Warn().Err(err).Msg("listing desired pods for garbage collection")
		return
	}
	desiredUIDs := map[string]bool{}
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

// nodeOf gives the intake the node telemetry last published.
type nodeOf struct{ a *Agent }

func (n nodeOf) Node() *v1.Node {
	if n.a.tel == nil {
		return nil
	}
	return n.a.tel.Node()
}

// desired adapts the store to what the pod workers ask.
type desired struct {
	Store
	node string
}

func (d desired) DesiredPod(namespace, name string) (*v1.Pod, error) {
	pod, err := d.Pod(namespace, name)
	if errors.Is(err, store.ErrNotFound) {
		return nil, nil
	}
	if pod != nil && pod.Spec.NodeName == "" {
		// Stored before the intake bound pods to the node.
		pod.Spec.NodeName = d.node
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

// podScrubbingEvents scrubs the messages of events about a pod's
// containers (a probe's output) with that pod's scrubber.
type podScrubbingEvents struct {
	next  prober.EventRecorder
	scrub func(namespace, name string) *redact.Scrubber
}

func (e podScrubbingEvents) ObjectEvent(ref v1.ObjectReference, eventType, reason, message string) {
	e.next.ObjectEvent(ref, eventType, reason, e.scrub(ref.Namespace, ref.Name).String(message))
}

// shellOutput publishes an interactive session's output straight on the
// session (QoS 1, waiting for the broker), not through the outbox: a
// terminal's output is worth nothing once its requester is gone.
type shellOutput struct{ a *Agent }

func (o shellOutput) Publish(ctx context.Context, topic string, payload []byte) error {
	return o.a.sess.Publish(ctx, outbox.Message{Topic: topic, Payload: payload, QoS: 1})
}
