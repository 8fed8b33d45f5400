// Package logging builds mqlet's zerolog logger and routes the klog output of
// Kubernetes libraries into it.
package logging

import (
	"fmt"
	"io"
	"os"
	"time"

	"github.com/go-logr/logr"
	"github.com/rs/zerolog"
	"golang.org/x/term"
	"k8s.io/klog/v2"

	"github.com/mqlet/mqlet/internal/redact"
)

// New returns a logger writing to out: JSON, or human-readable console output
// when format is "console" or "auto" and out is a terminal. Every line goes
// through scrub's current Scrubber (nil: none), so no secret value the node
// holds reaches the log, whatever part of mqlet or of a library wrote it.
func New(out io.Writer, level, format string, scrub func() *redact.Scrubber) (zerolog.Logger, error) {
	lvl, err := NewLevel(level)
	if err != nil {
		return zerolog.Nop(), err
	}
	return NewLive(out, lvl, format, scrub), nil
}

// NewLive is New with a level that may change while it runs: the logger
// and every logger derived from it write the lines at or above level's
// current value.
func NewLive(out io.Writer, level *Level, format string, scrub func() *redact.Scrubber) zerolog.Logger {
	if scrub == nil {
		scrub = func() *redact.Scrubber { return nil }
	}
	// Scrubbed as written: the console form quotes values unescaped.
	var w io.Writer = redact.NewWriter(out, scrub)
	if format == "console" || (format == "auto" && isTerminal(out)) {
		w = zerolog.ConsoleWriter{Out: w, TimeFormat: time.TimeOnly}
	}
	// The logger's own level is the lowest; the sampler holds the real one.
	return zerolog.New(w).Level(zerolog.TraceLevel).Sample(level).Hook(millisecondTime{})
}

// millisecondTime stamps each line with its time to the millisecond
// (zerolog's own timestamp has whole seconds unless its process-wide format
// is changed): the steps of one pod sync are milliseconds apart.
type millisecondTime struct{}

func (millisecondTime) Run(e *zerolog.Event, _ zerolog.Level, _ string) {
	e.Str(zerolog.TimestampFieldName, time.Now().UTC().Format("2006-01-02T15:04:05.000Z07:00"))
}

func isTerminal(out io.Writer) bool {
	f, ok := out.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// RouteKlog sends everything Kubernetes libraries log through klog to log.
// klog is process-global, so this is called once from main.
func RouteKlog(log zerolog.Logger) {
	klog.SetLogger(logr.New(&klogSink{log: log.With().Str("component", "klog").Logger()}))
}

// klogSink adapts zerolog to logr for klog.
type klogSink struct {
	log  zerolog.Logger
	name string
}

func (s *klogSink) Init(logr.RuntimeInfo) {}

// Enabled maps klog verbosity onto zerolog: V(0) is info, V(1+) is debug.
func (s *klogSink) Enabled(level int) bool {
	if level > 0 {
		return Enabled(&s.log, zerolog.DebugLevel)
	}
	return Enabled(&s.log, zerolog.InfoLevel)
}

func (s *klogSink) Info(level int, msg string, kv ...any) {
	ev := s.log.Info()
	if level > 0 {
		ev = s.log.Debug()
	}
	s.fields(ev, kv).Msg(msg)
}

func (s *klogSink) Error(err error, msg string, kv ...any) {
	s.fields(s.log.Error().Err(err), kv).Msg(msg)
}

func (s *klogSink) fields(ev *zerolog.Event, kv []any) *zerolog.Event {
	if s.name != "" {
		ev = ev.Str("logger", s.name)
	}
	for i := 0; i+1 < len(kv); i += 2 {
		ev = ev.Interface(fmt.Sprint(kv[i]), kv[i+1])
	}
	return ev
}

func (s *klogSink) WithValues(kv ...any) logr.LogSink {
	ctx := s.log.With()
	for i := 0; i+1 < len(kv); i += 2 {
		ctx = ctx.Interface(fmt.Sprint(kv[i]), kv[i+1])
	}
	return &klogSink{log: ctx.Logger(), name: s.name}
}

func (s *klogSink) WithName(name string) logr.LogSink {
	n := name
	if s.name != "" {
		n = s.name + "/" + name
	}
	return &klogSink{log: s.log, name: n}
}
