package cri

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/rs/zerolog"
	"k8s.io/klog/v2"
)

// services is one live connection to the CRI runtime. The connection
// hands it out wrapped (see instrumented.go): every call through it has a
// deadline, a classified error, a log line and a count.
type services struct {
	runtime runtimeClient
	image   imageClient
}

// dialFunc opens a connection; swapped in unit tests.
type dialFunc func(ctx context.Context, cfg Config) (*services, error)

// connection keeps the CRI connection alive and says whether it is usable.
type connection struct {
	cfg  Config
	log  zerolog.Logger
	dial dialFunc

	mu      sync.RWMutex
	svc     *services
	ready   bool
	name    string
	version string
	changed chan struct{} // closed (and replaced) whenever ready or version changes

	recheck chan struct{} // a call saw the runtime unavailable
	instr   *instrumentation
}

func newConnection(cfg Config, log zerolog.Logger, dial dialFunc) *connection {
	c := &connection{
		cfg:     cfg,
		log:     log,
		dial:    dial,
		changed: make(chan struct{}),
		recheck: make(chan struct{}, 1),
	}
	c.instr = newInstrumentation(cfg, log, c.askRecheck)
	return c
}

// askRecheck makes run check the runtime now (a call found it unavailable).
func (c *connection) askRecheck() {
	select {
	case c.recheck <- struct{}{}:
	default:
	}
}

// quietContext keeps the klog output of the Kubernetes helpers used on a
// call's path out of our logs; we log failures ourselves.
func quietContext(ctx context.Context) context.Context {
	return klog.NewContext(ctx, logr.Discard())
}

func dialCRI(ctx context.Context, cfg Config) (*services, error) {
	ctx, cancel := context.WithTimeout(quietContext(ctx), cfg.ConnectTimeout)
	defer cancel()
	// The socket is tried first: a runtime that is not there fails at
	// once with the socket's own error (no such file, refused) rather
	// than with gRPC's deadline after its redial attempts.
	if err := reachable(ctx, cfg.Endpoint); err != nil {
		return nil, fmt.Errorf("connect runtime service %s: %w", cfg.Endpoint, err)
	}
	rt, img, err := dialRemote(ctx, cfg.Endpoint, cfg.RequestTimeout)
	if err != nil {
		return nil, fmt.Errorf("connect runtime service %s: %w", cfg.Endpoint, err)
	}
	return &services{runtime: rt, image: img}, nil
}

// run connects, handshakes and re-checks until ctx ends, backing off
// exponentially between failed attempts.
func (c *connection) run(ctx context.Context) {
	defer c.drop(context.WithoutCancel(ctx), errors.New("stopped"))
	delay := c.cfg.RuntimeRetryMin
	for {
		err := c.check(ctx)
		wait := c.cfg.HealthInterval
		if err != nil {
			c.drop(ctx, err)
			// The failed handshake itself asked for a re-check: the
			// backoff decides when the next one is.
			select {
			case <-c.recheck:
			default:
			}
			wait = delay
			c.log.Warn().Err(err).Str("endpoint", c.cfg.Endpoint).Dur("retryIn", wait).Msg("container runtime unreachable")
			delay = min(delay*2, c.cfg.RuntimeRetryMax)
		} else {
			delay = c.cfg.RuntimeRetryMin
		}
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-c.recheck:
			timer.Stop()
		case <-timer.C:
		}
	}
}

// check dials when needed and performs the version handshake.
func (c *connection) check(ctx context.Context) error {
	c.mu.RLock()
	svc := c.svc
	c.mu.RUnlock()
	if svc == nil {
		raw, err := c.dial(ctx, c.cfg)
		if err != nil {
			return err
		}
		svc = c.instr.wrap(raw)
		c.mu.Lock()
		c.svc = svc
		c.mu.Unlock()
	}
	vctx, cancel := context.WithTimeout(ctx, c.cfg.ConnectTimeout)
	defer cancel()
	v, err := svc.runtime.Version(vctx, "v1")
	if err != nil {
		return fmt.Errorf("CRI version handshake with %s: %w", c.cfg.Endpoint, err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.ready || c.name != v.RuntimeName || c.version != v.RuntimeVersion {
		c.ready, c.name, c.version = true, v.RuntimeName, v.RuntimeVersion
		c.log.Info().Str("endpoint", c.cfg.Endpoint).Str("runtime", v.RuntimeName).
			Str("version", v.RuntimeVersion).Str("criVersion", v.RuntimeApiVersion).Msg("container runtime ready")
		c.signalLocked()
	}
	return nil
}

// drop forgets the connection so the next check dials afresh.
func (c *connection) drop(ctx context.Context, reason error) {
	c.mu.Lock()
	svc := c.svc
	c.svc = nil
	wasReady := c.ready
	c.ready = false
	if wasReady {
		c.log.Warn().Err(reason).Str("endpoint", c.cfg.Endpoint).Msg("container runtime not ready")
		c.signalLocked()
	}
	c.mu.Unlock()
	if svc != nil {
		_ = svc.runtime.Close(ctx)
		_ = svc.image.Close(ctx)
	}
}

func (c *connection) signalLocked() {
	close(c.changed)
	c.changed = make(chan struct{})
}

func (c *connection) isReady() bool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.ready
}

func (c *connection) info() (string, string) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.name, c.version
}

func (c *connection) changes() <-chan struct{} {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.changed
}

// get returns the live services or an error wrapping ErrUnavailable.
func (c *connection) get() (*services, error) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if !c.ready || c.svc == nil {
		return nil, fmt.Errorf("%w: %s is not connected", ErrUnavailable, c.cfg.Endpoint)
	}
	return c.svc, nil
}

// await returns the live services like get, but when the runtime is not
// ready it waits for it, for at most limit or until ctx ends. An
// operator's request (logs, exec, restart) that arrives while the agent
// is still connecting after a start or a runtime restart is served, not
// refused, once the connection comes up within that time.
func (c *connection) await(ctx context.Context, limit time.Duration) (*services, error) {
	timer := time.NewTimer(limit)
	defer timer.Stop()
	for {
		changed := c.changes()
		svc, err := c.get()
		if err == nil {
			return svc, nil
		}
		select {
		case <-changed:
		case <-timer.C:
			return nil, err
		case <-ctx.Done():
			return nil, err
		}
	}
}

// reachable opens and closes one connection to a unix socket endpoint;
// other endpoints are left to the gRPC client.
func reachable(ctx context.Context, endpoint string) error {
	path, ok := strings.CutPrefix(endpoint, "unix://")
	if !ok {
		return nil
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return err
	}
	return conn.Close()
}
