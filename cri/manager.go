package cri

import (
	"context"
	"sync"

	"github.com/rs/zerolog"
)

// Manager runs pods through a CRI runtime. It only ever touches sandboxes and
// containers carrying mqlet's labels.
type Manager struct {
	cfg         Config
	log         zerolog.Logger
	conn        *connection
	terminating terminations
	syncing     syncs
	// gcMu makes collections one at a time (each marks the syncs begun
	// since it started).
	gcMu     sync.Mutex
	puller   *imagePuller
	imageUse imageUses
	statfs   func(path string) (capacity, used int64, err error)
	// afterResolve, set only by tests, runs between resolving a hostPath's
	// existing ancestor and creating beneath it (where a pod would race).
	afterResolve func()
}

// NewManager returns a Manager for cfg (zero fields take the defaults).
// Nothing is contacted until Run is called.
func NewManager(cfg Config, log zerolog.Logger) *Manager {
	return newManager(cfg, log, dialCRI)
}

func newManager(cfg Config, log zerolog.Logger, dial dialFunc) *Manager {
	cfg = cfg.withDefaults()
	log = log.With().Str("component", "runtime").Logger()
	m := &Manager{cfg: cfg, log: log, conn: newConnection(cfg, log, dial), statfs: statfsUsage}
	m.puller = newImagePuller(m.pullImage, cfg.PullParallelism, cfg.PullTimeout, cfg.PullBackoffBase, cfg.PullBackoffMax, nil)
	return m
}

// Run keeps the connection to the runtime until ctx ends: it handshakes,
// re-checks periodically, and reconnects with exponential backoff.
// Image pulls in flight are cancelled when it returns.
func (m *Manager) Run(ctx context.Context) {
	defer m.puller.stop()
	m.conn.run(ctx)
}

// Ready reports whether the runtime answered the last handshake.
func (m *Manager) Ready() bool { return m.conn.isReady() }

// RuntimeInfo returns the runtime's name and version from the last handshake.
func (m *Manager) RuntimeInfo() (name, version string) { return m.conn.info() }

// Changes returns a channel closed the next time Ready or RuntimeInfo changes.
func (m *Manager) Changes() <-chan struct{} { return m.conn.changes() }
