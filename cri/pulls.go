package cri

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"time"

	"k8s.io/client-go/util/flowcontrol"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/utils/clock"

	"github.com/mqlet/mqlet/internal/imagepolicy"
)

// ImagePulled is sent on the PLEG channel for each pod that waited on a
// pull once the pull has ended, so the pod is synced again at once.
const ImagePulled PodLifecycleEventType = "ImagePulled"

// pullWork is one pull as the puller runs it: the image, the credentials to
// try in order (nil: anonymous) and the sandbox config to pass along.
type pullWork struct {
	image   string
	auths   []*runtimeapi.AuthConfig
	sandbox *runtimeapi.PodSandboxConfig
}

// pullFunc pulls with one credential and returns the image reference and size.
type pullFunc func(ctx context.Context, w pullWork, auth *runtimeapi.AuthConfig) (ref string, size uint64, err error)

// imagePull is one pull in flight or just ended, shared by every pod that
// needs the same image with the same credentials.
type imagePull struct {
	image    string
	key      string    // image and credentials
	queued   time.Time // asked for
	began    time.Time // got a pull slot
	finished time.Time
	done     chan struct{}
	ref      string
	size     uint64
	err      error
	waiters  map[string]bool // pod uids that have not yet seen the result
}

// pullFailure is the last failed pull of an image for one pod with one set
// of credentials.
type pullFailure struct {
	at       time.Time
	err      error
	definite bool
	told     bool // the pod was already told of this backoff
}

// imagePuller runs image pulls outside the pod syncs: a sync asks for an
// image and returns at once while the pull runs in the background with
// bounded parallelism and a deadline; the pods that wait are woken when it
// ends. Failures back off per pod, image and credentials (doubling from
// base to max), as the kubelet keys its backoff by pod uid and image: a pod
// re-applied with other pull secrets, or whose secret was fixed, makes a new
// attempt at once instead of waiting out a backoff earned by a credential
// it no longer uses. It is owned by the Manager; stop ends it.
type imagePuller struct {
	pull     pullFunc
	slots    chan struct{}
	timeout  time.Duration
	clock    clock.Clock
	backoff  *flowcontrol.Backoff
	maxDelay time.Duration
	wake     chan string

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu       sync.Mutex
	pulls    map[string]*imagePull   // by image and credentials
	failures map[string]*pullFailure // by backoffKey
}

func newImagePuller(pull pullFunc, parallel int, timeout, base, maxDelay time.Duration, clk clock.Clock) *imagePuller {
	if clk == nil {
		clk = clock.RealClock{}
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &imagePuller{
		pull: pull, slots: make(chan struct{}, max(parallel, 1)), timeout: timeout, clock: clk,
		backoff: flowcontrol.NewFakeBackOff(base, maxDelay, clk), maxDelay: maxDelay, wake: make(chan string, 256),
		ctx: ctx, cancel: cancel, pulls: map[string]*imagePull{}, failures: map[string]*pullFailure{},
	}
}

// stop cancels the pulls in flight and waits for them to end.
func (p *imagePuller) stop() {
	p.cancel()
	p.wg.Wait()
}

// pullState is what one pod's sync learns about its image.
type pullState int

const (
	pullStarted pullState = iota // a pull began (or the pod joined one); wait for the wake
	pullWaiting                  // still pulling; already told
	pullDone                     // result holds the pulled image
	pullFailed                   // result holds the failure this pod has not seen yet
	pullBackOff                  // the image is in backoff; wait
)

type pullResult struct {
	state    pullState
	pull     *imagePull
	wait     time.Duration // pullBackOff: how long still
	err      error         // pullFailed, pullBackOff: the registry's error
	definite bool          // the error will not go away by retrying
	announce bool          // pullBackOff: first time this pod hears of this backoff
}

// request says where pod uid stands with image (key: image and
// credentials) and starts a pull when one is due.
func (p *imagePuller) request(uid, key string, w pullWork) pullResult {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.clock.Now()
	for k, pl := range p.pulls {
		if pl.isDone() && len(pl.waiters) == 0 && now.Sub(pl.finished) > pullReuse {
			delete(p.pulls, k)
		}
	}
	if pl, ok := p.pulls[key]; ok {
		if !pl.isDone() {
			if pl.waiters[uid] {
				return pullResult{state: pullWaiting, pull: pl}
			}
			pl.waiters[uid] = true
			return pullResult{state: pullStarted, pull: pl}
		}
		waited := pl.waiters[uid]
		delete(pl.waiters, uid)
		switch {
		case pl.err == nil && (waited || now.Sub(pl.finished) <= pullReuse):
			return pullResult{state: pullDone, pull: pl}
		case pl.err != nil && waited:
			return pullResult{state: pullFailed, pull: pl, err: pl.err, definite: definitePullError(pl.err)}
		}
	}
	bk := backoffKey(uid, key)
	if f := p.failures[bk]; f != nil && p.backoff.IsInBackOffSinceUpdate(bk, now) {
		wait := p.backoff.Get(bk) - now.Sub(f.at)
		announce := !f.told
		f.told = true
		return pullResult{state: pullBackOff, wait: max(wait, 0), err: f.err, definite: f.definite, announce: announce}
	}
	if p.ctx.Err() != nil {
		return pullResult{state: pullWaiting} // stopping: no new pulls
	}
	pl := &imagePull{image: w.image, key: key, queued: now, done: make(chan struct{}), waiters: map[string]bool{uid: true}}
	p.pulls[key] = pl
	p.wg.Add(1)
	go p.run(pl, w)
	return pullResult{state: pullStarted, pull: pl}
}

// pullReuse is how long a finished pull serves pods that did not wait on
// it (the other containers of a pod using the same image, with Always).
const pullReuse = 5 * time.Second

func (pl *imagePull) isDone() bool {
	select {
	case <-pl.done:
		return true
	default:
		return false
	}
}

// take returns the finished, successful pull of image that pod uid waited
// on, if any, and stops its wait (the pod found the image present first).
func (p *imagePuller) take(uid, image string) *imagePull {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, pl := range p.pulls {
		if pl.image == image && pl.waiters[uid] && pl.isDone() && pl.err == nil {
			delete(pl.waiters, uid)
			return pl
		}
	}
	return nil
}

// backoffKey is what a pull backs off by: the pod, the image and the
// credentials (key, as pullKey makes it).
func backoffKey(uid, key string) string { return uid + "\x00" + key }

// forget drops what pod uid waits for and its backoffs (the pod is gone).
func (p *imagePuller) forget(uid string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, pl := range p.pulls {
		delete(pl.waiters, uid)
	}
	for bk := range p.failures {
		if strings.HasPrefix(bk, uid+"\x00") {
			delete(p.failures, bk)
			p.backoff.Reset(bk)
		}
	}
}

func (p *imagePuller) run(pl *imagePull, w pullWork) {
	defer p.wg.Done()
	var ref string
	var size uint64
	err := func() error {
		select {
		case p.slots <- struct{}{}:
		case <-p.ctx.Done():
			return p.ctx.Err()
		}
		defer func() { <-p.slots }()
		p.mu.Lock()
		pl.began = p.clock.Now()
		p.mu.Unlock()
		ctx, cancel := context.WithTimeout(p.ctx, p.timeout)
		defer cancel()
		var errs error
		// As the kubelet: every matching credential in turn; anonymous
		// only when none matches.
		for _, auth := range w.auths {
			var err error
			if ref, size, err = p.pull(ctx, w, auth); err == nil {
				return nil
			}
			if ctx.Err() == context.DeadlineExceeded {
				err = fmt.Errorf("%w (pull deadline %s)", err, p.timeout)
			}
			errs = errors.Join(errs, err)
		}
		return errs
	}()
	p.mu.Lock()
	now := p.clock.Now()
	pl.finished, pl.ref, pl.size, pl.err = now, ref, size, err
	// Every pod that waited on this pull earned its backoff (or lost it).
	for uid := range pl.waiters {
		bk := backoffKey(uid, pl.key)
		if err != nil {
			p.backoff.Next(bk, now)
			p.failures[bk] = &pullFailure{at: now, err: err, definite: definitePullError(err)}
		} else {
			p.backoff.Reset(bk)
			delete(p.failures, bk)
		}
	}
	p.backoff.GC()
	for bk, f := range p.failures {
		if now.Sub(f.at) > 2*p.maxDelay {
			delete(p.failures, bk) // GC dropped its backoff too
		}
	}
	close(pl.done)
	waiters := make([]string, 0, len(pl.waiters))
	for uid := range pl.waiters {
		waiters = append(waiters, uid)
	}
	p.mu.Unlock()
	for _, uid := range waiters {
		select {
		case p.wake <- uid:
		default: // the waiter's own retry timer still comes
		}
	}
}

// definitePullError reports whether a pull failed in a way no retry cures
// without a change (credentials, image name): the registry refused the
// credentials or does not have the image. Anything else (connection
// refused, timeouts, 5xx) is taken as transient.
func definitePullError(err error) bool {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrUnavailable) {
		return false
	}
	msg := strings.ToLower(err.Error())
	for _, s := range []string{"401 unauthorized", "403 forbidden", "unauthorized", "denied", "manifest unknown", ": not found", "name unknown", "invalid reference format", imagepolicy.ErrNotAllowed.Error()} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}

// pullError is a failed pull as it is published (events, the container's
// status, the apply's reply): what went wrong, as a class, and the
// registry's host, never the registry's own words. An image may name any
// host; one that is no registry answers with its banner or page, which
// would otherwise come back to whoever asked. errors.Is still sees the
// cause (deadlines, cancellation, an unavailable runtime).
type pullError struct {
	image, registry, class string
	cause                  error
}

func newPullError(image string, cause error) error {
	reg, err := imagepolicy.Registry(image)
	if err != nil {
		reg = "(unparsable reference)"
	}
	return &pullError{image: image, registry: reg, class: pullErrorClass(cause), cause: cause}
}

func (e *pullError) Error() string {
	return fmt.Sprintf("failed to pull image %q from registry %s: %s", e.image, e.registry, e.class)
}

func (e *pullError) Is(target error) bool { return errors.Is(e.cause, target) }

var httpStatus = regexp.MustCompile(`\b([1-5][0-9][0-9]) [A-Z][A-Za-z ]*`)

// pullErrorClass names what a pull error is, in words of mqlet's own.
func pullErrorClass(err error) string {
	switch {
	case errors.Is(err, imagepolicy.ErrNotAllowed):
		return err.Error() // mqlet's own words
	case errors.Is(err, context.Canceled):
		return "cancelled"
	case errors.Is(err, context.DeadlineExceeded):
		return "timed out"
	case errors.Is(err, ErrUnavailable):
		return "the container runtime is unavailable"
	}
	msg := strings.ToLower(err.Error())
	for _, c := range []struct{ substr, class string }{
		{"401 unauthorized", "401 Unauthorized"},
		{"403 forbidden", "403 Forbidden"},
		{"denied", "access denied"},
		{"manifest unknown", "not found"},
		{"name unknown", "not found"},
		{"404 not found", "not found"},
		{": not found", "not found"},
		{"invalid reference format", "invalid reference format"},
		{"connection refused", "connection refused"},
		{"no such host", "no such host"},
		{"network is unreachable", "network is unreachable"},
		{"no route to host", "no route to host"},
		{"i/o timeout", "timed out"},
		{"deadline exceeded", "timed out"},
		{"server gave http response to https client", "TLS error (the server speaks plain HTTP)"},
		{"x509:", "TLS error (certificate)"},
		{"tls:", "TLS error"},
		{"malformed http", "not an HTTP registry (malformed answer)"},
		{"transport connection broken", "not an HTTP registry (malformed answer)"},
		{"connection reset", "connection reset"},
		{"eof", "connection closed by the registry"},
	} {
		if strings.Contains(msg, c.substr) {
			return c.class
		}
	}
	if m := httpStatus.FindStringSubmatch(err.Error()); m != nil {
		return "registry answered status " + m[1]
	}
	return "the registry's answer is not a usable image (see mqlet's log)"
}
