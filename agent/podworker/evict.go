package podworker

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/mqlet/mqlet/agent/podstatus"
	"github.com/mqlet/mqlet/cri"
)

// ReasonEvicted is the kubelet's reason for a pod the eviction manager
// failed.
const ReasonEvicted = "Evicted"

// evictReleaseRetry is when an evicted pod whose emptyDirs could not be
// released yet is looked at again.
const evictReleaseRetry = 500 * time.Millisecond

// evictionsKey holds the evicted pods in the ledger: pod key → evicted.
const evictionsKey = "podworker/evictions"

// evicted is one pod version the eviction manager failed.
type evicted struct {
	UID     string `json:"uid"`
	Message string `json:"message"`
	Grace   int64  `json:"grace"`
	// Released says its emptyDirs were removed after the stop.
	Released bool `json:"released,omitempty"`
}

// evictions are the pods evicted, kept in the ledger (when there is one)
// so that a restarted mqlet does not run them again, and the callers
// waiting for each to be stopped.
type evictions struct {
	mu     sync.Mutex
	ledger Ledger
	loaded bool
	byKey  map[string]evicted
	done   map[string][]chan struct{}
}

func (e *evictions) loadLocked() {
	if e.loaded {
		return
	}
	e.loaded = true
	e.byKey = map[string]evicted{}
	e.done = map[string][]chan struct{}{}
	if e.ledger == nil {
		return
	}
	if raw, ok, err := e.ledger.Meta(evictionsKey); err == nil && ok {
		_ = json.Unmarshal(raw, &e.byKey) // a record that cannot be read evicts nothing
	}
}

func (e *evictions) saveLocked() error {
	if e.ledger == nil {
		return nil
	}
	raw, err := json.Marshal(e.byKey)
	if err != nil {
		return err
	}
	return e.ledger.SetMeta(evictionsKey, raw)
}

// add records the eviction and returns a channel closed once the pod is stopped.
func (e *evictions) add(key string, ev evicted) (<-chan struct{}, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.loadLocked()
	if old, ok := e.byKey[key]; !ok || old.UID != ev.UID {
		e.byKey[key] = ev
		if err := e.saveLocked(); err != nil {
			return nil, fmt.Errorf("recording the eviction of %s: %w", key, err)
		}
	}
	ch := make(chan struct{})
	e.done[key] = append(e.done[key], ch)
	return ch, nil
}

// get returns the eviction of the pod version uid; one of another uid is
// forgotten (the pod was replaced).
func (e *evictions) get(key, uid string) (evicted, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.loadLocked()
	ev, ok := e.byKey[key]
	if ok && ev.UID != uid {
		e.dropLocked(key)
		return evicted{}, false
	}
	return ev, ok
}

// stopped marks the pod's storage released and wakes the callers waiting.
func (e *evictions) stopped(key string, released bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if ev, ok := e.byKey[key]; ok && released && !ev.Released {
		ev.Released = true
		e.byKey[key] = ev
		_ = e.saveLocked() // at worst the emptyDirs are removed again
	}
	for _, ch := range e.done[key] {
		close(ch)
	}
	delete(e.done, key)
}

// drop forgets the pod's eviction (deleted or replaced).
func (e *evictions) drop(key string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.loadLocked()
	e.dropLocked(key)
}

func (e *evictions) dropLocked(key string) {
	for _, ch := range e.done[key] {
		close(ch)
	}
	delete(e.done, key)
	if _, ok := e.byKey[key]; ok {
		delete(e.byKey, key)
		_ = e.saveLocked()
	}
}

// Evict fails the pod for good with reason Evicted and message (as the
// kubelet's eviction manager does): its status is published Failed at
// once, it is stopped with gracePeriod seconds and never restarted, and
// its emptyDirs on disk are removed once it is stopped (ReleaseStorage),
// giving back what it used. It returns when the pod is stopped, or ctx
// ends. Deleting the pod, or applying it again as a new pod (a new uid),
// ends the eviction.
func (p *Pool) Evict(ctx context.Context, pod *v1.Pod, message string, gracePeriod int64) error {
	key := pod.Namespace + "/" + pod.Name
	done, err := p.evictions.add(key, evicted{UID: string(pod.UID), Message: message, Grace: gracePeriod})
	if err != nil {
		return err
	}
	p.queue.Add(key)
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("waiting for evicted pod %s to stop: %w", key, ctx.Err())
	}
}

// enforceEviction keeps an evicted pod failed: its status published
// Failed (Evicted), its restart requests answered, its containers stopped
// with the eviction's grace period, and once stopped its emptyDirs
// released. handled says the pod was evicted and must not be synced.
func (p *Pool) enforceEviction(life context.Context, r *runner, pod *v1.Pod, rs *cri.PodStatus, rsErr error) (handled bool, err error) {
	ev, ok := p.evictions.get(r.key, string(pod.UID))
	if !ok {
		return false, nil
	}
	if rsErr != nil {
		return true, fmt.Errorf("getting runtime status of evicted pod %s: %w", r.key, rsErr)
	}
	p.publish(pod, rs, podstatus.Hints{Terminal: true, FailReason: ReasonEvicted, FailMessage: ev.Message}, "")
	for {
		req, ok := p.takeRestart(r.key, string(pod.UID))
		if !ok {
			break
		}
		req.done(fmt.Errorf("pod %s is Failed (%s: %s) and is not restarted", r.key, ReasonEvicted, ev.Message))
	}
	if pr := p.opts.Probes; pr != nil {
		pr.Track(pod, rs)
	}
	if rs.Live() {
		stop := pod.DeepCopy()
		grace := ev.Grace
		stop.Spec.TerminationGracePeriodSeconds = &grace
		p.stopAsync(life, r, stop)
		return true, nil
	}
	released := ev.Released
	if !released && p.opts.ReleaseStorage != nil {
		if err := p.opts.ReleaseStorage(life, pod); err != nil {
			// Still stopping (the sandbox), or a file that would not go:
			// looked at again shortly; Evict keeps waiting meanwhile, so
			// the eviction manager does not see the pod's usage as still
			// there and evict another.
			p.log.Debug().Err(err).Str("pod", r.key).Msg("emptyDirs of an evicted pod not released yet")
			p.queue.AddAfter(r.key, evictReleaseRetry)
			return true, nil
		}
		released = true
	}
	p.evictions.stopped(r.key, released)
	return true, nil
}
