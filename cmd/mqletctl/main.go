// Command mqletctl is the operator CLI of mqlet: it commands an mqlet agent
// over MQTT (apply, delete, sync, get) and reads what the agent publishes
// (status, watch), like kubectl does against an API server.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/mqlet/mqlet/internal/version"
)

// Exit codes.
const (
	exitOK    = 0
	exitFail  = 1 // the command failed, timed out or the broker was unreachable
	exitUsage = 2 // bad command line
	// exitQueued: the node is offline; the command waits at the broker.
	exitQueued = 3
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], env{getenv: os.Getenv, stdin: os.Stdin, stdout: os.Stdout, stderr: os.Stderr, now: time.Now}))
}

// env is what a run touches outside its arguments, swapped in tests.
type env struct {
	getenv func(string) string
	stdin  io.Reader
	stdout io.Writer
	stderr io.Writer
	now    func() time.Time
}

// command is one subcommand: it parses its own flags and runs.
// command is one subcommand: it parses its own flags and runs. summary says
// what it does in one line; helpTexts gives its synopsis and example (a
// command without one is listed with its summary as the synopsis).
type command struct {
	name    string
	summary string
	run     func(ctx context.Context, cfg *globalConfig, args []string, e env) error
}

func commands() []command {
	return []command{
		{"apply", "send manifests; wait for the agent's verdict", runApply},
		{"delete", "delete what a manifest names, or one object", runDelete},
		{"sync", "replace the node's whole desired state with a List", runSync},
		{"get", "list objects or the event history of a node, or every node under the prefix", runGet},
		{"describe", "show a pod in detail: spec, status, conditions, containers, volumes, its kept events", runDescribe},
		{"top", "resource usage from the node's latest metrics message", runTop},
		{"status", "online/offline, boot id, node readiness, capacity", runStatus},
		{"watch", "print updates until Ctrl-C", runWatch},
		{"sign", "print a command signed with --sign-key, for mosquitto_pub", runSign},
		{"keys", "new Ed25519 signing key (show: of --sign-key); prints the node's trustedKeys entry", runKeys},
		{"certs", "fleet CA and mTLS certificates; says where each goes", runCerts},
		{"logs", "print a container's log (-f follows)", runLogs},
		{"exec", "run a command in a container (if the agent allows exec)", runExec},
		{"restart", "kill and start again a pod, or one container", runRestart},
		{"config", "the agent's settings and their sources; change a live one", runConfig},
		{"group", "publish a group's retained desired state (members offline or joining later get it); status: who applied which generation", runGroup},
		{"rollout", "roll manifests out to a group or a node selector in waves; status, resume, abort", runRollout},
		{"completion", "print a shell completion script", runCompletion},
		{"version", "print the mqletctl version", runVersion},
	}
}

// helpText is what `help CMD` and `CMD --help` print besides the flags.
type helpText struct {
	synopsis string // usage line(s), after "mqletctl "
	example  string // indented example lines
}

func helpTexts() map[string]helpText {
	return map[string]helpText{
		"apply": {"apply -f FILE|DIR|- [--no-wait] [--group G | -L SELECTOR]",
			"  mqletctl apply -f web.yaml --node gw1\n  mqletctl apply -f manifests/    # every .yaml, .yml and .json file, in name order\n" +
				"  mqletctl apply -f web.yaml --group line-1    # one row per member: NODE PHASE MESSAGE AGE\n" +
				"  mqletctl apply -f web.yaml -L site=plant-3   # one command per node whose labels match"},
		"delete": {"delete -f FILE|DIR|- | delete KIND NAME [-n NS] [--grace-period N] [--group G | -L SELECTOR] | delete node NAME [--force]",
			"  mqletctl delete pod web -n default\n  mqletctl delete -f web.yaml    # every object in the file\n" +
				"  mqletctl delete node gw7          # decommission: clear its retained state, node and pod topics"},
		"sync": {"sync -f FILE|- [--no-wait] [--group G | -L SELECTOR]",
			"  mqletctl sync -f desired.yaml\n  mqletctl sync -f line.yaml --group line-1    # replaces the group's objects on every member"},
		"get": {"get pods|configmaps|secrets|nodes|all [NAME] [-n NS] [-l SELECTOR] [-o json|yaml|wide|name] [-w] [--group G | -L SELECTOR]\n  " +
			"mqletctl get events [--for pod/NAME|node/NAME] [-n NS] [-o json|yaml]",
			"  mqletctl get pods -n default -l app=web\n  mqletctl get nodes\n  mqletctl get pods -w\n" +
				"  mqletctl get events --for pod/web -n default    # the node's kept event history, oldest first\n" +
				"  mqletctl get pods --group line-1    # every member's pods, with a NODE column\n  mqletctl get nodes --group line-1"},
		"describe": {"describe pod NAME [-n NS]",
			"  mqletctl describe pod web -n default"},
		"top": {"top node | top pods [-n NS]",
			"  mqletctl top pods -n default"},
		"status": {"status [-o json|yaml]",
			"  mqletctl status --node gw1 || echo offline"},
		"watch": {"watch [pods|events|all] [--count N] [-o json]",
			"  mqletctl watch events --count 10"},
		"sign": {"sign VERB -f FILE [--request-id ID]",
			"  mqletctl sign apply -f web.yaml --sign-key op.key"},
		"keys": {"keys generate [--out FILE] | keys show --sign-key FILE",
			"  mqletctl keys generate --out op.key"},
		"certs": {"certs ca|broker --host H|node NAME|operator [--dir D]",
			"  mqletctl certs ca && mqletctl certs node gw1"},
		"logs": {"logs POD [-c CONTAINER] [-n NS] [-f [--follow-for D]] [-p] [--tail N] [--since D] [--limit-bytes N] [--timestamps] [--group G | -L SELECTOR]",
			"  mqletctl logs web --tail 20\n  mqletctl logs web -c sidecar -f    # Ctrl-C stops following (the agent is told to cancel)\n" +
				"  mqletctl logs web --tail 5 --group line-1    # each member's lines, prefixed [node]"},
		"exec": {"exec [-it] POD [-c CONTAINER] [-n NS] [--command-timeout D] -- COMMAND [ARG...]",
			"  mqletctl exec web -- cat /etc/hostname    # exits with the command's exit code\n" +
				"  mqletctl exec -it web -- sh               # an interactive terminal over MQTT (raw mode: Ctrl-C goes to the shell)"},
		"restart": {"restart pod NAME [-c CONTAINER] [-n NS] [--group G | -L SELECTOR]",
			"  mqletctl restart pod web\n  mqletctl restart pod web -c main    # only this container\n  mqletctl restart pod web --group line-1"},
		"rollout": {"rollout start -f FILE (--group G | -L SELECTOR) --batch N|N% [--growth F] [--max-failures N|N%] [--min-executed M] [--node-timeout D] [--rollback] [--id ID] [--detach]\n  " +
			"mqletctl rollout status|resume ID [--force] | rollout abort ID [--rollback] [--reason R] | rollout list",
			"  mqletctl rollout start -f web-v2.yaml --group line-1 --batch 2 --rollback --id web-v2\n" +
				"  mqletctl rollout start -f web-v2.yaml -L site=plant-3 --batch 10% --growth 2 --max-failures 5% --min-executed 10\n" +
				"  mqletctl rollout status web-v2    # the retained document <prefix>/rollouts/web-v2\n" +
				"  mqletctl rollout resume web-v2    # from any machine, after the first mqletctl stopped\n" +
				"  mqletctl rollout abort web-v2 --rollback\n  mqletctl rollout list    # every rollout document under the prefix"},
		"group": {"group publish GROUP -f FILE|DIR|- [--generation N] [--no-wait] [-o json]\n  " +
			"mqletctl group status GROUP [-o json|yaml]",
			"  mqletctl group publish line-1 -f line.yaml    # generation: one above the newest; one row per member\n" +
				"  mqletctl group publish line-1 -f line.yaml --generation 12 --sign-key op.key\n" +
				"  mqletctl group status line-1    # NODE STATE APPLIED PHASE: Applied, Behind, Pending (offline)"},
		"config": {"config view | config set KEY=VALUE... (KEY=null resets it)",
			"  mqletctl config view\n  mqletctl config set metricsInterval=2s logLevel=debug"},
		"completion": {"completion bash|zsh",
			"  mqletctl completion bash > /etc/bash_completion.d/mqletctl\n  source <(mqletctl completion bash)"},
		"version": {"version",
			"  mqletctl version"},
	}
}

// help returns the command's help text, made from its summary line when
// none is written.
func (c command) help() (synopsis, summary, example string) {
	if h, ok := helpTexts()[c.name]; ok {
		return h.synopsis, c.summary, h.example
	}
	return c.summary, c.name, ""
}

func findCommand(name string) (command, bool) {
	for _, c := range commands() {
		if c.name == name {
			return c, true
		}
	}
	return command{}, false
}

// run executes one command line and returns the exit code.
func run(ctx context.Context, args []string, e env) int {
	cfg := newGlobalConfig(e.getenv)
	cfg.now = e.now
	top := flag.NewFlagSet("mqletctl", flag.ContinueOnError)
	top.SetOutput(io.Discard)
	top.Usage = func() {}
	cfg.register(top)
	registerFleetOn(top, &cfg.fleet)
	showVersion := top.Bool("version", false, "print the version and exit")
	if err := top.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			usage(e.stdout, top)
			return exitOK
		}
		return badUsage(e, flagError(err, args), "")
	}
	if *showVersion {
		fmt.Fprintln(e.stdout, "mqletctl", version.Version)
		return exitOK
	}
	rest := top.Args()
	if len(rest) == 0 {
		usage(e.stderr, top)
		return exitUsage
	}
	name, rest := rest[0], rest[1:]
	if name == "help" {
		if len(rest) == 0 {
			usage(e.stdout, top)
			return exitOK
		}
		name, rest = rest[0], []string{"--help"}
	}
	c, ok := findCommand(name)
	if !ok {
		return badUsage(e, fmt.Errorf("unknown command %q", name), "")
	}
	if cfg.fleet.active() && !fleetCommands[name] {
		return badUsage(e, fmt.Errorf("%s: --group and -L apply to apply, sync, delete, restart, get, logs and rollout start", name), name)
	}
	err := c.run(ctx, cfg, rest, e)
	var help helpRequest
	var ue usageError
	var queued queuedError
	var fleetQ fleetQueued
	var waiting rolloutWaiting
	var groupP groupPending
	var exited exitCodeError
	switch {
	case errors.As(err, &exited):
		fmt.Fprintln(e.stderr, exited.Error())
		return exited.code
	case errors.As(err, &queued):
		fmt.Fprintln(e.stderr, queued.Error())
		return exitQueued
	case errors.As(err, &fleetQ):
		fmt.Fprintln(e.stderr, fleetQ.Error())
		return exitQueued
	case errors.As(err, &waiting):
		fmt.Fprintln(e.stderr, waiting.Error())
		return exitQueued
	case errors.As(err, &groupP):
		fmt.Fprintln(e.stderr, groupP.Error())
		return exitQueued
	case errors.As(err, &help):
		printCommandHelp(e.stdout, c, help.fs)
		return exitOK
	case err == nil:
		return exitOK
	case errors.Is(err, errReported):
		return exitFail
	case errors.As(err, &ue):
		return badUsage(e, err, c.name)
	}
	fmt.Fprintln(e.stderr, "error:", err)
	return exitFail
}

// badUsage prints a short complaint and where to read more, kubectl style,
// and returns the usage exit code.
func badUsage(e env, err error, cmd string) int {
	fmt.Fprintln(e.stderr, "error:", err)
	if cmd == "" {
		fmt.Fprintln(e.stderr, "See 'mqletctl help' for usage.")
	} else {
		fmt.Fprintf(e.stderr, "See 'mqletctl help %s' for usage.\n", cmd)
	}
	return exitUsage
}

func wantsHelp(args []string) bool {
	for _, a := range args {
		if a == "--" {
			return false
		}
		if isHelpFlag(a) {
			return true
		}
	}
	return false
}

func isHelpFlag(a string) bool { return a == "-h" || a == "--help" || a == "-help" }

// printCommandHelp writes a command's synopsis, its own flags (not the
// global ones, which `mqletctl help` lists) and its example.
func printCommandHelp(w io.Writer, c command, fs *flag.FlagSet) {
	synopsis, summary, example := c.help()
	fmt.Fprintf(w, "%s: %s\n\nUsage:\n  mqletctl %s\n", c.name, summary, synopsis)
	if fs != nil {
		global := globalFlagNames()
		var own []*flag.Flag
		fs.VisitAll(func(f *flag.Flag) {
			if !global[f.Name] {
				own = append(own, f)
			}
		})
		if len(own) > 0 {
			fmt.Fprintln(w, "\nFlags:")
			printFlags(w, own)
		}
	}
	if example != "" {
		fmt.Fprintf(w, "\nExample:\n%s\n", example)
	}
	fmt.Fprintln(w, "\nGlobal flags (--node, --broker, --context, --timeout, ...): see 'mqletctl help'.")
}

// printFlags prints one line per flag; spellings bound to the same value
// (-n and --namespace) share a line.
func printFlags(w io.Writer, flags []*flag.Flag) {
	done := map[*flag.Flag]bool{}
	for _, f := range flags {
		if done[f] {
			continue
		}
		var names []string
		for _, g := range flags {
			if g.Value == f.Value && !done[g] {
				done[g] = true
				dash := "--"
				if len(g.Name) == 1 {
					dash = "-"
				}
				names = append(names, dash+g.Name)
			}
		}
		kind, usage := flag.UnquoteUsage(unwrapFlag(f))
		for _, g := range flags {
			if g != f && g.Value == f.Value && !strings.HasPrefix(g.Usage, "same as") {
				_, usage = flag.UnquoteUsage(unwrapFlag(g))
			}
		}
		line := "  " + strings.Join(names, ", ")
		if kind != "" {
			line += " " + kind
		}
		fmt.Fprintf(w, "%-28s %s", line, usage)
		if f.DefValue != "" && f.DefValue != "false" && f.DefValue != "0" {
			fmt.Fprintf(w, " (default %s)", f.DefValue)
		}
		fmt.Fprintln(w)
	}
}

// unwrapFlag returns f with its tracked value unwrapped, so the help names
// its type (duration, string).
func unwrapFlag(f *flag.Flag) *flag.Flag {
	if u, ok := f.Value.(interface{ Unwrap() flag.Value }); ok {
		g := *f
		g.Value = u.Unwrap()
		return &g
	}
	return f
}

// globalFlagNames are the flags every command accepts.
func globalFlagNames() map[string]bool {
	fs := flag.NewFlagSet("", flag.ContinueOnError)
	(&globalConfig{}).register(fs)
	names := map[string]bool{}
	fs.VisitAll(func(f *flag.Flag) { names[f.Name] = true })
	return names
}

// helpRequest is returned by a command's flag parsing when -h or --help
// was given; run prints that command's help.
type helpRequest struct{ fs *flag.FlagSet }

func (helpRequest) Error() string { return "help requested" }

// errReported means the command failed and already printed why.
var errReported = errors.New("failure already reported")

func usage(w io.Writer, top *flag.FlagSet) {
	fmt.Fprintln(w, "mqletctl commands an mqlet edge agent over MQTT.")
	fmt.Fprintln(w, "\nUsage: mqletctl [global flags] COMMAND [flags] [args]")
	fmt.Fprintln(w, "\nCommands:")
	for _, c := range commands() {
		if _, ok := helpTexts()[c.name]; ok {
			fmt.Fprintf(w, "  %-11s %s\n", c.name, c.summary)
		} else {
			fmt.Fprintf(w, "  %s\n", c.summary)
		}
	}
	fmt.Fprintln(w, "\nRun 'mqletctl help COMMAND' (or COMMAND --help) for a command's flags and an example.")
	fmt.Fprintln(w, "\nGlobal flags (accepted before or after the command):")
	var all []*flag.Flag
	top.VisitAll(func(f *flag.Flag) { all = append(all, f) })
	printFlags(w, all)
	fmt.Fprintln(w, "\nThe MQTT password is read from $"+envPassword+" or --password-file, never from a flag.")
	fmt.Fprintln(w, "With --sign-key FILE (env "+envSignKey+") every command is signed for its node, verb and request id.")
	fmt.Fprintln(w, "Exit codes: 0 success, 1 command failed / timed out / broker unreachable, 2 bad usage, 3 queued: the node is offline (the command waits at the broker).")
	fmt.Fprintln(w, "With --group G or -L SELECTOR: 0 when every online member succeeded, 3 when they did and some are offline (Pending), 1 when one failed.")
}

func runVersion(_ context.Context, cfg *globalConfig, args []string, e env) error {
	pos, err := parseInterleaved(newFlagSet("version", cfg), args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usageError{fmt.Errorf("version: unexpected arguments %q", pos)}
	}
	fmt.Fprintln(e.stdout, "mqletctl", version.Version)
	return nil
}
