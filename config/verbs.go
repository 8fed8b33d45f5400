package config

import (
	"time"

	apiv1 "github.com/mqlet/mqlet/api/v1"
)

// Logs bounds the logs verb.
type Logs struct {
	// MaxChunkBytes bounds one message of a logs reply; a larger log is sent
	// as numbered in_progress chunks (at most requests.maxReplyBytes).
	MaxChunkBytes int `json:"maxChunkBytes"`
	// MaxBytes bounds one logs reply that sets no limitBytes.
	MaxBytes int64 `json:"maxBytes"`
	// MaxFollow caps followSeconds of a followed log.
	MaxFollow Duration `json:"maxFollow"`
	// MaxBytesPerSecond is the rate at which log bytes are published, per
	// request, so a chatty container cannot flood the broker.
	MaxBytesPerSecond int64 `json:"maxBytesPerSecond"`
	// UnreadTimeout ends a followed log whose requester said nothing on
	// the request's input topic for this long.
	UnreadTimeout Duration `json:"unreadTimeout"`
}

// Exec is the exec verb: off unless enabled.
type Exec struct {
	Enabled bool `json:"enabled"`
	// DefaultTimeout applies when a request gives no timeoutSeconds;
	// MaxTimeout caps the ones that do.
	DefaultTimeout Duration `json:"defaultTimeout"`
	MaxTimeout     Duration `json:"maxTimeout"`
	// MaxOutputBytes bounds stdout and stderr each in the reply; more is cut
	// and the reply says so.
	MaxOutputBytes int `json:"maxOutputBytes"`
	// IdleTimeout ends an interactive session (exec -it) without input
	// or output for this long; MaxSessionsPerRequester bounds the
	// sessions of one signing key (every unsigned command counts as one
	// requester).
	IdleTimeout             Duration `json:"idleTimeout"`
	MaxSessionsPerRequester int      `json:"maxSessionsPerRequester"`
}

// Events is the persisted event history (get {"kind":"Event"}).
type Events struct {
	History int `json:"history"`
}

func defaultLogs() Logs {
	return Logs{MaxChunkBytes: 256 << 10, MaxBytes: 64 << 20, MaxFollow: Duration{10 * time.Minute}, MaxBytesPerSecond: 2 << 20, UnreadTimeout: Duration{30 * time.Second}}
}

func defaultExec() Exec {
	return Exec{DefaultTimeout: Duration{30 * time.Second}, MaxTimeout: Duration{10 * time.Minute}, MaxOutputBytes: 32 << 10, IdleTimeout: Duration{15 * time.Minute}, MaxSessionsPerRequester: 2}
}

func (c *Config) validateVerbs(bad func(field, format string, args ...any)) {
	l := c.Logs
	if l.MaxChunkBytes < 4096 || l.MaxChunkBytes > c.Requests.MaxReplyBytes {
		bad("logs.maxChunkBytes", "must be between 4096 and requests.maxReplyBytes (%d), got %d", c.Requests.MaxReplyBytes, l.MaxChunkBytes)
	}
	if l.MaxBytes < 1 || l.MaxBytes > 1<<30 {
		bad("logs.maxBytes", "must be between 1 and 1073741824, got %d", l.MaxBytes)
	}
	if l.MaxFollow.Duration < time.Second || l.MaxFollow.Duration > 24*time.Hour {
		bad("logs.maxFollow", "must be between 1s and 24h, got %s", l.MaxFollow.Duration)
	}
	if min := 3 * apiv1.InputInterval; l.UnreadTimeout.Duration < min || l.UnreadTimeout.Duration > time.Hour {
		bad("logs.unreadTimeout", "must be between %s (three of a reader's %s heartbeats) and 1h, got %s", min, apiv1.InputInterval, l.UnreadTimeout.Duration)
	}
	if l.MaxBytesPerSecond < 1024 || l.MaxBytesPerSecond > 1<<30 {
		bad("logs.maxBytesPerSecond", "must be between 1024 and 1073741824, got %d", l.MaxBytesPerSecond)
	}
	e := c.Exec
	if e.DefaultTimeout.Duration < time.Second || e.DefaultTimeout.Duration > e.MaxTimeout.Duration {
		bad("exec.defaultTimeout", "must be at least 1s and at most exec.maxTimeout, got %s", e.DefaultTimeout.Duration)
	}
	if e.MaxTimeout.Duration < time.Second || e.MaxTimeout.Duration > time.Hour {
		bad("exec.maxTimeout", "must be between 1s and 1h, got %s", e.MaxTimeout.Duration)
	}
	// Output is escaped into a JSON reply: the cap leaves room for that.
	if e.MaxOutputBytes < 0 || e.MaxOutputBytes > c.Requests.MaxReplyBytes/4 {
		bad("exec.maxOutputBytes", "must be between 0 and requests.maxReplyBytes/4 (%d), got %d", c.Requests.MaxReplyBytes/4, e.MaxOutputBytes)
	}
	if e.IdleTimeout.Duration < 10*time.Second || e.IdleTimeout.Duration > 24*time.Hour {
		bad("exec.idleTimeout", "must be between 10s and 24h, got %s", e.IdleTimeout.Duration)
	}
	if e.MaxSessionsPerRequester < 1 || e.MaxSessionsPerRequester > 64 {
		bad("exec.maxSessionsPerRequester", "must be between 1 and 64, got %d", e.MaxSessionsPerRequester)
	}
	if c.Events.History < 0 || c.Events.History > 100000 {
		bad("events.history", "must be between 0 (none kept) and 100000, got %d", c.Events.History)
	}
	if c.Requests.MaxStreams < 1 || c.Requests.MaxStreams > 256 {
		bad("requests.maxStreams", "must be between 1 and 256, got %d", c.Requests.MaxStreams)
	}
	if r := c.Requests; r.MaxFollows < 1 || r.MaxFollows >= max(r.MaxStreams, 2) {
		bad("requests.maxFollows", "must be between 1 and requests.maxStreams-1 (%d), got %d", r.MaxStreams-1, r.MaxFollows)
	}
	if r := c.Requests; r.MaxFollowsPerRequester < 1 || r.MaxFollowsPerRequester > r.MaxFollows {
		bad("requests.maxFollowsPerRequester", "must be between 1 and requests.maxFollows (%d), got %d", r.MaxFollows, r.MaxFollowsPerRequester)
	}
}
