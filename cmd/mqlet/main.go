// Command mqlet is a small kubelet for edge gateways that takes its orders
// over MQTT. See README.md and configs/mqlet.yaml.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"syscall"

	"github.com/mqlet/mqlet/config"
	"github.com/mqlet/mqlet/internal/faultpoint"
	"github.com/mqlet/mqlet/internal/redact"
	"github.com/mqlet/mqlet/internal/version"
	"github.com/mqlet/mqlet/logging"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run returns the process exit code: 0 on a clean stop, 1 when mqlet
// failed while running, 2 for bad flags or configuration.
func run(args []string, stdout, stderr io.Writer) int {
	if code, ok := runSubcommand(args); ok {
		return code
	}
	check, args := splitCheckFlags(args)
	flags, err := config.ParseFlags("mqlet", args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, "mqlet:", err)
		return 2
	}
	if flags.Version {
		fmt.Fprintln(stdout, "mqlet", version.Version)
		return 0
	}
	if check.check {
		return checkConfig(flags, check, os.Getenv, stdout, stderr)
	}
	cfg, err := config.Load(flags, os.Getenv)
	if err != nil {
		fmt.Fprintln(stderr, "mqlet:", err)
		return 2
	}
	// Secret values are scrubbed from every log line; the store that knows
	// them is bound once it is open (runAgent).
	var secrets redact.Live
	// The level may change over MQTT (logLevel); the agent sets it.
	level, err := logging.NewLevel(cfg.LogLevel)
	if err != nil {
		fmt.Fprintln(stderr, "mqlet:", err)
		return 2
	}
	log := logging.NewLive(stderr, level, cfg.LogFormat, secrets.Current)
	logging.RouteKlog(log)
	if procs, ok := goMaxProcs(cfg.GoMaxProcs, os.Getenv); ok {
		runtime.GOMAXPROCS(procs)
	}
	if limit, ok := goMemLimit(cfg.GoMemLimit, os.Getenv); ok {
		debug.SetMemoryLimit(limit)
	}
	if pct, ok := goGC(cfg.GoGC, os.Getenv); ok {
		debug.SetGCPercent(pct)
	}
	if faultpoint.Armed() {
		log.Warn().Str("points", os.Getenv(faultpoint.Env)).Msg("fault points armed: mqlet kills itself when it reaches one (tests only)")
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if heapProfiler != nil {
		defer heapProfiler(ctx)()
	}
	if err := runAgent(ctx, cfg, config.Sources(flags, os.Getenv), log, level, &secrets); err != nil {
		log.Error().Err(err).Msg("mqlet stopped with an error")
		return 1
	}
	return 0
}

// heapProfiler is set by builds with -tags heapprofile (heapprofile.go):
// it writes a heap profile on SIGUSR1 until ctx ends, and its stop waits
// for that.
var heapProfiler func(ctx context.Context) (stop func())

// goMemLimit is the soft memory limit to set from the configuration: none
// when it asks for no limit or when the environment already says (Go read
// GOMEMLIMIT).
func goMemLimit(configured int64, getenv func(string) string) (int64, bool) {
	if configured <= 0 || getenv("GOMEMLIMIT") != "" {
		return 0, false
	}
	return configured, true
}

// goGC is the collector's percentage to set from the configuration: none
// when it asks for Go's default or when the environment already says (Go
// read GOGC).
func goGC(configured int, getenv func(string) string) (int, bool) {
	if configured <= 0 || getenv("GOGC") != "" {
		return 0, false
	}
	return configured, true
}

// goMaxProcs is the GOMAXPROCS to set from the configuration: none when it
// asks for Go's default or when the environment already says (Go read it).
func goMaxProcs(configured int, getenv func(string) string) (int, bool) {
	if configured <= 0 || getenv("GOMAXPROCS") != "" {
		return 0, false
	}
	return configured, true
}
