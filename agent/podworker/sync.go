package podworker

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/mqlet/mqlet/agent/pending"
	"github.com/mqlet/mqlet/agent/podstatus"
	"github.com/mqlet/mqlet/agent/store"
	"github.com/mqlet/mqlet/cri"
	"github.com/mqlet/mqlet/internal/faultpoint"
)

// errTerminating says a pod's old runtime pod is still terminating; the
// key is queued again when it is gone.
var errTerminating = errors.New("still terminating")

// work brings one pod to its desired state. It returns a delay after which
// the pod must be looked at again (crash-loop backoff), or an error for a
// retry with per-pod backoff. ctx ends when a delete cancels the work;
// life, when the pool stops (kills run on it, so a cancelled sync does
// not cut a termination short).
func (p *Pool) work(life, ctx context.Context, r *runner) (time.Duration, error) {
	key := r.key
	namespace, name, ok := strings.Cut(key, "/")
	if !ok {
		p.dropRunner(r)
		return 0, nil // not a pod key; dropping it is all we can do
	}
	pod, err := p.desired.DesiredPod(namespace, name)
	if err != nil {
		return 0, fmt.Errorf("reading desired pod %s: %w", key, err)
	}
	if q, ok := p.quarantined(r, pod); ok {
		return 0, p.publishQuarantined(ctx, r, pod, q)
	}
	if pod == nil {
		p.dropRestarts(r.key)
		p.evictions.drop(r.key)
		if err := p.removePod(life, ctx, r, namespace, name, ""); !errors.Is(err, errTerminating) {
			return 0, err
		}
		return 0, nil
	}
	// The slot's mark covers every runtime call made for a desired pod (the
	// listing included), since any of them may be what stops the agent.
	var after time.Duration
	// A pod this runner synced before goes before pods yet to start.
	err = p.withSlot(ctx, key, r.hasUID(string(pod.UID)), func(phase func(string)) error {
		// The pod's own status is read first: a pod whose containers are
		// all done is reported before anything else is asked of the
		// runtime (the listing of old runtime pods below, the sandbox stop).
		rs, rsErr := p.rt.GetPodStatus(ctx, string(pod.UID), pod.Name, pod.Namespace)
		// Past the read, what the sync does counts against the pod at a
		// death; a sync that could not read the runtime stays a read.
		synced := phaseRead
		if rsErr == nil {
			synced = phaseSync
		}
		phase(synced)
		// An evicted pod is failed for good: stopped, never synced again.
		if evicted, err := p.enforceEviction(life, r, pod, rs, rsErr); evicted || err != nil {
			return err
		}
		// A finished pod (its current spec ran to Succeeded or Failed, as
		// published) is stopped and never run again, even when the runtime
		// no longer lists the containers that ran.
		finished := rsErr == nil && p.publishIfDone(pod, rs)
		if finished && rs.Live() {
			// What is left (sidecars, the sandbox) is stopped beside
			// the slots: a sandbox stop takes about a second (the
			// network teardown), and finished pods holding every slot
			// kept the exits of other pods from being reported.
			p.stopAsync(life, r, pod)
			return nil
		}
		// A pod re-created under the same name has a new UID: the old one
		// goes first. Once the uid is known to be alone, later syncs of it
		// (resyncs, lifecycle events) skip the listing of every runtime pod.
		if !r.knownAlone(string(pod.UID)) {
			phase(phaseRead) // the listing; the kills it starts run beside the slot
			err := p.removePod(life, ctx, r, namespace, name, string(pod.UID))
			phase(synced)
			if errors.Is(err, errTerminating) {
				return nil
			} else if err != nil {
				return err
			}
		}
		// Kept because the spec is gone from the store by the time a deleted pod is killed.
		backoff := r.syncing(string(pod.UID), pod.Spec.TerminationGracePeriodSeconds)
		if failed, err := p.enforceDeadline(life, r, pod, rs); failed || err != nil {
			return err
		}
		after, err = p.syncPod(ctx, r, pod, backoff, rs, rsErr, finished)
		return err
	})
	return after, err
}

// publishIfDone publishes the status of a pod whose containers are all
// done before its sandbox is stopped (as kubelet does): the stop takes a
// few hundred milliseconds that the one waiting for the exit need not wait.
// It reports whether the pod is done.
func (p *Pool) publishIfDone(pod *v1.Pod, rs *cri.PodStatus) bool {
	st := p.build(pod, rs, podstatus.Hints{})
	if st.Phase != v1.PodSucceeded && st.Phase != v1.PodFailed {
		return false
	}
	p.set(pod, st, "")
	return true
}

// stopAsync stops what runs of the desired pod (containers in order, then
// the sandbox; nothing is removed) beside the sync slots, once at a time;
// the key is queued again when the stop ends, for the status after it (or,
// after a failed stop, for another try with a growing delay).
func (p *Pool) stopAsync(life context.Context, r *runner, pod *v1.Pod) {
	if !r.beginStop() {
		return
	}
	p.tasks.Add(1)
	go func() {
		defer p.tasks.Done()
		err := p.rt.StopPod(life, pod, p.events)
		retry := r.stopEnded(err, p.opts.BackoffBase, p.opts.BackoffMax)
		if life.Err() != nil {
			return
		}
		if err != nil {
			p.log.Warn().Err(err).Str("pod", r.key).Dur("retryIn", retry).Msg("stopping a finished pod")
		}
		p.queue.AddAfter(r.key, retry)
	}()
}

// syncPod is one sync of a desired pod, holding a slot, given the pod's
// runtime status read in the same slot (rs, or the error reading it);
// finished says its current spec has finished (cri.SyncInput.Finished).
func (p *Pool) syncPod(ctx context.Context, r *runner, pod *v1.Pod, backoff cri.RestartBackoff, rs *cri.PodStatus, err error, finished bool) (time.Duration, error) {
	key := pod.Namespace + "/" + pod.Name
	if err != nil {
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
		p.publishUnreachable(pod)
		return 0, fmt.Errorf("getting runtime status of pod %s: %w", key, err)
	}
	// Kills the agent in this pod's sync, past its runtime read (tests of
	// the poison-pod guard arm "podworker.syncing/<namespace>/<name>").
	faultpoint.Hit("podworker.syncing/" + key)
	in := cri.SyncInput{Pod: pod, Status: rs, Objects: p.desired, Backoff: backoff, Events: p.events, Finished: finished}
	if pr := p.opts.Probes; pr != nil {
		in.Probes = pr
	}
	syncErr := p.syncOrRestart(ctx, key, in)
	if ctx.Err() != nil {
		// A delete cancelled it: what it leaves is removed next, and a
		// status read now would be stale.
		return 0, ctx.Err()
	}
	after, err := p.rt.GetPodStatus(ctx, string(pod.UID), pod.Name, pod.Namespace)
	if err != nil {
		after = rs
	}
	hints := podstatus.Hints{Waiting: waitingFrom(syncErr)}
	var hold time.Duration
	if pr := p.opts.Probes; pr != nil {
		pr.Track(pod, after)
		hints.Probes = pr.States(string(pod.UID))
		hold = p.holdForFirstProbes(r, pod, pr)
	}
	if hold == 0 {
		p.publish(pod, after, hints, definiteFrom(syncErr))
	}
	retry, err := p.retryAfter(key, syncErr)
	if hold > 0 && err == nil && (retry == 0 || hold < retry) {
		retry = hold // the probes' first results queue the pod sooner
	}
	return retry, err
}

// retryAfter is when a pod is looked at again after a sync that ended
// with syncErr, or the error to retry it with backoff.
func (p *Pool) retryAfter(key string, syncErr error) (time.Duration, error) {
	var be *cri.BackoffError
	switch wait, ok := retryFrom(syncErr); {
	case syncErr == nil:
		return 0, nil
	case ok:
		// Image pulls in flight or in backoff come back on their own time.
		return wait, nil
	case errors.As(syncErr, &be):
		p.counters.backoffs.Add(1)
		return be.Wait + 10*time.Millisecond, nil
	default:
		return 0, fmt.Errorf("syncing pod %s: %w", key, syncErr)
	}
}

// holdForFirstProbes is how much longer the pod's status waits for the
// first run of its readiness and startup probes. After a restart of mqlet
// a running container's probes start over at not ready (not started), so a
// status published before they run would flip a ready pod to not ready
// for every subscriber and back a moment later. Only a pod this process
// has not published yet, whose status an earlier process left retained,
// is held, and for at most its probes' timeouts (plus a second) in all.
func (p *Pool) holdForFirstProbes(r *runner, pod *v1.Pod, pr Probes) time.Duration {
	if _, known := p.status.Get(pod.Namespace, pod.Name); known || !p.status.Retained(pod.Namespace, pod.Name) || !pr.Unchecked(string(pod.UID)) {
		return 0
	}
	return max(firstProbesWait(pod)-r.held(time.Now()), 0)
}

// firstProbesWait bounds how long the first runs of a pod's readiness and
// startup probes take: a container adopted at a start is probed at once.
func firstProbesWait(pod *v1.Pod) time.Duration {
	wait := time.Second
	for _, c := range slices.Concat(pod.Spec.InitContainers, pod.Spec.Containers) {
		for _, pr := range []*v1.Probe{c.StartupProbe, c.ReadinessProbe} {
			if pr == nil {
				continue
			}
			t := pr.TimeoutSeconds
			if t <= 0 {
				t = 1
			}
			wait += time.Duration(t) * time.Second
		}
	}
	return wait
}

// removePod kills every runtime pod named like r's pod whose UID is not
// keepUID; with keepUID "" the pod is then forgotten and reported gone.
func (p *Pool) removePod(life, ctx context.Context, r *runner, namespace, name, keepUID string) error {
	key := r.key
	refs, err := p.rt.ListPods(ctx)
	if err != nil {
		if keepUID != "" {
			return nil // cannot tell; the sync that follows reports the runtime error
		}
		return fmt.Errorf("listing runtime pods to remove %s: %w", key, err)
	}
	grace := r.grace()
	terminating := false
	var graceEnds time.Time // the latest of the terminations still running
	listed := map[string]bool{}
	for _, ref := range refs {
		if ref.Namespace == namespace && ref.Name == name {
			listed[ref.UID] = true
		}
	}
	r.pruneKills(listed)
	killed := false
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
		if pr := p.opts.Probes; pr != nil {
			pr.Forget(ref.UID)
		}
		deleted := keepUID == ""
		done, ends, err := p.killAsync(life, r, ref, grace, func() {
			if deleted {
				p.announceTermination(ref, grace)
			}
		})
		if err != nil {
			return fmt.Errorf("removing pod %s (uid %s): %w", key, ref.UID, err)
		}
		if !done {
			terminating = true
			if ends.After(graceEnds) {
				graceEnds = ends
			}
		}
		killed = true
	}
	if terminating {
		if keepUID == "" && !graceEnds.IsZero() {
			// A delete waiting on the pod waits for the grace period too.
			p.observe.Observe(key, pending.Outcome{Terminating: true, GraceEnds: graceEnds})
		}
		return errTerminating
	}
	if keepUID != "" {
		if killed {
			r.removed() // the old uid's termination took the delete's grace period
		} else {
			r.foundAlone(keepUID)
		}
		return nil
	}
	r.removed()
	if r.idle() {
		p.dropRunner(r)
	}
	if err := p.status.Remove(namespace, name); err != nil {
		p.log.Warn().Err(err).Str("pod", key).Msg("clearing pod status")
	}
	p.observe.Observe(key, pending.Outcome{Gone: true})
	return nil
}

// killAsync starts terminating the runtime pod ref (once) beside the sync
// slots and reports whether that has finished, with its error, or else
// when its grace period ends (zero if unknown). The key is
// queued again when it finishes.
func (p *Pool) killAsync(life context.Context, r *runner, ref cri.PodRef, grace *int64, starting func()) (bool, time.Time, error) {
	return r.killState(ref.UID, grace, func(k *kill) {
		starting()
		p.tasks.Add(1)
		go func() {
			defer p.tasks.Done()
			err := p.rt.KillPodByRef(life, ref, grace)
			// Killed here: the runtime pod is gone and the delete waiting
			// on it has no final reply yet.
			faultpoint.Hit("podworker.after-kill-pod")
			r.killFinished(k, err)
			p.queue.Add(r.key)
		}()
	})
}

// announceTermination makes a deleted pod's termination visible as the
// kubelet does, before its grace period runs: a Killing event for each
// container published running, and the pod published with its deletion
// timestamp (shown Terminating) until it is gone. It needs the pod as last
// published for that uid; a pod this process never published has only its
// runtime labels, and is not announced.
func (p *Pool) announceTermination(ref cri.PodRef, grace *int64) {
	pod, ok := p.status.Get(ref.Namespace, ref.Name)
	if !ok || string(pod.UID) != ref.UID {
		return
	}
	for _, cs := range pod.Status.ContainerStatuses {
		if cs.State.Running != nil {
			p.events.Event(pod, v1.EventTypeNormal, ReasonKilling, "Stopping container "+cs.Name)
		}
	}
	if pod.DeletionTimestamp == nil {
		now := metav1.NewTime(time.Now())
		pod.DeletionTimestamp = &now
		if grace != nil {
			pod.DeletionGracePeriodSeconds = grace
		} else {
			pod.DeletionGracePeriodSeconds = pod.Spec.TerminationGracePeriodSeconds
		}
	}
	if err := p.status.Set(pod, pod.Status); err != nil {
		p.log.Warn().Err(err).Str("pod", ref.Namespace+"/"+ref.Name).Msg("publishing the terminating pod")
	}
}

// safePathElement reports whether a runtime pod's uid can name a directory
// of its own.
func safePathElement(uid string) bool {
	return uid != "" && uid != "." && uid != ".." && !strings.ContainsAny(uid, "/\\\x00")
}

// quarantined reports whether pod must not be synced. A quarantine of an
// older spec or uid is lifted here.
func (p *Pool) quarantined(r *runner, pod *v1.Pod) (store.Quarantine, bool) {
	qs := p.opts.Quarantines
	if qs == nil {
		return store.Quarantine{}, false
	}
	q, ok, err := qs.GetQuarantine(r.key)
	if err != nil {
		p.log.Error().Err(err).Str("pod", r.key).Msg("reading quarantine; syncing the pod")
		return store.Quarantine{}, false
	}
	if !ok {
		return store.Quarantine{}, false
	}
	older := isOlderRule(q)
	if pod != nil && q.Covers(pod.UID, pod.Generation) && !older {
		return q, true
	}
	if err := qs.LiftQuarantine(r.key); err != nil {
		p.log.Error().Err(err).Str("pod", r.key).Msg("lifting quarantine")
	}
	r.quarantineLifted()
	switch {
	case pod == nil:
	case older && q.Covers(pod.UID, pod.Generation):
		p.log.Info().Str("pod", r.key).Msg("quarantine lifted: set by an older mqlet for one death with the pod's sync in flight, which proves nothing")
		p.events.Event(pod, v1.EventTypeNormal, ReasonQuarantineLifted, "quarantined by an older mqlet for one agent death during its sync, which proves nothing; syncing again")
	default:
		p.log.Info().Str("pod", r.key).Int64("generation", pod.Generation).Msg("quarantine lifted: the pod changed")
		p.events.Event(pod, v1.EventTypeNormal, ReasonQuarantineLifted, fmt.Sprintf("a new spec (generation %d) or uid was applied; syncing again", pod.Generation))
	}
	return store.Quarantine{}, false
}

// publishQuarantined reports a quarantined pod: its status with reason
// Quarantined, a Warning event once per process and spec, and a failed
// outcome for the commands waiting on it. The status is what the runtime
// says of the pod (read under a marked slot, as in a sync), so a pod whose
// containers run is reported running; when the agent died in this pod's
// runtime read, or the runtime cannot be read, it is the last status this
// process published, else phase Unknown: a running pod is never reported
// as not started, and the quarantine is always published.
func (p *Pool) publishQuarantined(ctx context.Context, r *runner, pod *v1.Pod, q store.Quarantine) error {
	msg := fmt.Sprintf("%s (at %s); not synced until a new spec is applied or the pod is re-created", q.Reason, q.Since.Format(time.RFC3339))
	if r.announce(pod.Generation) {
		p.events.Event(pod, v1.EventTypeWarning, ReasonQuarantined, q.Reason)
		p.log.Warn().Str("pod", r.key).Msg("pod is quarantined: " + msg)
	}
	var rs *cri.PodStatus
	readErr := errors.New("not read: the agent died in this pod's runtime read")
	if q.Phase != phaseRead {
		err := p.withSlot(ctx, r.key, true, func(func(string)) error {
			rs, readErr = p.rt.GetPodStatus(ctx, string(pod.UID), pod.Name, pod.Namespace)
			return nil
		})
		if err != nil {
			return err // ctx ended waiting for a slot
		}
	}
	var st v1.PodStatus
	switch prev, known := p.status.Get(pod.Namespace, pod.Name); {
	case readErr == nil:
		st = p.build(pod, rs, podstatus.Hints{})
	case known && prev.UID == pod.UID && prev.Generation == pod.Generation:
		st = prev.Status
	default:
		// Not read, and this process published nothing of this spec: the
		// phase is not known. Unknown says so and carries the quarantine;
		// keeping an earlier process's retained status hid the quarantine,
		// and a status built without the runtime says Pending of a pod
		// that may run.
		st = v1.PodStatus{Phase: v1.PodUnknown}
		msg += "; its runtime state was not read: " + readErr.Error()
	}
	st.Reason, st.Message = ReasonQuarantined, msg
	if err := p.status.Set(pod, st); err != nil {
		p.log.Warn().Err(err).Str("pod", r.key).Msg("publishing pod status")
	}
	p.observe.Observe(r.key, pending.Outcome{Generation: pod.Generation, Done: true, OK: false, Reason: ReasonQuarantined + ": " + q.Reason})
	return nil
}

// publishUnreachable reports that the runtime could not be read for pod:
// the last status this process published, not ready. A pod this process
// has not published yet whose status an earlier process left retained
// gets nothing new: the broker keeps that last known view (a fresh one,
// built without the runtime, would say Pending with no container to every
// subscriber at each start of mqlet) until the runtime is read.
func (p *Pool) publishUnreachable(pod *v1.Pod) {
	if _, known := p.status.Get(pod.Namespace, pod.Name); !known && p.status.Retained(pod.Namespace, pod.Name) {
		return
	}
	p.publish(pod, nil, podstatus.Hints{RuntimeUnreachable: true}, "")
}

// publish sets the pod's status and tells the pending commands; definite,
// when set, is why the pod will not start without a change (an image the
// registry refused), which fails an apply at once.
func (p *Pool) publish(pod *v1.Pod, rs *cri.PodStatus, hints podstatus.Hints, definite string) {
	p.set(pod, p.build(pod, rs, hints), definite)
}

// build is the pod's status from the runtime's, after the one published.
func (p *Pool) build(pod *v1.Pod, rs *cri.PodStatus, hints podstatus.Hints) v1.PodStatus {
	name, _ := p.rt.RuntimeInfo()
	hints.RuntimeName = name
	hints.HostIPs = p.opts.HostIPs
	if prev, ok := p.status.Get(pod.Namespace, pod.Name); ok && prev.UID == pod.UID && prev.Generation == pod.Generation {
		hints.Previous = &prev.Status
	}
	return podstatus.Build(pod, rs, hints, time.Now())
}

// set publishes st and tells the pending commands (see publish).
func (p *Pool) set(pod *v1.Pod, st v1.PodStatus, definite string) {
	if err := p.status.Set(pod, st); err != nil {
		p.log.Warn().Err(err).Str("pod", pod.Namespace+"/"+pod.Name).Msg("publishing pod status")
	}
	done, ok, reason := podstatus.IsRunningOrDone(st, pod)
	if definite != "" && !done {
		done, ok, reason = true, false, definite
	}
	p.observe.Observe(pod.Namespace+"/"+pod.Name, pending.Outcome{Generation: pod.Generation, Done: done, OK: ok, Reason: reason})
}
