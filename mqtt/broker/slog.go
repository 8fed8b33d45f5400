package broker

import (
	"context"
	"log/slog"

	"github.com/rs/zerolog"
)

// newSlogLogger routes mochi's slog output into zerolog. mochi's Info lines
// (one per client connect/disconnect) are demoted to Debug so a busy broker
// does not flood the agent's log.
func newSlogLogger(log zerolog.Logger) *slog.Logger {
	return slog.New(&zerologHandler{log: log})
}

type zerologHandler struct {
	log    zerolog.Logger
	attrs  []slog.Attr
	prefix string
}

func level(l slog.Level) zerolog.Level {
	switch {
	case l >= slog.LevelError:
		return zerolog.ErrorLevel
	case l >= slog.LevelWarn:
		return zerolog.WarnLevel
	default:
		return zerolog.DebugLevel
	}
}

func (h *zerologHandler) Enabled(_ context.Context, l slog.Level) bool {
	// Asked of an event, not GetLevel: mqlet's level may be a sampler
	// (logLevel changed live, see logging.Level).
	e := h.log.WithLevel(level(l))
	if e == nil {
		return false
	}
	e.Discard()
	return true
}

func (h *zerologHandler) Handle(_ context.Context, r slog.Record) error {
	ev := h.log.WithLevel(level(r.Level))
	for _, a := range h.attrs {
		ev = ev.Any(h.prefix+a.Key, a.Value.Any())
	}
	r.Attrs(func(a slog.Attr) bool {
		ev = ev.Any(h.prefix+a.Key, a.Value.Any())
		return true
	})
	ev.Msg(r.Message)
	return nil
}

func (h *zerologHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	next := *h
	next.attrs = append(append([]slog.Attr(nil), h.attrs...), attrs...)
	return &next
}

func (h *zerologHandler) WithGroup(name string) slog.Handler {
	next := *h
	next.prefix = h.prefix + name + "."
	return &next
}
