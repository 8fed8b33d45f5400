// Package faultpoint lets a test kill the agent at a named point of its
// work, so a fault test lands exactly where it means to instead of racing a
// timer. The points come from the environment variable MQLET_FAULTPOINTS,
// read once: a comma-separated list of "name" (kill at the first time the
// point is reached) or "name@N" (at the N-th time). Reaching a listed point
// SIGKILLs the process, the same as an operator's kill -9 or the OOM killer:
// no deferred function runs and nothing is flushed. A point listed with the
// suffix "!panic" ("name!panic", "name@N!panic") instead crashes the Go
// runtime with an unrecovered panic in a goroutine the caller starts, as a
// bug in code the caller ran would. Without the variable, Hit costs a map
// lookup in an empty map.
//
// The set is fixed at start (environment only, never from MQTT), so it is
// not state a command can change.
package faultpoint

import (
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
)

// Env is the variable that names the points.
const Env = "MQLET_FAULTPOINTS"

type point struct {
	at    int64 // the hit that kills (1 = the first)
	panic bool  // crash the Go runtime instead of SIGKILL
	hits  atomic.Int64
}

// points is parsed from the environment on first use and never changed
// afterwards (only each point's hit count moves).
var points = sync.OnceValue(func() map[string]*point { return parse(os.Getenv(Env)) })

func parse(spec string) map[string]*point {
	out := map[string]*point{}
	for _, item := range strings.Split(spec, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		item, crash := strings.CutSuffix(item, "!panic")
		name, count, found := strings.Cut(item, "@")
		at := int64(1)
		if found {
			n, err := strconv.ParseInt(count, 10, 64)
			if err != nil || n < 1 {
				continue // a malformed count names no point
			}
			at = n
		}
		out[name] = &point{at: at, panic: crash}
	}
	return out
}

// Hit kills the process when name is a listed point reached for the
// listed time; otherwise it returns at once.
func Hit(name string) {
	p, ok := points()[name]
	if !ok {
		return
	}
	if p.hits.Add(1) == p.at {
		if p.panic {
			// Unrecovered in a goroutine of its own: the traceback names
			// the caller's goroutine as its creator.
			go func() { panic("faultpoint " + name) }()
			select {}
		}
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // the signal is on its way; nothing after the point may run
	}
}

// Armed reports whether any point is listed (for a start-up log line).
func Armed() bool { return len(points()) > 0 }
