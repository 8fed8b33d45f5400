package main

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"golang.org/x/term"

	apiv1 "github.com/mqlet/mqlet/api/v1"
	"github.com/mqlet/mqlet/internal/shellwire"
	"github.com/mqlet/mqlet/sealing"
)

// exitCodeError makes mqletctl exit with a remote command's exit code.
type exitCodeError struct{ code int }

func (e exitCodeError) Error() string {
	return fmt.Sprintf("command terminated with exit code %d", e.code)
}

// ackEveryBytes: output is acknowledged at once when this much of it is
// unacknowledged, else after shellAckDelay (or with the next input).
const (
	ackEveryBytes = apiv1.ShellOutputWindow / 4
	shellAckDelay = 50 * time.Millisecond
	// exitGrace is how long the exit code's message is awaited after the
	// final reply named the code.
	exitGrace = 2 * time.Second
)

// terminal is the local end: stdin (raw when it is a terminal), stdout,
// and the size.
type terminal struct {
	in     io.Reader
	out    io.Writer
	fd     int // of stdin; -1 when it is no terminal
	outFd  int // of stdout; -1 when it is no terminal
	before *term.State
}

func newTerminal(e env) *terminal {
	t := &terminal{in: e.stdin, out: e.stdout, fd: -1, outFd: -1}
	if f, ok := e.stdin.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		t.fd = int(f.Fd())
	}
	if f, ok := e.stdout.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		t.outFd = int(f.Fd())
	}
	return t
}

func (t *terminal) size() apiv1.TermSize {
	for _, fd := range []int{t.outFd, t.fd} {
		if fd < 0 {
			continue
		}
		if w, h, err := term.GetSize(fd); err == nil && w > 0 && h > 0 {
			return apiv1.TermSize{Cols: uint16(min(w, apiv1.ShellMaxTermSize)), Rows: uint16(min(h, apiv1.ShellMaxTermSize))}
		}
	}
	return apiv1.TermSize{Cols: 80, Rows: 24}
}

// raw puts a terminal in raw mode: Ctrl-C and every other key go to the
// remote command.
func (t *terminal) raw() error {
	if t.fd < 0 {
		return nil
	}
	st, err := term.MakeRaw(t.fd)
	if err != nil {
		return fmt.Errorf("putting the terminal in raw mode: %w", err)
	}
	t.before = st
	return nil
}

func (t *terminal) restore() {
	if t.before != nil {
		_ = term.Restore(t.fd, t.before)
		t.before = nil
	}
}

// runShell runs req (interactive) and carries the local terminal to it
// until the remote command exits; its exit code becomes mqletctl's.
func runShell(ctx context.Context, cfg *globalConfig, req apiv1.ExecRequest, e env) error {
	t := newTerminal(e)
	size := t.size()
	req.Interactive, req.Size = true, &size
	id := newRequestID()
	// Signed: the keystrokes are authenticated with a key only the node
	// can open, bound to this request by the signature.
	var inputKey []byte
	if cfg.signer != nil {
		recipient, err := nodeSealingKey(ctx, cfg)
		if err != nil {
			return fmt.Errorf("exec -it: the node's sealing key, to seal the session's input key to: %w", err)
		}
		r, err := sealing.ParseRecipient(recipient)
		if err != nil {
			return err
		}
		inputKey = make([]byte, apiv1.ShellKeyBytes)
		if _, err := rand.Read(inputKey); err != nil {
			return err
		}
		if req.InputKey, err = sealing.SealValue([]sealing.Recipient{r}, apiv1.ShellKeyNamespace, id, apiv1.ShellKeyName, inputKey); err != nil {
			return err
		}
	}
	payload, err := json.Marshal(req)
	if err != nil {
		return err
	}
	dialCtx, dialCancel := context.WithTimeout(ctx, cfg.Timeout)
	defer dialCancel()
	c, err := dial(dialCtx, cfg)
	if err != nil {
		return err
	}
	defer c.close()
	sealed, err := c.seal("exec", id, payload)
	if err != nil {
		return err
	}
	subCtx, subCancel := context.WithCancel(ctx)
	defer subCancel()
	inbox := make(chan message, 64)
	replyTopic, outTopic := c.topics.Reply(id), c.topics.Output(id)
	if err := c.subscribe(subCtx, inbox, replyTopic, outTopic, c.topics.State()); err != nil {
		return err
	}
	if err := c.publish(dialCtx, c.topics.Command("exec", id), sealed); err != nil {
		return err
	}
	s := &shellClient{c: c, id: id, t: t, window: shellwire.NewWindow(apiv1.ShellInputWindow),
		reorder: shellwire.NewReorder(apiv1.ShellMaxAhead, 2*apiv1.ShellOutputWindow), stderr: e.stderr, key: inputKey}
	ended := false
	defer func() {
		if !ended {
			c.cancelRequest(id)
		}
	}()
	// Until the terminal is open: the command's first reply.
	open := time.NewTimer(cfg.Timeout)
	defer open.Stop()
	for opened := false; !opened; {
		select {
		case m := <-inbox:
			switch m.Topic {
			case c.topics.State():
				var st apiv1.NodeState
				if !c.waitOffline && json.Unmarshal(m.Payload, &st) == nil && st.State == apiv1.StateOffline {
					ended = true // a queued interactive exec is worth nothing later
					c.cancelRequest(id)
					return queuedError{node: c.topics.Node, requestID: id, since: st.TS}
				}
			case replyTopic:
				r, err := apiv1.DecodeReply(m.Payload)
				if err != nil {
					return fmt.Errorf("request %s: undecodable reply: %w", id, err)
				}
				if r.Final() {
					ended = true
					return fmt.Errorf("exec: %s", r.Message)
				}
				if r.Phase == apiv1.InProgress {
					opened = true
				}
			case outTopic:
				// Output before the reply that opened it (another topic):
				// taken in order like the rest.
				if err := s.output(m.Payload); err != nil {
					return err
				}
			}
		case <-open.C:
			return fmt.Errorf("%w: no terminal opened for request %s within --timeout %s; the agent on node %q may be offline or exec disabled", errNoReply, id, cfg.Timeout, c.topics.Node)
		case <-ctx.Done():
			return fmt.Errorf("request %s: %w", id, ctx.Err())
		}
	}
	if err := t.raw(); err != nil {
		return err
	}
	defer t.restore()
	code, err := s.run(ctx, inbox)
	ended = err == nil || errors.Is(err, errRemoteEnded)
	t.restore()
	if err != nil {
		return err
	}
	if code != 0 {
		return exitCodeError{code: code}
	}
	return nil
}

// errRemoteEnded says the node ended the session (its final reply).
var errRemoteEnded = errors.New("the session ended")

// shellClient is mqletctl's end of a session.
type shellClient struct {
	c       *client
	id      string
	t       *terminal
	window  *shellwire.Window  // of input
	reorder *shellwire.Reorder // of output; the receiving loop only

	stderr io.Writer
	key    []byte // authenticates the input (signed sessions)

	mu        sync.Mutex // orders numbered input with its number
	delivered uint64     // output messages written
	unacked   int        // output bytes written since the last ack sent
	ackSent   uint64
	exitCode  *int32 // the receiving loop only
}

// run carries the terminal until the remote command's exit code arrives.
func (s *shellClient) run(ctx context.Context, inbox <-chan message) (int, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make(chan error, 2)
	go func() { errs <- s.readStdin(ctx) }()
	go s.resizes(ctx)
	go s.c.heartbeat(ctx, s.id)
	ackTimer := time.NewTimer(time.Hour)
	ackTimer.Stop()
	var grace <-chan time.Time
	finalCode := -1
	for {
		select {
		case m := <-inbox:
			switch m.Topic {
			case s.c.topics.Output(s.id):
				if err := s.output(m.Payload); err != nil {
					return 0, err
				}
				if s.exitCode != nil {
					s.ack(ctx)
					return int(*s.exitCode), nil
				}
				if s.pendingAck() >= ackEveryBytes {
					s.ack(ctx)
				} else if s.pendingAck() > 0 {
					ackTimer.Reset(shellAckDelay)
				}
			case s.c.topics.Reply(s.id):
				r, err := apiv1.DecodeReply(m.Payload)
				if err != nil || !r.Final() {
					continue
				}
				if r.Phase == apiv1.Failed {
					s.t.restore()
					fmt.Fprintf(s.stderr, "error: %s\n", r.Message)
					return 0, errors.Join(errRemoteEnded, errReported)
				}
				var res apiv1.ExecResult
				if json.Unmarshal(r.RawResult(), &res) == nil {
					finalCode = int(res.ExitCode)
				}
				grace = time.After(exitGrace) // the rest of the output may still come
			case s.c.topics.State():
				var st apiv1.NodeState
				if json.Unmarshal(m.Payload, &st) == nil && st.State == apiv1.StateOffline {
					return 0, fmt.Errorf("node %s went offline", s.c.topics.Node)
				}
			}
		case <-ackTimer.C:
			s.ack(ctx)
		case <-grace:
			return max(finalCode, 0), nil
		case err := <-errs:
			if err != nil {
				return 0, err
			}
			errs = nil // stdin ended; the remote decides when it ends
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
}

// output takes one message of the output topic.
func (s *shellClient) output(payload []byte) error {
	out, err := apiv1.DecodeShellOutput(payload)
	if err != nil {
		return fmt.Errorf("request %s: %w", s.id, err)
	}
	if out.Ack > 0 {
		if err := s.window.Ack(out.Ack); err != nil {
			return fmt.Errorf("request %s: %w", s.id, err)
		}
	}
	if out.Seq == 0 {
		return nil
	}
	ready, err := s.reorder.Add(out.Seq, payload)
	if err != nil {
		return fmt.Errorf("request %s: %w", s.id, err)
	}
	for _, raw := range ready {
		m, _ := apiv1.DecodeShellOutput(raw) // decoded once already
		if len(m.Data) > 0 {
			if _, err := s.t.out.Write(m.Data); err != nil {
				return fmt.Errorf("writing the terminal's output: %w", err)
			}
		}
		if m.Exit != nil {
			s.exitCode = m.Exit
		}
		s.mu.Lock()
		s.unacked += len(m.Data)
		s.delivered = s.reorder.Delivered()
		s.mu.Unlock()
	}
	return nil
}

func (s *shellClient) pendingAck() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.delivered == s.ackSent {
		return 0
	}
	return max(s.unacked, 1)
}

// ack says which output was written.
func (s *shellClient) ack(ctx context.Context) {
	_ = s.send(ctx, apiv1.ShellInput{}, 0) // unnumbered: never waits
}

// send publishes one input message, numbered when it carries data or a
// resize (waiting for room in the window), with the output ack.
func (s *shellClient) send(ctx context.Context, in apiv1.ShellInput, cost int) error {
	numbered := len(in.Data) > 0 || in.Resize != nil
	if numbered {
		seq, err := s.window.Reserve(ctx, cost)
		if err != nil {
			return err
		}
		in.Seq = seq
	}
	s.mu.Lock()
	in.Ack = s.delivered
	if !numbered && in.Ack == s.ackSent {
		s.mu.Unlock()
		return nil
	}
	s.ackSent, s.unacked = in.Ack, 0
	if s.key != nil {
		in.MAC = apiv1.ShellInputMAC(s.key, s.id, in)
	}
	b, err := json.Marshal(in)
	if err == nil {
		s.c.mqtt.Publish(s.c.topics.Input(s.id), 1, false, b)
	}
	s.mu.Unlock()
	return err
}

// readStdin sends what is typed until stdin ends or ctx does.
func (s *shellClient) readStdin(ctx context.Context) error {
	buf := make([]byte, apiv1.ShellMaxData)
	for {
		n, err := s.t.in.Read(buf)
		if n > 0 {
			if err := s.send(ctx, apiv1.ShellInput{Data: append([]byte(nil), buf[:n]...)}, n); err != nil {
				return nil // ctx ended
			}
		}
		if err != nil {
			return nil // EOF: nothing more to type
		}
	}
}

// resizes sends the terminal's new size at every SIGWINCH.
func (s *shellClient) resizes(ctx context.Context) {
	if s.t.fd < 0 && s.t.outFd < 0 {
		return
	}
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGWINCH)
	defer signal.Stop(ch)
	last := s.t.size()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ch:
			if sz := s.t.size(); sz != last {
				last = sz
				if s.send(ctx, apiv1.ShellInput{Resize: &sz}, 16) != nil {
					return
				}
			}
		}
	}
}
