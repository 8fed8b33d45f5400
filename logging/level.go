package logging

import (
	"fmt"
	"sync/atomic"

	"github.com/rs/zerolog"
)

// Level is a log level that may change while mqlet runs (logLevel set over
// MQTT). A logger from New carries it as its sampler, so every logger
// derived from it follows a change at once, and a line below the level is
// never built (zerolog asks the sampler before it starts an event).
type Level struct {
	v atomic.Int32
}

// NewLevel parses level ("info").
func NewLevel(level string) (*Level, error) {
	l := &Level{}
	if err := l.Set(level); err != nil {
		return nil, err
	}
	return l, nil
}

// Set changes the level.
func (l *Level) Set(level string) error {
	lvl, err := zerolog.ParseLevel(level)
	if err != nil || level == "" {
		return fmt.Errorf("parsing log level %q: %w", level, errOr(err))
	}
	l.v.Store(int32(lvl))
	return nil
}

func errOr(err error) error {
	if err != nil {
		return err
	}
	return fmt.Errorf("empty")
}

// Get is the level in force.
func (l *Level) Get() zerolog.Level { return zerolog.Level(l.v.Load()) }

// Sample lets through a line at or above the level (zerolog.Sampler).
// NoLevel lines (Log()) always pass, as zerolog's own level lets them.
func (l *Level) Sample(lvl zerolog.Level) bool {
	return lvl >= l.Get() || lvl == zerolog.NoLevel
}

// Enabled reports whether log writes a line at lvl.
func Enabled(log *zerolog.Logger, lvl zerolog.Level) bool {
	e := log.WithLevel(lvl)
	if e == nil {
		return false
	}
	e.Discard()
	return true
}
