// Package podworker runs the desired pods: a work queue of pod keys
// ("namespace/name") consumed by N workers. One key is never worked on by
// two workers at once (the queue guarantees it); a failing sync is retried
// with per-pod exponential backoff, and a crash-looping container is retried
// when its backoff ends. Nothing here ever gives up.
package podworker

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"
	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/util/workqueue"

	"github.com/mqlet/mqlet/agent/pending"
	"github.com/mqlet/mqlet/agent/podstatus"
	"github.com/mqlet/mqlet/agent/store"
	"github.com/mqlet/mqlet/cri"
)

// Runtime is what the workers need of the container cri.
type Runtime interface {
	GetPodStatus(ctx context.Context, uid, name, namespace string) (*cri.PodStatus, error)
	SyncPod(ctx context.Context, pod *v1.Pod, status *cri.PodStatus, objects cri.ObjectSource, backoff cri.RestartBackoff, events cri.EventRecorder) error
	KillPodByRef(ctx context.Context, ref cri.PodRef, gracePeriodOverride *int64) error
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
}

// Observer is told each pod's outcome (the pending-command tracker).
type Observer interface {
	Observe(key string, out pending.Outcome)
}

// Backoff is the crash-loop tracker shared by all pods.
type Backoff interface {
	cri.RestartBackoff
	Forget(drop func(key string) bool)
}

// Marker remembers which pod each worker is syncing (agent/inflight), one
// slot per worker, so a sync that kills the agent is found at the next start.
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
	ReasonQuarantined      = "Quarantined"
	ReasonQuarantineLifted = "QuarantineLifted"
	ReasonSyncPanicked     = "SyncPanicked"
	// MsgStoppedAgent is the quarantine reason of a pod whose sync was
	// running when the agent died.
	MsgStoppedAgent = "sync of this pod stopped the agent"
)

// Options are the numbers of the workers.
type Options struct {
	Workers     int
	BackoffBase time.Duration // first retry delay of a failing pod sync
	BackoffMax  time.Duration
	HostIPs     []string
	// Marks, when set, holds one in-flight mark per worker (Workers slots).
	Marks Marker
	// Quarantines, when set, keeps pods whose sync stopped the agent from
	// being synced again until their spec changes.
	Quarantines Quarantines
}

// Pool owns the queue and the workers.
type Pool struct {
	opts    Options
	rt      Runtime
	desired Desired
	status  StatusSink
	observe Observer
	backoff Backoff
	events  cri.EventRecorder
	log     zerolog.Logger
	queue   workqueue.TypedRateLimitingInterface[string]

	killing sync.WaitGroup // the killAsync goroutines

	mu       sync.Mutex
	graceFor map[string]*int64 // grace period asked by a delete command
	ownGrace map[string]*int64 // the pod's own terminationGracePeriodSeconds, last synced
	uids     map[string]string // key → uid last synced, to find a pod gone from the store
	told     map[string]int64  // key → generation whose quarantine was announced by this process
	kills    map[string]*kill  // runtime pod uid → its termination, running or finished
	restarts restarts          // restart requests waiting for their pod's worker (restart.go)
	syncs    uint64
	failures uint64
	backoffs uint64
}

// New returns a Pool; call Run to start it.
func New(opts Options, rt Runtime, desired Desired, status StatusSink, observe Observer, backoff Backoff, events cri.EventRecorder, log zerolog.Logger) *Pool {
	if opts.Workers < 1 {
		opts.Workers = 1
	}
	limiter := workqueue.NewTypedItemExponentialFailureRateLimiter[string](opts.BackoffBase, opts.BackoffMax)
	return &Pool{
		opts: opts, rt: rt, desired: desired, status: status, observe: observe, backoff: backoff, events: events, log: log,
		queue:    workqueue.NewTypedRateLimitingQueueWithConfig(limiter, workqueue.TypedRateLimitingQueueConfig[string]{Name: "pods"}),
		graceFor: map[string]*int64{}, ownGrace: map[string]*int64{}, uids: map[string]string{}, told: map[string]int64{},
		kills: map[string]*kill{},
	}
}

// kill is one runtime pod being terminated outside the workers: a pod that
// ignores SIGTERM holds its termination for its whole grace period, and
// with the worker waiting, as many such pods as workers stopped every other
// pod's sync on the node (starts, restarts, deletes) for that long.
type kill struct {
	key  string
	done bool
	err  error
}

// errTerminating says a pod's old runtime pod is still terminating; the
// key is queued again when it is gone.
var errTerminating = errors.New("still terminating")

// killAsync starts terminating the runtime pod ref (once) and reports
// whether that has finished, with its error. The key is queued again when
// it finishes.
func (p *Pool) killAsync(ctx context.Context, key string, ref cri.PodRef, grace *int64) (bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	k, ok := p.kills[ref.UID]
	if !ok {
		k = &kill{key: key}
		p.kills[ref.UID] = k
		p.killing.Add(1)
		go func() {
			defer p.killing.Done()
			err := p.rt.KillPodByRef(ctx, ref, grace)
			p.mu.Lock()
			k.done, k.err = true, err
			p.mu.Unlock()
			p.queue.Add(key)
		}()
	}
	if !k.done {
		return false, nil
	}
	delete(p.kills, ref.UID)
	return true, k.err
}

// Recover quarantines the pods whose keys were marked in flight when the
// previous process died (their sync may have killed it): they are not
// synced again until a new spec or a re-creation. Call it before Run.
func (p *Pool) Recover(keys []string) error {
	if p.opts.Quarantines == nil {
		return nil
	}
	var errs []error
	for _, key := range keys {
		namespace, name, ok := strings.Cut(key, "/")
		if !ok {
			continue
		}
		pod, err := p.desired.DesiredPod(namespace, name)
		if err != nil {
			errs = append(errs, fmt.Errorf("reading pod %s to quarantine it: %w", key, err))
			continue
		}
		if pod == nil {
			continue // removed since; nothing to sync
		}
		p.log.Error().Str("pod", key).Str("uid", string(pod.UID)).Int64("generation", pod.Generation).Msg("this pod was being synced when the agent died; quarantining it")
		q := store.Quarantine{UID: pod.UID, Generation: pod.Generation, Reason: MsgStoppedAgent, Since: time.Now().UTC()}
		if err := p.opts.Quarantines.SetQuarantine(key, q); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Enqueue asks for the pod with key to be synced soon.
func (p *Pool) Enqueue(key string) { p.queue.Add(key) }

// EnqueueDelete asks for the pod to be synced with a grace period chosen by
// a delete command (nil: the pod's own).
func (p *Pool) EnqueueDelete(key string, grace *int64) {
	p.mu.Lock()
	p.graceFor[key] = grace
	p.mu.Unlock()
	p.queue.Add(key)
}

// EnqueueUID asks for the pod with this runtime UID to be synced (PLEG).
func (p *Pool) EnqueueUID(uid string) bool {
	p.mu.Lock()
	var key string
	for k, u := range p.uids {
		if u == uid {
			key = k
			break
		}
	}
	p.mu.Unlock()
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
	p.mu.Lock()
	defer p.mu.Unlock()
	return Stats{QueueDepth: p.queue.Len(), Syncs: p.syncs, Failures: p.failures, Backoffs: p.backoffs}
}

// Run starts the workers and blocks until ctx ends and they have stopped.
func (p *Pool) Run(ctx context.Context) {
	var wg sync.WaitGroup
	for slot := range p.opts.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for p.processNext(ctx, slot) {
			}
		}()
	}
	<-ctx.Done()
	p.queue.ShutDown()
	wg.Wait()
	p.killing.Wait() // their runtime calls end with ctx
}

func (p *Pool) processNext(ctx context.Context, slot int) bool {
	key, shutdown := p.queue.Get()
	if shutdown {
		return false
	}
	defer p.queue.Done(key)
	retryAfter, err := p.guardedSync(ctx, slot, key)
	p.mu.Lock()
	p.syncs++
	p.mu.Unlock()
	switch {
	case ctx.Err() != nil:
	case err == nil && retryAfter > 0:
		p.queue.Forget(key)
		p.queue.AddAfter(key, retryAfter)
	case err == nil:
		p.queue.Forget(key)
	default:
		p.mu.Lock()
		p.failures++
		p.mu.Unlock()
		delay := p.queue.NumRequeues(key)
		p.log.Warn().Err(err).Str("pod", key).Int("retries", delay).Msg("pod sync failed; retrying with backoff")
		p.queue.AddRateLimited(key)
	}
	return true
}

// guardedSync runs syncKey with the worker's in-flight mark set (a sync
// that kills the process quarantines the pod at the next start) and turns a
// panic into an error, retried with backoff, instead of a dead agent.
func (p *Pool) guardedSync(ctx context.Context, slot int, key string) (retryAfter time.Duration, err error) {
	if m := p.opts.Marks; m != nil {
		if err := m.Set(slot, key); err != nil {
			p.log.Error().Err(err).Str("pod", key).Msg("marking pod sync in flight; a crash in it would not be caught at restart")
		}
		defer func() {
			if err := m.Clear(slot); err != nil {
				p.log.Error().Err(err).Str("pod", key).Msg("clearing the in-flight mark of a pod sync")
			}
		}()
	}
	defer func() {
		r := recover()
		if r == nil {
			return
		}
		p.log.Error().Str("pod", key).Str("panic", fmt.Sprint(r)).Str("stack", string(debug.Stack())).Msg("pod sync panicked")
		if namespace, name, ok := strings.Cut(key, "/"); ok {
			if pod, _ := p.desired.DesiredPod(namespace, name); pod != nil {
				p.events.Event(pod, v1.EventTypeWarning, ReasonSyncPanicked, "internal error while syncing this pod; retrying with backoff")
			}
		}
		retryAfter, err = 0, fmt.Errorf("syncing pod %s: internal error (panic: %v)", key, r)
	}()
	return p.syncKey(ctx, key)
}

// quarantined reports whether pod must not be synced. A quarantine of an
// older spec or uid is lifted here.
func (p *Pool) quarantined(key string, pod *v1.Pod) (store.Quarantine, bool) {
	qs := p.opts.Quarantines
	if qs == nil {
		return store.Quarantine{}, false
	}
	q, ok, err := qs.GetQuarantine(key)
	if err != nil {
		p.log.Error().Err(err).Str("pod", key).Msg("reading quarantine; syncing the pod")
		return store.Quarantine{}, false
	}
	if !ok {
		return store.Quarantine{}, false
	}
	if pod != nil && q.Covers(pod.UID, pod.Generation) {
		return q, true
	}
	if err := qs.LiftQuarantine(key); err != nil {
		p.log.Error().Err(err).Str("pod", key).Msg("lifting quarantine")
	}
	p.mu.Lock()
	delete(p.told, key)
	p.mu.Unlock()
	if pod != nil {
		p.log.Info().Str("pod", key).Int64("generation", pod.Generation).Msg("quarantine lifted: the pod changed")
		p.events.Event(pod, v1.EventTypeNormal, ReasonQuarantineLifted, fmt.Sprintf("a new spec (generation %d) or uid was applied; syncing again", pod.Generation))
	}
	return store.Quarantine{}, false
}

// publishQuarantined reports a quarantined pod: a status with reason
// Quarantined (built without asking the runtime, which is what the pod's
// sync may have crashed in), a Warning event once per process and spec, and
// a failed outcome for the commands waiting on it.
func (p *Pool) publishQuarantined(key string, pod *v1.Pod, q store.Quarantine) {
	msg := fmt.Sprintf("%s (at %s); not synced until a new spec is applied or the pod is re-created", q.Reason, q.Since.Format(time.RFC3339))
	p.mu.Lock()
	announce := p.told[key] != pod.Generation
	p.told[key] = pod.Generation
	p.mu.Unlock()
	if announce {
		p.events.Event(pod, v1.EventTypeWarning, ReasonQuarantined, q.Reason)
		p.log.Warn().Str("pod", key).Msg("pod is quarantined: " + msg)
	}
	name, _ := p.rt.RuntimeInfo()
	st := podstatus.Build(pod, nil, podstatus.Hints{RuntimeName: name, HostIPs: p.opts.HostIPs}, time.Now())
	st.Reason, st.Message = ReasonQuarantined, msg
	if err := p.status.Set(pod, st); err != nil {
		p.log.Warn().Err(err).Str("pod", key).Msg("publishing pod status")
	}
	p.observe.Observe(key, pending.Outcome{Generation: pod.Generation, Done: true, OK: false, Reason: ReasonQuarantined + ": " + q.Reason})
}

// syncKey brings one pod to its desired state. It returns a delay after
// which the pod must be looked at again (crash-loop backoff), or an error
// for a retry with per-pod backoff.
func (p *Pool) syncKey(ctx context.Context, key string) (time.Duration, error) {
	namespace, name, ok := strings.Cut(key, "/")
	if !ok {
		return 0, nil // not a pod key; dropping it is all we can do
	}
	pod, err := p.desired.DesiredPod(namespace, name)
	if err != nil {
		return 0, fmt.Errorf("reading desired pod %s: %w", key, err)
	}
	if q, ok := p.quarantined(key, pod); ok {
		p.publishQuarantined(key, pod, q)
		return 0, nil
	}
	if pod == nil {
		p.dropRestarts(key)
		if err := p.removePod(ctx, key, namespace, name, ""); !errors.Is(err, errTerminating) {
			return 0, err
		}
		return 0, nil
	}
	// A pod re-created under the same name has a new UID: the old one goes first.
	if err := p.removePod(ctx, key, namespace, name, string(pod.UID)); errors.Is(err, errTerminating) {
		return 0, nil
	} else if err != nil {
		return 0, err
	}
	p.mu.Lock()
	p.uids[key] = string(pod.UID)
	// Kept because the spec is gone from the store by the time a deleted pod is killed.
	p.ownGrace[key] = pod.Spec.TerminationGracePeriodSeconds
	p.mu.Unlock()

	rs, err := p.rt.GetPodStatus(ctx, string(pod.UID), pod.Name, pod.Namespace)
	if err != nil {
		p.publish(pod, nil, podstatus.Hints{RuntimeUnreachable: true}, "")
		return 0, fmt.Errorf("getting runtime status of pod %s: %w", key, err)
	}
	syncErr := p.syncOrRestart(ctx, key, pod, rs)
	after, err := p.rt.GetPodStatus(ctx, string(pod.UID), pod.Name, pod.Namespace)
	if err != nil {
		after = rs
	}
	p.publish(pod, after, podstatus.Hints{Waiting: waitingFrom(syncErr)}, definiteFrom(syncErr))

	var be *cri.BackoffError
	switch wait, ok := retryFrom(syncErr); {
	case syncErr == nil:
		return 0, nil
	case ok:
		// Image pulls in flight or in backoff come back on their own time.
		return wait, nil
	case errors.As(syncErr, &be):
		p.mu.Lock()
		p.backoffs++
		p.mu.Unlock()
		return be.Wait + 10*time.Millisecond, nil
	default:
		return 0, fmt.Errorf("syncing pod %s: %w", key, syncErr)
	}
}

// removePod kills every runtime pod named key whose UID is not keepUID.
func (p *Pool) removePod(ctx context.Context, key, namespace, name, keepUID string) error {
	refs, err := p.rt.ListPods(ctx)
	if err != nil {
		if keepUID != "" {
			return nil // cannot tell; the sync that follows reports the runtime error
		}
		return fmt.Errorf("listing runtime pods to remove %s: %w", key, err)
	}
	p.mu.Lock()
	grace := p.graceFor[key]
	if grace == nil {
		grace = p.ownGrace[key]
	}
	p.mu.Unlock()
	terminating := false
	listed := map[string]bool{}
	for _, ref := range refs {
		if ref.Namespace == namespace && ref.Name == name {
			listed[ref.UID] = true
		}
	}
	p.mu.Lock()
	for uid, k := range p.kills {
		if k.key == key && k.done && !listed[uid] {
			delete(p.kills, uid) // finished and gone from the runtime
		}
	}
	p.mu.Unlock()
	for _, ref := range refs {
		if ref.Namespace != namespace || ref.Name != name || ref.UID == keepUID {
			continue
		}
		if !safePathElement(ref.UID) {
			// Left by an older mqlet that trusted client uids: killing it
			// would remove <podDir>/<uid>, a path outside the pods dir.
			p.log.Error().Str("pod", key).Str("uid", ref.UID).Msg("a runtime pod has a uid that is not a single path element; not removing it: remove its sandbox by hand")
			continue
		}
		done, err := p.killAsync(ctx, key, ref, grace)
		if err != nil {
			return fmt.Errorf("removing pod %s (uid %s): %w", key, ref.UID, err)
		}
		if !done {
			terminating = true
			continue
		}
		uid := ref.UID
		p.backoff.Forget(func(k string) bool { return strings.HasPrefix(k, uid) })
	}
	if terminating {
		return errTerminating
	}
	if keepUID != "" {
		return nil
	}
	p.mu.Lock()
	delete(p.graceFor, key)
	delete(p.ownGrace, key)
	delete(p.uids, key)
	p.mu.Unlock()
	if err := p.status.Remove(namespace, name); err != nil {
		p.log.Warn().Err(err).Str("pod", key).Msg("clearing pod status")
	}
	p.observe.Observe(key, pending.Outcome{Gone: true})
	return nil
}

// safePathElement reports whether a runtime pod's uid can name a directory
// of its own.
func safePathElement(uid string) bool {
	return uid != "" && uid != "." && uid != ".." && !strings.ContainsAny(uid, "/\\\x00")
}

// publish sets the pod's status and tells the pending commands; definite,
// when set, is why the pod will not start without a change (an image the
// registry refused), which fails an apply at once.
func (p *Pool) publish(pod *v1.Pod, rs *cri.PodStatus, hints podstatus.Hints, definite string) {
	name, _ := p.rt.RuntimeInfo()
	hints.RuntimeName = name
	hints.HostIPs = p.opts.HostIPs
	if prev, ok := p.status.Get(pod.Namespace, pod.Name); ok && prev.UID == pod.UID && prev.Generation == pod.Generation {
		hints.Previous = &prev.Status
	}
	st := podstatus.Build(pod, rs, hints, time.Now())
	if err := p.status.Set(pod, st); err != nil {
		p.log.Warn().Err(err).Str("pod", pod.Namespace+"/"+pod.Name).Msg("publishing pod status")
	}
	done, ok, reason := podstatus.IsRunningOrDone(st, pod)
	if definite != "" && !done {
		done, ok, reason = true, false, definite
	}
	p.observe.Observe(pod.Namespace+"/"+pod.Name, pending.Outcome{Generation: pod.Generation, Done: done, OK: ok, Reason: reason})
}

// waitingFrom turns a sync error into the waiting reason of each container
// it concerns (a sync can fail for several containers at once).
func waitingFrom(err error) map[string]podstatus.Waiting {
	if err == nil {
		return nil
	}
	out := map[string]podstatus.Waiting{}
	var walk func(error)
	walk = func(err error) {
		switch e := err.(type) {
		case *cri.BackoffError:
			out[e.Container] = podstatus.Waiting{Reason: podstatus.ReasonCrashLoopBackOff, Message: e.Error()}
			return
		case *cri.ContainerError:
			out[e.Container] = podstatus.Waiting{Reason: e.Reason, Message: e.Error()}
			return
		case interface{ Unwrap() []error }:
			for _, inner := range e.Unwrap() {
				walk(inner)
			}
			return
		}
		if inner := errors.Unwrap(err); inner != nil {
			walk(inner)
		}
	}
	walk(err)
	return out
}

// retryFrom returns the soonest RetryAfter of a sync error when every
// failure in it carries one (pulls in flight or backing off) or is a
// crash-loop wait; ok is false when some failure needs the sync retry.
func retryFrom(err error) (wait time.Duration, ok bool) {
	if err == nil {
		return 0, false
	}
	found, all := false, true
	var walk func(error)
	walk = func(err error) {
		switch e := err.(type) {
		case *cri.BackoffError:
			if !found || e.Wait < wait {
				wait = e.Wait + 10*time.Millisecond
			}
			found = true
			return
		case *cri.ContainerError:
			if e.RetryAfter <= 0 {
				all = false
				return
			}
			if !found || e.RetryAfter < wait {
				wait = e.RetryAfter
			}
			found = true
			return
		case interface{ Unwrap() []error }:
			for _, inner := range e.Unwrap() {
				walk(inner)
			}
			return
		}
		if inner := errors.Unwrap(err); inner != nil {
			walk(inner)
			return
		}
		all = false
	}
	walk(err)
	var ce *cri.ContainerError
	if !errors.As(err, &ce) {
		return 0, false // crash-loop waits alone keep their own path
	}
	return wait, found && all
}

// definiteFrom returns the message of the first container error in err
// that no retry cures, or "".
func definiteFrom(err error) string {
	var msg string
	var walk func(error)
	walk = func(err error) {
		if msg != "" || err == nil {
			return
		}
		switch e := err.(type) {
		case *cri.ContainerError:
			if e.Definite {
				msg = "container " + e.Container + ": " + e.Reason + ": " + e.Err.Error()
			}
			return
		case interface{ Unwrap() []error }:
			for _, inner := range e.Unwrap() {
				walk(inner)
			}
			return
		}
		walk(errors.Unwrap(err))
	}
	walk(err)
	return msg
}
