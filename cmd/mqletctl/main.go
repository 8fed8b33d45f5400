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
	"syscall"
	"time"

	"github.com/mqlet/mqlet/internal/version"
)

// Exit codes.
const (
	exitOK    = 0
	exitFail  = 1 // the command failed, timed out or the broker was unreachable
	exitUsage = 2 // bad command line
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
type command struct {
	name    string
	summary string
	run     func(ctx context.Context, cfg *globalConfig, args []string, e env) error
}

func commands() []command {
	return []command{
		{"apply", "apply -f FILE|- [--no-wait]        send manifests; wait for the agent's verdict", runApply},
		{"delete", "delete -f FILE | delete pod NAME [-n NS] [--grace-period N]", runDelete},
		{"sync", "sync -f FILE|- [--no-wait]         replace the node's whole desired state with a List", runSync},
		{"get", "get pods|configmaps|secrets [NAME] [-n NS] [-o json|yaml|wide]", runGet},
		{"status", "status [-o json|yaml]              online/offline, boot id, node readiness, capacity", runStatus},
		{"watch", "watch [pods|events|all] [--count N] print updates until Ctrl-C", runWatch},
		{"sign", "sign VERB -f FILE [--request-id ID] print a command signed with --sign-key, for mosquitto_pub", runSign},
		{"keys", "keys generate [--out FILE] | show  new Ed25519 signing key (show: of --sign-key); prints the node's trustedKeys entry", runKeys},
		{"certs", "certs ca|broker --host H|node NAME|operator [--dir D]  fleet CA and mTLS certificates; says where each goes", runCerts},
		{"logs", "logs POD [-c C] [-f] [--previous] [--tail N] [--since D]  print a container's log", runLogs},
		{"exec", "exec POD [-c C] -- CMD [ARG...]    run a command in a container (if the agent allows exec)", runExec},
		{"restart", "restart pod NAME [-c C]            kill and start again the pod, or one container", runRestart},
		{"config", "config view | config set KEY=VALUE  the agent's settings and their sources; change a live one", runConfig},
		{"version", "version                            print the mqletctl version", runVersion},
	}
}

// run executes one command line and returns the exit code.
func run(ctx context.Context, args []string, e env) int {
	cfg := newGlobalConfig(e.getenv)
	cfg.now = e.now
	top := flag.NewFlagSet("mqletctl", flag.ContinueOnError)
	top.SetOutput(e.stderr)
	cfg.register(top)
	showVersion := top.Bool("version", false, "print the version and exit")
	top.Usage = func() { usage(e.stderr, top) }
	if err := top.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
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
		usage(e.stdout, top)
		return exitOK
	}
	for _, c := range commands() {
		if c.name != name {
			continue
		}
		err := c.run(ctx, cfg, rest, e)
		switch {
		case err == nil:
			return exitOK
		case errors.Is(err, flag.ErrHelp):
			return exitOK
		case errors.Is(err, errReported):
			return exitFail
		}
		fmt.Fprintln(e.stderr, "error:", err)
		var ue usageError
		if errors.As(err, &ue) {
			return exitUsage
		}
		return exitFail
	}
	fmt.Fprintf(e.stderr, "error: unknown command %q (run `mqletctl help`)\n", name)
	return exitUsage
}

// errReported means the command failed and already printed why.
var errReported = errors.New("failure already reported")

func usage(w io.Writer, top *flag.FlagSet) {
	fmt.Fprintln(w, "mqletctl commands an mqlet edge agent over MQTT.")
	fmt.Fprintln(w, "\nUsage: mqletctl [global flags] COMMAND [flags] [args]")
	fmt.Fprintln(w, "\nCommands:")
	for _, c := range commands() {
		fmt.Fprintln(w, "  "+c.summary)
	}
	fmt.Fprintln(w, "\nGlobal flags (accepted before or after the command):")
	top.SetOutput(w)
	top.PrintDefaults()
	fmt.Fprintln(w, "\nThe MQTT password is read from $"+envPassword+" or --password-file, never from a flag.")
	fmt.Fprintln(w, "With --sign-key FILE (env "+envSignKey+") every command is signed for its node, verb and request id.")
	fmt.Fprintln(w, "Exit codes: 0 success, 1 command failed / timed out / broker unreachable, 2 bad usage.")
}

func runVersion(_ context.Context, _ *globalConfig, _ []string, e env) error {
	fmt.Fprintln(e.stdout, "mqletctl", version.Version)
	return nil
}
