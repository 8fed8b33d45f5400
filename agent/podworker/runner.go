package podworker

import (
	"context"
	"sync"
	"time"

	"github.com/mqlet/mqlet/agent/restart"
	"github.com/mqlet/mqlet/cri"
)

// runner is one pod's state across syncs (the shape of kubelet's
// podSyncStatus): the runtime uid it runs, the grace periods that apply to
// its termination, its crash-loop tracker, the cancel function of its sync
// in flight and its runtime pods being killed. It lives from the pod's
// first sync or delete until its runtime pods are gone and it is no longer
// desired.
type runner struct {
	key    string
	policy restart.Policy

	mu          sync.Mutex
	uid         string           // runtime uid last synced; "" before the first sync
	restarts    *restart.Tracker // crash-loop backoff of uid's containers
	ownGrace    *int64           // the pod's terminationGracePeriodSeconds, kept for after its spec is gone
	deleteGrace *int64           // grace period asked by a delete command
	told        int64            // generation whose quarantine this process announced
	cancel      context.CancelFunc
	kills       map[string]*kill // runtime pod uid → its termination, running or finished
	stopping    bool             // a stop of the desired pod's containers and sandbox runs beside the slots
	stopsFailed int              // stops failed in a row, for their retry delay
	// alone is the uid whose runtime pods were listed and found to be the
	// only ones of the pod's name: syncs of that uid need not list again.
	alone    string
	deadline time.Time // when deadlineTimer fires
	// heldSince is when this process first held back the pod's status
	// for its first probe results (holdForFirstProbes; zero before).
	heldSince time.Time
	// deadlineTimer queues the pod at its activeDeadlineSeconds; stopped
	// when the runner is dropped or the pool stops.
	deadlineTimer *time.Timer
}

// kill is one runtime pod being terminated outside the sync slots: a pod
// that ignores SIGTERM holds its termination for its whole grace period,
// and with a slot waiting, as many such pods as slots stopped every other
// pod's sync on the node (starts, restarts, deletes) for that long.
type kill struct {
	done bool
	err  error
	// graceEnds is when the grace period given at its start ends (zero
	// when the grace period is not known here: the runtime then uses the
	// one recorded on each container).
	graceEnds time.Time
}

func newRunner(key string, policy restart.Policy) *runner {
	return &runner{key: key, policy: policy, kills: map[string]*kill{}}
}

// begin records the cancel function of the work starting on the pod; a
// delete asked before it cancels it at once.
func (r *runner) begin(cancel context.CancelFunc) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cancel = cancel
}

func (r *runner) end() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cancel = nil
}

// deleteRequested records a delete's grace period and cancels the sync in
// flight (the pod is already gone from the desired state, so the work that
// follows removes it; work that starts later reads that state afresh).
func (r *runner) deleteRequested(grace *int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.deleteGrace = grace
	if r.cancel != nil {
		r.cancel()
	}
}

func (r *runner) hasUID(uid string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.uid == uid
}

// syncing records the pod about to be synced and returns the restart
// tracker of its uid (a new one when the uid changed: a re-created pod
// starts its crash-loop count afresh).
func (r *runner) syncing(uid string, grace *int64) cri.RestartBackoff {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.uid != uid || r.restarts == nil {
		r.uid, r.restarts = uid, restart.New(r.policy, nil)
	}
	r.ownGrace = grace
	return r.restarts
}

// grace is the grace period of the pod's termination: the delete
// command's, else the pod's own.
func (r *runner) grace() *int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.deleteGrace != nil {
		return r.deleteGrace
	}
	return r.ownGrace
}

// removed records that the runtime pods a delete asked to remove are
// gone: its grace period no longer applies.
func (r *runner) removed() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.deleteGrace = nil
}

// announce reports whether the quarantine of generation is to be announced
// (once per process and spec).
func (r *runner) announce(generation int64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	first := r.told != generation
	r.told = generation
	return first
}

func (r *runner) quarantineLifted() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.told = 0
}

// killState returns the termination of runtime pod uid, starting it with
// start (and grace, nil if unknown) when there is none; done and err are
// its outcome once finished, when it is forgotten; until then graceEnds is
// when its grace period ends.
func (r *runner) killState(uid string, grace *int64, start func(k *kill)) (done bool, graceEnds time.Time, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	k, ok := r.kills[uid]
	if !ok {
		k = &kill{}
		if grace != nil {
			k.graceEnds = time.Now().Add(time.Duration(*grace) * time.Second)
		}
		r.kills[uid] = k
		start(k)
	}
	if !k.done {
		return false, k.graceEnds, nil
	}
	delete(r.kills, uid)
	return true, time.Time{}, k.err
}

func (r *runner) killFinished(k *kill, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	k.done, k.err = true, err
}

// knownAlone reports whether uid was found alone in the runtime, with no
// termination of an older runtime pod still tracked.
func (r *runner) knownAlone(uid string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.alone == uid && len(r.kills) == 0
}

func (r *runner) foundAlone(uid string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.alone = uid
}

// beginStop reports whether a stop of the desired pod may start (none runs).
func (r *runner) beginStop() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopping {
		return false
	}
	r.stopping = true
	return true
}

// stopEnded records the outcome of the stop and returns the delay before
// the pod is looked at again: none after a stop that worked, else growing
// from base to max with each stop failed in a row.
func (r *runner) stopEnded(err error, base, max time.Duration) time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stopping = false
	if err == nil {
		r.stopsFailed = 0
		return 0
	}
	d := base << min(r.stopsFailed, 20)
	r.stopsFailed++
	if d <= 0 || d > max {
		d = max
	}
	return d
}

// pruneKills forgets finished terminations of runtime pods no longer listed.
func (r *runner) pruneKills(listed map[string]bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for uid, k := range r.kills {
		if k.done && !listed[uid] {
			delete(r.kills, uid)
		}
	}
}

// idle reports whether nothing of the pod is left to track.
func (r *runner) idle() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.kills) == 0 && !r.stopping
}

// armDeadline makes the runner's timer call fire at at (once; a timer
// already set for at is kept).
func (r *runner) armDeadline(at time.Time, fire func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.deadlineTimer != nil {
		if r.deadline.Equal(at) {
			return
		}
		r.deadlineTimer.Stop()
	}
	r.deadline, r.deadlineTimer = at, time.AfterFunc(time.Until(at), fire)
}

// stopDeadline stops the runner's deadline timer.
func (r *runner) stopDeadline() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.deadlineTimer != nil {
		r.deadlineTimer.Stop()
	}
	r.deadline, r.deadlineTimer = time.Time{}, nil
}

// held is how long this process has held back the pod's status for its
// first probe results; the first call starts the hold.
func (r *runner) held(now time.Time) time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.heldSince.IsZero() {
		r.heldSince = now
	}
	return now.Sub(r.heldSince)
}
