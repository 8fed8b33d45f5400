package cri

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/rs/zerolog"
	v1 "k8s.io/api/core/v1"
)

// NodeEventer records events about the node itself.
type NodeEventer interface {
	NodeEvent(eventType, reason, message string)
}

// PreloadConfig says where image tarballs are dropped and how to import them.
type PreloadConfig struct {
	// Dir holds OCI (or docker save) image tarballs: *.tar, *.tar.gz, *.tgz.
	Dir string
	// Interval between rescans of Dir.
	Interval time.Duration
	// Ctr is containerd's ctr binary; CRI has no import call, so the
	// import goes to containerd itself, in the CRI plugin's namespace.
	Ctr string
	// Endpoint is the CRI endpoint (unix://<containerd socket>).
	Endpoint string
}

// Preloader imports the image tarballs of a directory into containerd at
// start and whenever one appears or changes (a gateway seeded from a USB
// stick or a side channel), with a node event per import.
type Preloader struct {
	cfg    PreloadConfig
	events NodeEventer
	log    zerolog.Logger
	run    func(ctx context.Context, name string, args ...string) ([]byte, error)
	seen   map[string]fileStamp
}

type fileStamp struct {
	size  int64
	mtime time.Time
}

// settle is how long a file must stay unchanged before it is imported, so
// a tarball still being copied in is not taken half-written.
const settle = 2 * time.Second

// NewPreloader returns a Preloader; Run starts it.
func NewPreloader(cfg PreloadConfig, events NodeEventer, log zerolog.Logger) *Preloader {
	if cfg.Interval <= 0 {
		cfg.Interval = 10 * time.Second
	}
	if cfg.Ctr == "" {
		cfg.Ctr = "ctr"
	}
	return &Preloader{cfg: cfg, events: events, log: log.With().Str("component", "preload").Logger(), seen: map[string]fileStamp{},
		run: func(ctx context.Context, name string, args ...string) ([]byte, error) {
			return exec.CommandContext(ctx, name, args...).CombinedOutput()
		}}
}

// Run scans the directory now and every interval until ctx ends.
func (p *Preloader) Run(ctx context.Context) error {
	socket, ok := strings.CutPrefix(p.cfg.Endpoint, "unix://")
	if !ok {
		return fmt.Errorf("image preload needs containerd on a unix socket, not %q", p.cfg.Endpoint)
	}
	t := time.NewTicker(p.cfg.Interval)
	defer t.Stop()
	for {
		p.scan(ctx, socket, time.Now())
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

var importedName = regexp.MustCompile(`unpacking (\S+) \(`)

func (p *Preloader) scan(ctx context.Context, socket string, now time.Time) {
	entries, err := os.ReadDir(p.cfg.Dir)
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			p.log.Warn().Err(err).Str("dir", p.cfg.Dir).Msg("reading the image preload directory")
		}
		return
	}
	for _, e := range entries {
		name := e.Name()
		if !strings.HasSuffix(name, ".tar") && !strings.HasSuffix(name, ".tar.gz") && !strings.HasSuffix(name, ".tgz") {
			continue
		}
		if !e.Type().IsRegular() { // no symlinks, devices or directories
			continue
		}
		info, err := e.Info()
		if err != nil {
			continue
		}
		stamp := fileStamp{size: info.Size(), mtime: info.ModTime()}
		if old, ok := p.seen[name]; ok && old == stamp || now.Sub(stamp.mtime) < settle {
			continue
		}
		p.seen[name] = stamp
		file := filepath.Join(p.cfg.Dir, name)
		start := time.Now()
		out, err := p.run(ctx, p.cfg.Ctr, "-a", socket, "-n", "k8s.io", "images", "import", file)
		if ctx.Err() != nil {
			delete(p.seen, name) // interrupted: again at the next start
			return
		}
		if err != nil {
			msg := strings.TrimSpace(string(out))
			if len(msg) > 512 {
				msg = msg[len(msg)-512:]
			}
			p.log.Warn().Err(err).Str("file", file).Str("output", msg).Msg("importing a preloaded image failed")
			p.events.NodeEvent(v1.EventTypeWarning, "ImagePreloadFailed", fmt.Sprintf("Failed to import %s: %v: %s", file, err, msg))
			continue
		}
		var images []string
		for _, m := range importedName.FindAllStringSubmatch(string(out), -1) {
			images = append(images, m[1])
		}
		p.log.Info().Str("file", file).Strs("images", images).Dur("took", time.Since(start)).Msg("imported preloaded images")
		p.events.NodeEvent(v1.EventTypeNormal, "ImagePreloaded", fmt.Sprintf("Imported %s from %s in %s", strings.Join(images, ", "), file, time.Since(start).Round(time.Millisecond)))
	}
}
