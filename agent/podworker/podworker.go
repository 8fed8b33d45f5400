// Package podworker runs the desired pods: a work queue of pod keys
// ("namespace/name"), one runner per pod holding that pod's state, and a
// bounded number of sync slots. One key is never worked on twice at once
// (the queue guarantees it); a failing sync is retried with per-pod
// exponential backoff, a crash-looping container is retried when its
// backoff ends, and every known pod is synced again now and then (resync)
// to catch what the lifecycle events missed. Only syncs take a slot:
// deletes and kills never wait behind other pods' syncs, and a delete
// cancels its pod's sync in flight. Nothing here ever gives up.
package podworker

import (
	"context"
	"fmt"
	"github.com/mqlet/mqlet/agent/podstatus"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/workqueue"

	"github.com/mqlet/mqlet/agent/pending"
	"github.com/mqlet/mqlet/agent/restart"
	"github.com/mqlet/mqlet/agent/store"
	"github.com/mqlet/mqlet/cri"
)

// Runtime is what the workers need of the container cri.
type Runtime interface {
	GetPodStatus(ctx context.Context, uid, name, namespace string) (*cri.PodStatus, error)
	SyncPod(ctx context.Context, in cri.SyncInput) error
	KillPodByRef(ctx context.Context, ref cri.PodRef, gracePeriodOverride *int64) error
	// StopPod stops the pod's containers and sandbox, removing nothing.
	StopPod(ctx context.Context, pod *v1.Pod, events cri.EventRecorder) error
	ListPods(ctx context.Context) ([]cri.PodRef, error)
	RuntimeInfo() (name, version string)
}

// Desired is the desired state: the pods to run and the objects they use.
type Desired interface {
	cri.ObjectSource
	// DesiredPod returns the stored pod, or nil when it is not desired.
	DesiredPod(namespace, name string) (*v1.Pod, error)
}

// StatusSink receives each pod's status (the status manager).
type StatusSink interface {
	Set(pod *v1.Pod, status v1.PodStatus) error
	Get(namespace, name string) (*v1.Pod, bool)
	Remove(namespace, name string) error
	// Retained reports whether the pod's topic holds a status retained
	// by this or an earlier process.
	Retained(namespace, name string) bool
}

// Observer is told each pod's outcome (the pending-command tracker).
type Observer interface {
	Observe(key string, out pending.Outcome)
}

// Marker remembers which pod each sync slot is syncing (agent/inflight),
// so a sync that kills the agent is found at the next start.
type Marker interface {
	Set(slot int, value string) error
	Clear(slot int) error
}

// Quarantines are the persisted quarantines of pods not to sync (the store).
type Quarantines interface {
	SetQuarantine(key string, q store.Quarantine) error
	GetQuarantine(key string) (store.Quarantine, bool, error)
	LiftQuarantine(key string) error
}

// Reasons of the quarantine's events and status.
const (
	ReasonKilling          = "Killing"
	ReasonQuarantined      = "Quarantined"
	ReasonQuarantineLifted = "QuarantineLifted"
	ReasonSyncPanicked     = "SyncPanicked"
	// MsgStoppedAgent starts the quarantine reason of a pod whose sync was
	// proven to stop the agent (see Recover).
	MsgStoppedAgent = "sync of this pod stopped the agent"
)

// Options are the numbers of the workers.
type Options struct {
	// Workers is how many pods are synced at once (sync slots).
	Workers     int
	BackoffBase time.Duration // first retry delay of a failing pod sync
	BackoffMax  time.Duration
	// Restart is the crash-loop policy; each pod's runner keeps its own tracker.
	Restart restart.Policy
	// Resync is how often every known pod is synced again without a
	// cause (jittered); 0 turns it off.
	Resync  time.Duration
	HostIPs []string
	// Marks, when set, holds one in-flight mark per sync slot (Workers slots).
	Marks Marker
	// Quarantines, when set, keeps pods whose sync stopped the agent from
	// being synced again until their spec changes.
	Quarantines Quarantines
	// Deaths, when set, keeps each pod's count of agent deaths in a row
	// with its sync in flight (see SuspectDeaths); without it no pod is
	// quarantined for deaths, only for a Go crash traced to its sync.
	Deaths Ledger
	// Probes, when set, runs the containers' probes; without it probes
	// are not run and a probed container is never ready.
	Probes Probes
	// Evictions, when set, keeps the pods evicted (Evict) across restarts.
	Evictions Ledger
	// ReleaseStorage, when set, removes what an evicted pod holds on the
	// node's disk (its emptyDirs) once it is stopped.
	ReleaseStorage func(ctx context.Context, pod *v1.Pod) error
}

// Probes runs the containers' probes (agent/prober): it follows each
// pod's running containers, says which are started and ready, and gives
// SyncPod the results (a failed liveness or startup probe kills).
type Probes interface {
	cri.ProbeResults
	Track(pod *v1.Pod, rs *cri.PodStatus)
	Forget(podUID string)
	States(podUID string) map[string]podstatus.Probed
	// Unchecked says a readiness or startup probe of the pod's running
	// containers has not run yet (its result is the initial one).
	Unchecked(podUID string) bool
}

// Pool owns the queue, the runners and the sync slots.
type Pool struct {
	opts    Options
	rt      Runtime
	desired Desired
	status  StatusSink
	observe Observer
	events  cri.EventRecorder
	log     zerolog.Logger
	queue   workqueue.TypedRateLimitingInterface[string]
	tasks   sync.WaitGroup // one goroutine per key being worked on, and the kills

	runners   runnerSet // key → the pod's runner (runner.go)
	slots     *slotSet  // the sync slots and their in-flight marks (slots.go)
	restarts  restarts  // restart requests waiting for their pod's worker (restart.go)
	suspects  suspects  // pods with agent deaths counted against them (suspects.go)
	evictions evictions // pods failed by the eviction manager (evict.go)
	counters  counters
}

// counters are the pool's counts since it was made.
type counters struct {
	syncs, failures, backoffs atomic.Uint64
}

// New returns a Pool; call Run to start it.
func New(opts Options, rt Runtime, desired Desired, status StatusSink, observe Observer, events cri.EventRecorder, log zerolog.Logger) *Pool {
	if opts.Workers < 1 {
		opts.Workers = 1
	}
	if opts.Restart == (restart.Policy{}) {
		opts.Restart = restart.DefaultPolicy
	}
	limiter := workqueue.NewTypedItemExponentialFailureRateLimiter[string](opts.BackoffBase, opts.BackoffMax)
	return &Pool{
		opts: opts, rt: rt, desired: desired, status: status, observe: observe, events: events, log: log,
		queue:     workqueue.NewTypedRateLimitingQueueWithConfig(limiter, workqueue.TypedRateLimitingQueueConfig[string]{Name: "pods"}),
		slots:     newSlotSet(opts.Workers, opts.Marks, log),
		runners:   runnerSet{policy: opts.Restart, byKey: map[string]*runner{}},
		suspects:  suspects{ledger: opts.Deaths, log: log},
		evictions: evictions{ledger: opts.Evictions},
	}
}

// runnerFor returns key's runner, made when missing.
func (p *Pool) runnerFor(key string) *runner { return p.runners.get(key) }

// dropRunner forgets r (its pod is gone from the runtime and the desired
// state), with its restart tracker.
func (p *Pool) dropRunner(r *runner) {
	p.runners.drop(r)
	r.stopDeadline()
}

// Enqueue asks for the pod with key to be synced soon.
func (p *Pool) Enqueue(key string) { p.queue.Add(key) }

// EnqueueDelete asks for the pod to be removed with a grace period chosen
// by a delete command (nil: the pod's own). Its sync in flight, if any, is
// cancelled: a delete does not wait for an image pull or a slow create.
func (p *Pool) EnqueueDelete(key string, grace *int64) {
	p.runnerFor(key).deleteRequested(grace)
	p.queue.Add(key)
}

// EnqueueUID asks for the pod with this runtime UID to be synced (PLEG).
func (p *Pool) EnqueueUID(uid string) bool {
	key := p.runners.keyOf(uid)
	if key == "" {
		return false
	}
	p.queue.Add(key)
	return true
}

// Stats are the pool's counters.
type Stats struct {
	QueueDepth int
	Syncs      uint64
	Failures   uint64
	Backoffs   uint64
}

// Stats returns the pool's counters.
func (p *Pool) Stats() Stats {
	c := &p.counters
	return Stats{QueueDepth: p.queue.Len(), Syncs: c.syncs.Load(), Failures: c.failures.Load(), Backoffs: c.backoffs.Load()}
}

// Run works the queue and blocks until ctx ends and every goroutine it
// started has stopped. Each key taken from the queue is worked on by a
// goroutine of its own (the queue hands a key out once at a time, so there
// is at most one per pod); the sync slots bound how many sync at once.
func (p *Pool) Run(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		<-ctx.Done()
		p.queue.ShutDown()
	}()
	go func() {
		defer wg.Done()
		if p.opts.Resync > 0 {
			// Jittered so that pods synced together do not resync together forever.
			wait.JitterUntilWithContext(ctx, p.resync, p.opts.Resync, 0.5, true)
		}
	}()
	for {
		key, shutdown := p.queue.Get()
		if shutdown {
			break
		}
		p.tasks.Add(1)
		go func() {
			defer p.tasks.Done()
			defer p.queue.Done(key)
			p.process(ctx, key)
		}()
	}
	wg.Wait()
	p.tasks.Wait() // their runtime calls end with ctx
	p.runners.each((*runner).stopDeadline)
}

// resync queues every pod with a runner, to catch drift the lifecycle
// events missed (a container changed behind the agent's back).
func (p *Pool) resync(context.Context) {
	for _, k := range p.runners.keys() {
		p.queue.Add(k)
	}
}

// process works on one key: the runner's sync, cancellable by a delete.
func (p *Pool) process(ctx context.Context, key string) {
	r := p.runnerFor(key)
	syncCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	r.begin(cancel)
	defer r.end()
	retryAfter, err := p.guarded(ctx, syncCtx, r)
	p.counters.syncs.Add(1)
	switch {
	case ctx.Err() != nil:
	case syncCtx.Err() != nil:
		// Cancelled by a delete, which queued the key again.
		p.queue.Forget(key)
	case err == nil && retryAfter > 0:
		p.queue.Forget(key)
		p.queue.AddAfter(key, retryAfter)
	case err == nil:
		p.queue.Forget(key)
	default:
		p.counters.failures.Add(1)
		p.log.Warn().Err(err).Str("pod", key).Int("retries", p.queue.NumRequeues(key)).Msg("pod sync failed; retrying with backoff")
		p.queue.AddRateLimited(key)
	}
}

// guarded runs the runner's work and turns a panic into an error, retried
// with backoff, instead of a dead agent.
func (p *Pool) guarded(life, ctx context.Context, r *runner) (retryAfter time.Duration, err error) {
	defer func() {
		rec := recover()
		if rec == nil {
			return
		}
		p.log.Error().Str("pod", r.key).Str("panic", fmt.Sprint(rec)).Str("stack", string(debug.Stack())).Msg("pod sync panicked")
		if namespace, name, ok := strings.Cut(r.key, "/"); ok {
			if pod, _ := p.desired.DesiredPod(namespace, name); pod != nil {
				p.events.Event(pod, v1.EventTypeWarning, ReasonSyncPanicked, "internal error while syncing this pod; retrying with backoff")
			}
		}
		retryAfter, err = 0, fmt.Errorf("syncing pod %s: internal error (panic: %v)", r.key, rec)
	}()
	return p.work(life, ctx, r)
}

// withSlot runs fn holding a sync slot, with the slot's in-flight mark set
// (a sync proven to kill the process quarantines the pod at a next start,
// see Recover); fn starts in phaseRead and says when it moves on with
// phase. running says the pod was synced before (it goes before first
// starts). A sync that ran to its end past its read clears the pod's death
// count (one that could not read the runtime proves nothing). It gives up
// with ctx's error when ctx ends first.
func (p *Pool) withSlot(ctx context.Context, key string, running bool, fn func(phase func(string)) error) error {
	return p.slots.with(ctx, key, running, func(phase func(string)) error {
		pastRead := false
		err := fn(func(ph string) {
			pastRead = pastRead || ph == phaseSync
			phase(ph)
		})
		if pastRead {
			p.suspects.completed(key)
		}
		return err
	})
}
