package podworker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/mqlet/mqlet/cri"
)

// A restart request (the restart verb) is carried out by the worker that
// owns the pod's key, so it never races the pod's own sync: the request is
// queued here, the key is queued, and the next sync of the key restarts
// instead of syncing.

// Restarter is the runtime's restart of a pod or one of its containers.
type Restarter interface {
	RestartPod(ctx context.Context, pod *v1.Pod, status *cri.PodStatus, container, why string, objects cri.ObjectSource, backoff cri.RestartBackoff, events cri.EventRecorder) error
}

// Bounds of the restart requests waiting for their worker.
const (
	maxRestartsPerPod = 4
	maxRestarts       = 64
)

// ErrTooManyRestarts refuses a restart request while too many wait.
var ErrTooManyRestarts = errors.New("too many restart requests waiting")

type restartRequest struct {
	uid       string // the pod the request was made for
	container string // "" for the whole pod
	why       string
	deadline  time.Time
	done      func(error) // called once, from the worker; must not block
}

// restarts are the requests waiting for their pod's worker.
type restarts struct {
	mu      sync.Mutex
	waiting map[string][]restartRequest
	n       int
}

// RequestRestart asks for the pod with key (and uid, so a re-created pod is
// not restarted by an old request) to be restarted, or only its app
// container when container is set. why goes into the Killing events. done
// is called with the outcome once the new containers were started, or when
// the request was dropped (past deadline, pod gone); it must not block.
func (p *Pool) RequestRestart(key, uid, container, why string, deadline time.Time, done func(error)) error {
	r := &p.restarts
	r.mu.Lock()
	if r.waiting == nil {
		r.waiting = map[string][]restartRequest{}
	}
	if r.n >= maxRestarts || len(r.waiting[key]) >= maxRestartsPerPod {
		r.mu.Unlock()
		return fmt.Errorf("%w (at most %d per pod, %d in all)", ErrTooManyRestarts, maxRestartsPerPod, maxRestarts)
	}
	r.waiting[key] = append(r.waiting[key], restartRequest{uid: uid, container: container, why: why, deadline: deadline, done: done})
	r.n++
	r.mu.Unlock()
	p.queue.Add(key)
	return nil
}

// takeRestart removes and returns the next live request for key; requests
// past their deadline or for another uid are answered and dropped.
func (p *Pool) takeRestart(key, uid string) (restartRequest, bool) {
	r := &p.restarts
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	for len(r.waiting[key]) > 0 {
		req := r.waiting[key][0]
		r.waiting[key] = r.waiting[key][1:]
		r.n--
		switch {
		case req.uid != uid:
			req.done(fmt.Errorf("pod %s was deleted or re-created before it could be restarted", key))
		case now.After(req.deadline):
			req.done(fmt.Errorf("pod %s was not restarted before the deadline", key))
		default:
			if len(r.waiting[key]) > 0 {
				p.queue.Add(key) // the next request after this sync
			}
			return req, true
		}
	}
	delete(r.waiting, key)
	return restartRequest{}, false
}

// syncOrRestart syncs pod, or restarts it when a restart request waits.
func (p *Pool) syncOrRestart(ctx context.Context, key string, in cri.SyncInput) error {
	req, ok := p.takeRestart(key, string(in.Pod.UID))
	if !ok {
		return p.rt.SyncPod(ctx, in)
	}
	rt, can := p.rt.(Restarter)
	if !can {
		err := errors.New("this runtime cannot restart pods")
		req.done(err)
		return p.rt.SyncPod(ctx, in)
	}
	err := rt.RestartPod(ctx, in.Pod, in.Status, req.container, req.why, in.Objects, in.Backoff, in.Events)
	req.done(err)
	return err
}

// dropRestarts answers every request waiting for key: its pod is gone.
func (p *Pool) dropRestarts(key string) {
	r := &p.restarts
	r.mu.Lock()
	reqs := r.waiting[key]
	delete(r.waiting, key)
	r.n -= len(reqs)
	r.mu.Unlock()
	for _, req := range reqs {
		req.done(fmt.Errorf("pod %s is no longer desired", key))
	}
}
