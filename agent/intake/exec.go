package intake

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	v1 "k8s.io/api/core/v1"

	"github.com/mqlet/mqlet/agent/manifest"
	"github.com/mqlet/mqlet/agent/shell"
	"github.com/mqlet/mqlet/agent/streams"
	apiv1 "github.com/mqlet/mqlet/api/v1"
	"github.com/mqlet/mqlet/cri"
)

// Bounds of an exec command.
const (
	maxExecArgs      = 256
	maxExecArgBytes  = 4096
	maxExecCmdBytes  = 32 << 10
	maxEventCmdBytes = 512 // of the command quoted in the Exec event
	ReasonExec       = "Exec"
	MsgExecDisabled  = "exec is disabled on this node: set exec.enabled in mqlet's config file (it cannot be turned on over MQTT)"
)

func (in *Intake) handleExec(r request) {
	id, payload := r.id, r.payload
	const verb = "exec"
	v := in.opts.Verbs
	if !v.Exec.Enabled {
		in.fail(id, verb, errors.New(MsgExecDisabled))
		return
	}
	if v.Runtime == nil || v.Streams == nil {
		in.fail(id, verb, errors.New("verb \"exec\" is not supported by this mqlet"))
		return
	}
	var args apiv1.ExecRequest
	if err := manifest.DecodeArgs(payload, &args); err != nil {
		in.fail(id, verb, fmt.Errorf("decoding exec request: %w", err))
		return
	}
	if args.Interactive {
		in.handleShell(id, args)
		return
	}
	if args.Size != nil || args.InputKey != nil {
		in.fail(id, verb, errors.New("size, inputKey: only for an interactive exec"))
		return
	}
	pod, container, timeout, err := in.checkExec(args)
	if err != nil {
		in.fail(id, verb, err)
		return
	}
	// Who asked and what, never the output (which may hold anything).
	// Who asked is the request id only: over MQTT 3.1.1 (paho.mqtt.golang)
	// a PUBLISH carries no publisher identity, and there are no user
	// properties in which a client could even claim one.
	in.events.Event(pod, v1.EventTypeNormal, ReasonExec, fmt.Sprintf("exec requested (request %s) in container %s: %s", id, container, quoteCommand(args.Command)))
	in.startStream(id, verb, false, &pod.ObjectMeta, func(in *Intake, ctx context.Context) {
		in.runExec(ctx, id, podKey(pod), container, args.Command, timeout)
	})
}

// handleShell starts an interactive exec: a terminal carried on the
// request's input and output topics by agent/shell.
func (in *Intake) handleShell(id string, args apiv1.ExecRequest) {
	const verb = "exec"
	if in.opts.Verbs.Shell == nil {
		in.fail(id, verb, errors.New("interactive exec is not supported by this mqlet"))
		return
	}
	switch {
	case args.Stdin != "":
		in.fail(id, verb, errors.New("stdin: an interactive exec takes its input on its input topic"))
		return
	case args.TimeoutSeconds != 0:
		in.fail(id, verb, errors.New("timeoutSeconds: an interactive exec ends with its command, its requester, or exec.idleTimeout"))
		return
	}
	size := apiv1.TermSize{Cols: 80, Rows: 24}
	if args.Size != nil {
		if err := args.Size.Validate(); err != nil {
			in.fail(id, verb, fmt.Errorf("size: %w", err))
			return
		}
		size = *args.Size
	}
	if err := checkCommand(args.Command); err != nil {
		in.fail(id, verb, err)
		return
	}
	pod, err := in.findPod(args.Namespace, args.Name)
	if err != nil {
		in.fail(id, verb, err)
		return
	}
	container, err := pickContainer(pod, args.Container, false)
	if err != nil {
		in.fail(id, verb, err)
		return
	}
	inputKey, err := in.shellInputKey(id, args.InputKey)
	if err != nil {
		in.fail(id, verb, err)
		return
	}
	in.events.Event(pod, v1.EventTypeNormal, ReasonExec, fmt.Sprintf("interactive exec requested (request %s) in container %s: %s", id, container, quoteCommand(args.Command)))
	kind := streams.Kind{Follow: true, Interactive: true}
	in.startStreamKind(id, verb, kind, &pod.ObjectMeta, func(in *Intake, ctx context.Context) {
		in.runShell(ctx, id, podKey(pod), container, args.Command, size, inputKey)
	})
}

// valueUnsealer opens one value sealed to the node (sealing.Identity).
type valueUnsealer interface {
	UnsealValue(namespace, name, key string, sealed []byte) ([]byte, error)
}

// shellInputKey opens the input key of an interactive exec. A signed
// command must carry one: its keystrokes travel unsigned, and only a key
// the signer sealed to this node tells its input from anyone else's.
func (in *Intake) shellInputKey(id string, sealed []byte) ([]byte, error) {
	if len(sealed) == 0 {
		if in.cmdRequester != "" {
			return nil, errors.New("inputKey: required for a signed interactive exec (a key sealed to this node that authenticates its input; mqletctl sends one)")
		}
		return nil, nil
	}
	u, ok := in.opts.Unsealer.(valueUnsealer)
	if !ok {
		return nil, errors.New("inputKey: this node has no sealing key to open it")
	}
	key, err := u.UnsealValue(apiv1.ShellKeyNamespace, id, apiv1.ShellKeyName, sealed)
	if err != nil {
		return nil, fmt.Errorf("inputKey: %w", err)
	}
	if len(key) != apiv1.ShellKeyBytes {
		return nil, fmt.Errorf("inputKey: %d bytes, want %d", len(key), apiv1.ShellKeyBytes)
	}
	return key, nil
}

func (in *Intake) runShell(ctx context.Context, id string, pod cri.PodKey, container string, cmd []string, size apiv1.TermSize, inputKey []byte) {
	const verb = "exec"
	spec := shell.Spec{
		RequestID: id, OutputTopic: in.opts.Topics.Output(id), Pod: pod, Container: container, Command: cmd, Size: size,
		Scrub: in.scrubberOf(pod.Namespace, pod.Name), InputKey: inputKey,
		Opened: func() {
			_ = in.sendChunk(apiv1.Reply{RequestID: id, Verb: verb, Phase: apiv1.InProgress,
				Message: fmt.Sprintf("terminal open: input on %s, output on %s", in.opts.Topics.Input(id), in.opts.Topics.Output(id))})
		},
	}
	code, err := in.opts.Verbs.Shell.Run(ctx, spec)
	switch {
	case errors.Is(err, streams.ErrUnread):
		in.fail(id, verb, fmt.Errorf("ended: its requester sent nothing on %s for logs.unreadTimeout", in.opts.Topics.Input(id)))
		return
	case ctx.Err() != nil:
		in.fail(id, verb, errors.New("cancelled"))
		return
	case err != nil:
		in.fail(id, verb, in.scrubberOf(pod.Namespace, pod.Name).Error(err))
		return
	}
	_ = in.replies.Send(apiv1.Reply{RequestID: id, Verb: verb, Phase: apiv1.Succeeded, Message: fmt.Sprintf("command exited with code %d", code), Result: apiv1.ExecResult{ExitCode: int32(code)}})
}

func (in *Intake) checkExec(args apiv1.ExecRequest) (*v1.Pod, string, time.Duration, error) {
	lim := in.opts.Verbs.Exec
	if args.Stdin != "" {
		return nil, "", 0, errors.New("stdin: not supported (CRI ExecSync takes no input); pass data in the command")
	}
	if err := checkCommand(args.Command); err != nil {
		return nil, "", 0, err
	}
	timeout := lim.DefaultTimeout
	if t := args.TimeoutSeconds; t != 0 {
		if t < 1 || t > int64(lim.MaxTimeout/time.Second) {
			return nil, "", 0, fmt.Errorf("timeoutSeconds %d: must be 1 to %d (exec.maxTimeout)", t, int64(lim.MaxTimeout/time.Second))
		}
		timeout = time.Duration(t) * time.Second
	}
	pod, err := in.findPod(args.Namespace, args.Name)
	if err != nil {
		return nil, "", 0, err
	}
	container, err := pickContainer(pod, args.Container, false)
	if err != nil {
		return nil, "", 0, err
	}
	return pod, container, timeout, nil
}

// checkCommand bounds an exec's command.
func checkCommand(command []string) error {
	if len(command) == 0 {
		return errors.New("command: required")
	}
	if len(command) > maxExecArgs {
		return fmt.Errorf("command: %d arguments, at most %d", len(command), maxExecArgs)
	}
	total := 0
	for i, a := range command {
		total += len(a)
		switch {
		case len(a) > maxExecArgBytes:
			return fmt.Errorf("command[%d]: %d bytes, at most %d", i, len(a), maxExecArgBytes)
		case strings.ContainsRune(a, 0) || !utf8.ValidString(a):
			return fmt.Errorf("command[%d]: NUL or invalid UTF-8", i)
		}
	}
	if total > maxExecCmdBytes {
		return fmt.Errorf("command: %d bytes, at most %d", total, maxExecCmdBytes)
	}
	return nil
}

func (in *Intake) runExec(ctx context.Context, id string, pod cri.PodKey, container string, cmd []string, timeout time.Duration) {
	const verb = "exec"
	res, err := in.opts.Verbs.Runtime.ExecInPod(ctx, pod, container, cmd, timeout)
	scrub := in.scrubberOf(pod.Namespace, pod.Name)
	switch {
	case errors.Is(err, cri.ErrExecTimedOut):
		in.fail(id, verb, fmt.Errorf("command ran past timeoutSeconds (%s) and was stopped", timeout))
		return
	case ctx.Err() != nil:
		in.fail(id, verb, errors.New("cancelled"))
		return
	case err != nil:
		in.fail(id, verb, scrub.Error(err))
		return
	}
	// The container's output is scrubbed whole, before it is cut and
	// before a large result is sent in parts.
	max := in.opts.Verbs.Exec.MaxOutputBytes
	out := apiv1.ExecResult{ExitCode: int32(res.ExitCode)}
	out.Stdout, out.StdoutTruncated = capOutput([]byte(scrub.String(string(res.Stdout))), max)
	out.Stderr, out.StderrTruncated = capOutput([]byte(scrub.String(string(res.Stderr))), max)
	msg := fmt.Sprintf("command exited with code %d", res.ExitCode)
	if out.StdoutTruncated || out.StderrTruncated {
		msg += fmt.Sprintf("; output cut at exec.maxOutputBytes (%d)", max)
	}
	_ = in.replies.Send(apiv1.Reply{RequestID: id, Verb: verb, Phase: apiv1.Succeeded, Message: msg, Result: out})
}

// capOutput is b as text of at most max bytes, escaped size included (a
// stream of control bytes grows sixfold in JSON), cut at a rune boundary.
func capOutput(b []byte, max int) (string, bool) {
	n, cost := 0, 0
	for n < len(b) {
		r, size := utf8.DecodeRune(b[n:])
		c := escapedCost(r, size)
		if cost+c > max {
			return string(b[:n]), true
		}
		cost += c
		n += size
	}
	return string(b), false
}

// quoteCommand is cmd as JSON, cut for an event.
func quoteCommand(cmd []string) string {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false) // read by people: "2>&1" as written
	_ = enc.Encode(cmd)      // strings always encode
	b := bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
	if len(b) <= maxEventCmdBytes {
		return string(b)
	}
	cut := maxEventCmdBytes
	for cut > 0 && !utf8.RuneStart(b[cut]) {
		cut--
	}
	return string(b[:cut]) + "... (truncated)"
}
