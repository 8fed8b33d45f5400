// Command bench measures mqlet against a real mosquitto and a real
// containerd: footprint, memory at rest by pods, command intake, pod start latency next to raw CRI,
// an idle agent with pods, and container exit → status delay. It prints a
// report and writes it as JSON. test/run-bench.sh (make bench) prepares the
// containerd and the binary and runs it.
//
//	go run ./test/bench --cri-endpoint unix:///run/mqlet-bench/containerd.sock [--steps footprint,rss,intake,pods,idle,exit] [--duration 60s]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/rs/zerolog"
)

type options struct {
	mqlet         string
	mosquitto     string
	criEndpoint   string
	out           string
	workDir       string
	steps         []string
	duration      time.Duration
	intakeN       int
	starts        int
	singleRepeats int
	burst         int
	exitPods      int
	burstCommands int
	maxBacklog    int
	workers       int
	keep          bool
	brokerNoDelay bool
	intakeNoDelay bool
	unstripped    string
	logLevel      string
	probePods     bool
	rssPods       []int
}

var allSteps = []string{"footprint", "rss", "intake", "burst", "pods", "idle", "exit"}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func parseFlags(args []string, stderr io.Writer) (options, error) {
	var o options
	var steps, rssPods string
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.mqlet, "mqlet", "bin/mqlet", "the mqlet binary to measure")
	fs.StringVar(&o.unstripped, "unstripped", "", "an unstripped build of the same mqlet, for the size comparison when --mqlet is stripped")
	fs.StringVar(&o.mosquitto, "mosquitto", "/usr/sbin/mosquitto", "the mosquitto binary (a private broker is started)")
	fs.StringVar(&o.criEndpoint, "cri-endpoint", os.Getenv("MQLET_TEST_CRI_ENDPOINT"), "CRI endpoint of a containerd holding "+busyboxImage+" (default $MQLET_TEST_CRI_ENDPOINT)")
	fs.StringVar(&o.out, "out", "test/.work/bench.json", "where the JSON report is written")
	fs.StringVar(&o.workDir, "work-dir", "test/.work", "scratch space (state dirs, logs)")
	fs.StringVar(&steps, "steps", strings.Join(allSteps, ","), "steps to run, comma separated: "+strings.Join(allSteps, ","))
	fs.DurationVar(&o.duration, "duration", 60*time.Second, "idle window with the burst pods running")
	fs.IntVar(&o.intakeN, "intake-n", 500, "ConfigMap applies per intake variant")
	fs.IntVar(&o.starts, "starts", 5, "mqlet starts timed until online")
	fs.IntVar(&o.singleRepeats, "single-repeats", 5, "single-pod starts (deleted in between)")
	fs.IntVar(&o.burst, "burst", 20, "pods in the burst List")
	fs.IntVar(&o.burstCommands, "burst-commands", 2000, "applies in each burst (ConfigMaps, then pods), published without waiting")
	fs.IntVar(&o.maxBacklog, "mqlet-max-backlog", 0, "requests.maxBacklog for mqlet (0: its default)")
	fs.IntVar(&o.workers, "mqlet-workers", 0, "pods.workers (sync slots) for mqlet (0: its default)")
	fs.IntVar(&o.exitPods, "exit-pods", 10, "pods whose container exits, for the exit → status delay")
	fs.StringVar(&o.logLevel, "mqlet-log-level", "info", "mqlet's --log-level (debug gives a timeline of each step in the kept logs)")
	fs.StringVar(&rssPods, "rss-pods", "0,20,50", "pod counts at which the rss step reads mqlet's memory at rest, ascending")
	fs.BoolVar(&o.probePods, "probe-pods", false, "give the burst pods (and so the idle step) an exec liveness and an httpGet readiness probe every 10 s")
	fs.BoolVar(&o.keep, "keep", false, "keep the scratch dir (logs, state) even when every step passed")
	fs.BoolVar(&o.brokerNoDelay, "broker-tcp-nodelay", false, "set mosquitto's set_tcp_nodelay (off by default in mosquitto 2.0)")
	fs.BoolVar(&o.intakeNoDelay, "intake-nodelay-too", true, "repeat the intake through a second mosquitto with set_tcp_nodelay true")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	for _, s := range strings.Split(steps, ",") {
		s = strings.TrimSpace(s)
		if !slices.Contains(allSteps, s) {
			return o, fmt.Errorf("unknown step %q (known: %s)", s, strings.Join(allSteps, ","))
		}
		o.steps = append(o.steps, s)
	}
	for _, f := range strings.Split(rssPods, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 0 || len(o.rssPods) > 0 && n < o.rssPods[len(o.rssPods)-1] {
			return o, fmt.Errorf("--rss-pods %q: want ascending counts, e.g. 0,20,50", rssPods)
		}
		o.rssPods = append(o.rssPods, n)
	}
	if o.criEndpoint == "" {
		return o, errors.New("no CRI endpoint: pass --cri-endpoint or set MQLET_TEST_CRI_ENDPOINT (test/env/containerd-up.sh prints it)")
	}
	if o.intakeN < 1 || o.starts < 1 || o.singleRepeats < 1 || o.burst < 1 || o.exitPods < 1 || o.burstCommands < 1 || o.duration <= 0 {
		return o, errors.New("counts and --duration must be positive")
	}
	return o, nil
}

func run(args []string, stdout, stderr io.Writer) int {
	opts, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, "bench:", err)
		return 2
	}
	log := zerolog.New(zerolog.ConsoleWriter{Out: stderr, TimeFormat: "15:04:05.000"}).Level(zerolog.InfoLevel).With().Timestamp().Logger()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	rep, err := measure(ctx, opts, log)
	if err != nil {
		log.Error().Err(err).Msg("bench could not run")
		return 1
	}
	rep.print(stdout)
	if err := rep.write(opts.out); err != nil {
		log.Error().Err(err).Msg("writing the JSON report")
		return 1
	}
	fmt.Fprintf(stdout, "\nJSON report: %s\n", opts.out)
	if len(rep.Errors) > 0 {
		return 1
	}
	return 0
}

// measure runs the selected steps; a failed step is recorded in the report
// and the others still run when they can.
func measure(ctx context.Context, opts options, log zerolog.Logger) (rep *report, err error) {
	if err := os.MkdirAll(opts.workDir, 0o755); err != nil {
		return nil, fmt.Errorf("make %s: %w", opts.workDir, err)
	}
	if abs, err := filepath.Abs(opts.mqlet); err == nil {
		opts.mqlet = abs
	}
	e, err := newEnv(ctx, opts, log)
	if err != nil {
		return nil, err
	}
	rep = newReport(opts, e)
	defer func() {
		if len(rep.Errors) > 0 {
			e.opts.keep = true
			log.Warn().Str("dir", e.workDir).Msg("a step failed: logs and state kept")
		}
		if cerr := e.close(); cerr != nil {
			log.Error().Err(cerr).Msg("cleaning up")
			rep.fail("cleanup", cerr)
		}
	}()
	want := func(s string) bool { return slices.Contains(opts.steps, s) }

	if want("footprint") {
		log.Info().Msg("step footprint")
		fp, err := e.footprint(ctx)
		rep.Footprint = fp
		rep.fail("footprint", err)
	}
	if !want("rss") && !want("intake") && !want("burst") && !want("pods") && !want("idle") && !want("exit") {
		return rep, nil
	}
	if err := e.bringUp(ctx); err != nil {
		rep.fail("start mqlet", err)
		return rep, nil
	}
	if want("rss") {
		// First, while the agent holds nothing but these pods.
		log.Info().Ints("pods", opts.rssPods).Msg("step rss")
		r, err := e.rssByPods(ctx)
		rep.RSS = r
		rep.fail("rss", err)
	}
	if want("intake") {
		log.Info().Int("commands", opts.intakeN).Msg("step intake")
		in, err := e.intake(ctx)
		rep.Intake = in
		rep.fail("intake", err)
	}
	if want("burst") {
		log.Info().Int("commands", opts.burstCommands).Msg("step burst")
		b, err := e.burst(ctx)
		rep.Burst = b
		rep.fail("burst", err)
	}
	var running []string
	if want("pods") {
		log.Info().Msg("step pods")
		ps, names, err := e.podStart(ctx)
		rep.PodStart, running = ps, names
		rep.fail("pods", err)
		if err != nil && names != nil {
			if derr := e.deletePods(ctx, names); derr != nil {
				log.Error().Err(derr).Msg("deleting the burst pods")
			}
			running = nil
		}
	} else if want("idle") {
		names, items := e.burstPods()
		if _, err := e.applyPods(ctx, listOf(items), names, "Running", true); err != nil {
			rep.fail("idle: starting the burst pods", err)
		} else {
			running = names
		}
	}
	if want("idle") && running != nil {
		log.Info().Dur("window", opts.duration).Int("pods", len(running)).Msg("step idle")
		id, err := e.idle(ctx, running)
		rep.Idle = id
		rep.fail("idle", err)
	}
	if running != nil {
		log.Info().Int("pods", len(running)).Msg("step delete: deleting the burst pods")
		var rawStop time.Duration
		if rep.PodStart != nil {
			rawStop = rep.PodStart.rawStop
		}
		del, err := e.deleteRunning(ctx, running, rawStop)
		rep.Delete = del
		rep.fail("deleting the burst pods", err)
	}
	if want("exit") {
		log.Info().Int("pods", opts.exitPods).Msg("step exit")
		ex, err := e.exitDelay(ctx)
		rep.Exit = ex
		rep.fail("exit", err)
	}
	return rep, nil
}
