package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	apiv1 "github.com/mqlet/mqlet/api/v1"
)

// The operator verbs, with kubectl's habits: logs, exec, restart, config.

// call sends one command and returns its final reply, handing every
// in_progress reply to onProgress (nil: ignored). A failed reply is
// printed and reported.
func call(ctx context.Context, cfg *globalConfig, verb string, args any, timeout time.Duration, e env, onProgress func(apiv1.Reply) error) (apiv1.Reply, error) {
	return callStream(ctx, cfg, verb, args, timeout, e, false, onProgress)
}

// callStream is call; with stream, the request is read until it ends or
// ctx is cancelled, and then cancelled on the agent (client.stream).
func callStream(ctx context.Context, cfg *globalConfig, verb string, args any, timeout time.Duration, e env, stream bool, onProgress func(apiv1.Reply) error) (apiv1.Reply, error) {
	payload, err := json.Marshal(args)
	if err != nil {
		return apiv1.Reply{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	c, err := dial(ctx, cfg)
	if err != nil {
		return apiv1.Reply{}, err
	}
	defer c.close()
	c.stream = stream
	var final apiv1.Reply
	var progressErr error
	if _, err := c.request(ctx, verb, payload, func(r apiv1.Reply) bool {
		if r.Final() {
			final = r
			return true
		}
		if r.Phase == apiv1.InProgress && onProgress != nil && progressErr == nil {
			progressErr = onProgress(r)
		}
		return false
	}); err != nil {
		return apiv1.Reply{}, err
	}
	if progressErr != nil {
		return final, progressErr
	}
	if final.Phase == apiv1.Failed {
		printReply(e, final)
		return final, errReported
	}
	return final, nil
}

func runLogs(ctx context.Context, cfg *globalConfig, args []string, e env) error {
	fs := newFlagSet("logs", cfg, e.stderr)
	ns := namespaceFlag(fs, nsDefault)
	container := fs.String("c", "", "container (default: the pod's only one)")
	fs.StringVar(container, "container", "", "same as -c")
	follow := fs.Bool("f", false, "follow: print new lines as they come")
	fs.BoolVar(follow, "follow", false, "same as -f")
	followFor := fs.Duration("follow-for", 0, "stop following after this long (default: the agent's logs.maxFollow)")
	previous := fs.Bool("previous", false, "the last terminated attempt of the container")
	fs.BoolVar(previous, "p", false, "same as --previous")
	tail := fs.Int64("tail", -1, "only the last N lines (-1: all)")
	since := fs.Duration("since", 0, "only lines newer than this, e.g. 5m")
	limit := fs.Int64("limit-bytes", 0, "at most this many bytes (0: the agent's logs.maxBytes)")
	timestamps := fs.Bool("timestamps", false, "prefix each line with its time")
	fleet := registerFleet(fs, cfg)
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usageError{errors.New("logs: want one POD (e.g. mqletctl logs web -c main --tail 20)")}
	}
	if fleet.active() {
		if *follow {
			return usageError{errors.New("logs: -f follows one node's log; with --group or -L, logs prints each member's lines once")}
		}
		if err := fleet.check(cfg, "logs"); err != nil {
			return err
		}
	} else if err := cfg.resolve(); err != nil {
		return err
	}
	req := apiv1.LogsRequest{Namespace: *ns, Name: pos[0], Container: *container, Previous: *previous, Timestamps: *timestamps, Follow: *follow}
	if *tail >= 0 {
		req.TailLines = tail
	}
	if *since > 0 {
		s := int64((*since + time.Second - 1) / time.Second)
		req.SinceSeconds = &s
	}
	if *limit > 0 {
		req.LimitBytes = limit
	}
	if fleet.active() {
		return runFleetLogs(ctx, cfg, fleet, req, e)
	}
	timeout := cfg.Timeout
	if *follow {
		if *followFor > 0 {
			req.FollowSeconds = int64((*followFor + time.Second - 1) / time.Second)
			timeout += *followFor
		} else {
			timeout += 24 * time.Hour // the agent's cap ends it; Ctrl-C cancels
		}
	}
	printLines := func(lines []string) {
		for _, l := range lines {
			fmt.Fprintln(e.stdout, l)
		}
	}
	final, err := callStream(ctx, cfg, "logs", req, timeout, e, *follow, func(r apiv1.Reply) error {
		var c apiv1.LogsChunk
		if err := json.Unmarshal(r.RawResult(), &c); err != nil {
			return fmt.Errorf("logs: undecodable chunk %d: %w", r.Seq, err)
		}
		printLines(c.Lines)
		return nil
	})
	if *follow && errors.Is(err, context.Canceled) && ctx.Err() != nil {
		return nil // Ctrl-C ends a follow; the agent was told to cancel it
	}
	if err != nil {
		return err
	}
	var res apiv1.LogsResult
	if err := json.Unmarshal(final.RawResult(), &res); err != nil {
		return fmt.Errorf("logs: undecodable result: %w", err)
	}
	printLines(res.Lines)
	if res.Truncated {
		fmt.Fprintln(e.stderr, "mqletctl: "+final.Message)
	}
	return nil
}

func runExec(ctx context.Context, cfg *globalConfig, args []string, e env) error {
	fs := newFlagSet("exec", cfg, e.stderr)
	ns := namespaceFlag(fs, nsDefault)
	container := fs.String("c", "", "container (default: the pod's only one)")
	fs.StringVar(container, "container", "", "same as -c")
	timeout := fs.Duration("command-timeout", 0, "stop the command after this long (default: the agent's exec.defaultTimeout)")
	stdin := fs.Bool("i", false, "pass stdin to the command (with -t: an interactive terminal)")
	fs.BoolVar(stdin, "stdin", false, "same as -i")
	tty := fs.Bool("t", false, "give the command a terminal (with -i)")
	fs.BoolVar(tty, "tty", false, "same as -t")
	both := fs.Bool("it", false, "same as -i -t")
	fs.BoolVar(both, "ti", false, "same as -i -t")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	if len(pos) < 2 {
		return usageError{errors.New("exec: want POD -- COMMAND [ARG...] (e.g. mqletctl exec web -- cat /etc/hostname)")}
	}
	interactive := *both || (*stdin && *tty)
	switch {
	case !interactive && (*stdin || *tty):
		return usageError{errors.New("exec: -i and -t go together (an interactive terminal: mqletctl exec -it POD -- sh)")}
	case interactive && *timeout > 0:
		return usageError{errors.New("exec: --command-timeout does not apply to an interactive exec (it ends with its command, or the agent's exec.idleTimeout)")}
	}
	if err := cfg.resolve(); err != nil {
		return err
	}
	req := apiv1.ExecRequest{Namespace: *ns, Name: pos[0], Container: *container, Command: pos[1:]}
	if interactive {
		return runShell(ctx, cfg, req, e)
	}
	wait := cfg.Timeout
	if *timeout > 0 {
		req.TimeoutSeconds = int64((*timeout + time.Second - 1) / time.Second)
		wait += *timeout
	}
	final, err := call(ctx, cfg, "exec", req, wait, e, nil)
	if err != nil {
		return err
	}
	var res apiv1.ExecResult
	if err := json.Unmarshal(final.RawResult(), &res); err != nil {
		return fmt.Errorf("exec: undecodable result: %w", err)
	}
	fmt.Fprint(e.stdout, res.Stdout)
	fmt.Fprint(e.stderr, res.Stderr)
	if res.StdoutTruncated || res.StderrTruncated {
		fmt.Fprintln(e.stderr, "mqletctl: "+final.Message)
	}
	if res.ExitCode != 0 {
		return exitCodeError{code: int(res.ExitCode)}
	}
	return nil
}

func runRestart(ctx context.Context, cfg *globalConfig, args []string, e env) error {
	fs := newFlagSet("restart", cfg, e.stderr)
	ns := namespaceFlag(fs, nsDefault)
	container := fs.String("c", "", "only this container (default: the whole pod)")
	fs.StringVar(container, "container", "", "same as -c")
	fleet := registerFleet(fs, cfg)
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 2 || (pos[0] != "pod" && pos[0] != "pods" && pos[0] != "po") {
		return usageError{errors.New("restart: want pod NAME [-c CONTAINER]")}
	}
	if fleet.active() {
		if err := fleet.check(cfg, "restart"); err != nil {
			return err
		}
		payload, _ := json.Marshal(apiv1.RestartRequest{Namespace: *ns, Name: pos[1], Container: *container}) // strings always encode
		return runFleetVerb(ctx, cfg, fleet, "restart", payload, nil, e)
	}
	if err := cfg.resolve(); err != nil {
		return err
	}
	final, err := call(ctx, cfg, "restart", apiv1.RestartRequest{Namespace: *ns, Name: pos[1], Container: *container}, cfg.Timeout, e, nil)
	if err != nil {
		return err
	}
	var res apiv1.RestartResult
	_ = json.Unmarshal(final.RawResult(), &res)
	fmt.Fprintln(e.stdout, final.Message)
	for _, c := range res.Containers {
		fmt.Fprintf(e.stdout, "  %s  %s  restarts %d\n", c.Name, shortID(c.ContainerID), c.RestartCount)
	}
	return nil
}

func shortID(id string) string {
	if len(id) > 13 {
		return id[:13]
	}
	return id
}

func runConfig(ctx context.Context, cfg *globalConfig, args []string, e env) error {
	fs := newFlagSet("config", cfg, e.stderr)
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	if len(pos) == 0 || (pos[0] != "view" && pos[0] != "set") || (pos[0] == "view" && len(pos) != 1) || (pos[0] == "set" && len(pos) < 2) {
		return usageError{errors.New("config: want view, or set KEY=VALUE... (KEY=null resets it to the file's value)")}
	}
	if err := cfg.resolve(); err != nil {
		return err
	}
	var final apiv1.Reply
	if pos[0] == "view" {
		final, err = call(ctx, cfg, "get", apiv1.GetRequest{Kind: "Config"}, cfg.Timeout, e, nil)
	} else {
		patch := map[string]any{}
		for _, kv := range pos[1:] {
			k, v, ok := strings.Cut(kv, "=")
			if !ok || k == "" {
				return usageError{fmt.Errorf("config set: %q is not KEY=VALUE", kv)}
			}
			if v == "null" {
				patch[k] = nil
			} else {
				patch[k] = v
			}
		}
		final, err = call(ctx, cfg, "config", patch, cfg.Timeout, e, nil)
	}
	if err != nil {
		return err
	}
	var view apiv1.ConfigView
	if err := json.Unmarshal(final.RawResult(), &view); err != nil {
		return fmt.Errorf("config: undecodable result: %w", err)
	}
	if pos[0] == "set" {
		fmt.Fprintln(e.stdout, final.Message)
	}
	keys := make([]string, 0, len(view.Settings))
	for k := range view.Settings {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	fmt.Fprintf(e.stdout, "%-40s %-8s %s\n", "SETTING", "SOURCE", "VALUE")
	for _, k := range keys {
		v := view.Settings[k]
		if pos[0] == "set" && v.Source != apiv1.SourceRemote {
			continue // set shows what is remote now
		}
		fmt.Fprintf(e.stdout, "%-40s %-8s %s\n", k, v.Source, v.Value)
	}
	return nil
}
