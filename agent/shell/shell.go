// Package shell runs the interactive sessions of exec -it: one command with
// a terminal in a container (the runtime's ExecInteractive), whose input
// and output travel as numbered messages on the request's MQTT topics
// (apiv1.ShellInput on <prefix>/<node>/in/<requestId>, apiv1.ShellOutput
// on <prefix>/<node>/out/<requestId>), ordered and flow-controlled by
// internal/shellwire.
//
// Everything from MQTT is hostile: a message over its bounds, out of
// sequence beyond the window, acknowledging output never sent, or arriving
// faster than the session takes it ends the session; nothing is buffered
// without a bound. A session also ends when its context does (cancel, the
// requester gone silent, the agent stopping) and after IdleTimeout without
// input or output.
package shell

import (
	"context"
	"crypto/hmac"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/rs/zerolog"

	apiv1 "github.com/mqlet/mqlet/api/v1"
	"github.com/mqlet/mqlet/cri"
	"github.com/mqlet/mqlet/internal/redact"
	"github.com/mqlet/mqlet/internal/shellwire"
)

// Runtime runs a command with a terminal (cri.Manager.ExecInteractive).
type Runtime interface {
	ExecInteractive(ctx context.Context, pod cri.PodKey, container string, cmd []string, size cri.TermSize, sio cri.ShellIO) (int, error)
}

// Publisher sends one message and waits for the broker to take it.
type Publisher interface {
	Publish(ctx context.Context, topic string, payload []byte) error
}

// Errors a session ends with.
var (
	ErrIdle       = errors.New("idle")
	ErrBadInput   = errors.New("bad input")
	ErrFlooded    = errors.New("input arrived faster than the terminal took it")
	ErrDuplicate  = errors.New("a session with this request id runs")
	errOutputLost = errors.New("publishing the terminal's output")
)

// inboxSize bounds the input messages waiting for a session: the
// requester's window (apiv1.ShellInputWindow) and heartbeats fit many
// times over.
const inboxSize = apiv1.ShellMaxAhead + 64

// ackEvery: input is acknowledged at once when this many bytes of it are
// unacknowledged, else with the next output or after ackDelay.
const (
	ackEvery = apiv1.ShellInputWindow / 4
	ackDelay = 100 * time.Millisecond
)

// Manager holds the running sessions by request id.
type Manager struct {
	rt   Runtime
	out  Publisher
	idle time.Duration
	log  zerolog.Logger

	mu       sync.Mutex
	sessions map[string]*entry
}

// entry is a running session as Input sees it.
type entry struct {
	inbox chan []byte
	end   context.CancelCauseFunc
}

// New returns a Manager; idle ends a session without input or output for
// that long (0: never).
func New(rt Runtime, out Publisher, idle time.Duration, log zerolog.Logger) *Manager {
	return &Manager{rt: rt, out: out, idle: idle, log: log, sessions: map[string]*entry{}}
}

// Input hands one message of the input topic of request id to its session;
// it reports whether a session runs under id. A session that cannot take
// it (its inbox is full) ends with ErrFlooded.
func (m *Manager) Input(id string, payload []byte) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.sessions[id]
	if !ok {
		return false
	}
	select {
	case e.inbox <- payload:
	default:
		e.end(ErrFlooded) // later messages find no session
		delete(m.sessions, id)
	}
	return true
}

// Len is how many sessions run.
func (m *Manager) Len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.sessions)
}

// Spec is what a session runs.
type Spec struct {
	RequestID string
	// OutputTopic is where its output goes.
	OutputTopic string
	Pod         cri.PodKey
	Container   string
	Command     []string
	Size        apiv1.TermSize
	// Scrub replaces the values of the pod's secrets in the output (nil:
	// nothing is replaced).
	Scrub *redact.Scrubber
	// Opened is called once the terminal is connected: the requester may
	// send input from then on.
	Opened func()
	// InputKey, when set, authenticates every input message (its MAC,
	// apiv1.ShellInputMAC); a message without the right one ends the
	// session.
	InputKey []byte
}

// Run runs one session until the command exits (its exit code, nil) or
// the session ends otherwise (an error; ctx's cause when ctx ended).
func (m *Manager) Run(ctx context.Context, s Spec) (int, error) {
	inbox := make(chan []byte, inboxSize)
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(context.Canceled)
	e := &entry{inbox: inbox, end: cancel}
	m.mu.Lock()
	if _, dup := m.sessions[s.RequestID]; dup {
		m.mu.Unlock()
		return 0, ErrDuplicate
	}
	m.sessions[s.RequestID] = e
	m.mu.Unlock()
	defer func() {
		m.mu.Lock()
		if m.sessions[s.RequestID] == e {
			delete(m.sessions, s.RequestID)
		}
		m.mu.Unlock()
	}()
	ss := &session{
		m: m, spec: s, ctx: ctx, end: cancel,
		window:  shellwire.NewWindow(apiv1.ShellOutputWindow),
		reorder: shellwire.NewReorder(apiv1.ShellMaxAhead, 2*apiv1.ShellInputWindow),
		stdin:   make(chan []byte, 16),
		resize:  make(chan cri.TermSize, 4),
		pending: make(chan struct{}, 1),
		acked:   make(chan struct{}, 1),
		scrub:   redact.NewStream(s.Scrub),
		active:  make(chan struct{}, 1),
	}
	var wg sync.WaitGroup
	wg.Add(3)
	go func() { defer wg.Done(); ss.readInput(inbox) }()
	go func() { defer wg.Done(); ss.sendOutput() }()
	go func() { defer wg.Done(); ss.watchIdle() }()
	size := cri.TermSize{Cols: s.Size.Cols, Rows: s.Size.Rows}
	code, err := m.rt.ExecInteractive(ctx, s.Pod, s.Container, s.Command, size, cri.ShellIO{Stdin: ss.stdin, Resize: ss.resize, Stdout: ss.write, Opened: s.Opened})
	if cause := context.Cause(ctx); cause != nil {
		err = cause // the stream ended because the session did
	}
	if err == nil {
		err = ss.finish(int32(code))
	}
	cancel(context.Canceled)
	wg.Wait()
	if err != nil {
		return 0, err
	}
	return code, nil
}

// session is one running terminal.
type session struct {
	m    *Manager
	spec Spec
	ctx  context.Context
	end  context.CancelCauseFunc

	window  *shellwire.Window
	reorder *shellwire.Reorder // touched by readInput only
	stdin   chan []byte
	resize  chan cri.TermSize
	scrub   *redact.Stream // touched by write only

	mu       sync.Mutex
	buf      []byte // output not yet published
	ackInput uint64 // input messages handed on
	ackBytes int    // input bytes handed on since the last ack sent
	ackSent  uint64
	pending  chan struct{} // output or an ack waits (1 slot)
	acked    chan struct{} // buf shrank (1 slot)
	active   chan struct{} // input or output was seen (1 slot), for the idle bound
}

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// write takes the terminal's output: it waits while more than the window
// is buffered, so a requester that reads slowly slows the command.
func (s *session) write(p []byte) error {
	text := s.scrub.Next(string(p))
	for {
		s.mu.Lock()
		if len(s.buf) < apiv1.ShellOutputWindow {
			s.buf = append(s.buf, text...)
			s.mu.Unlock()
			signal(s.pending)
			signal(s.active)
			return nil
		}
		s.mu.Unlock()
		select {
		case <-s.acked:
		case <-s.ctx.Done():
			return context.Cause(s.ctx)
		}
	}
}

// sendOutput publishes buffered output, each message carrying the
// acknowledgement of the input handed on; input acknowledged by no output
// goes alone once ackEvery bytes or ackDelay have passed.
func (s *session) sendOutput() {
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	armed := false
	for {
		fired := false
		select {
		case <-s.ctx.Done():
			return
		case <-s.pending:
		case <-timer.C:
			fired, armed = true, false
		}
		for {
			s.mu.Lock()
			n := min(len(s.buf), apiv1.ShellMaxData)
			data := append([]byte(nil), s.buf[:n]...)
			ack := s.ackInput
			owed := ack > s.ackSent
			urgent := s.ackBytes >= ackEvery
			s.mu.Unlock()
			if n == 0 && (!owed || !(urgent || fired)) {
				if owed && !armed {
					timer.Reset(ackDelay)
					armed = true
				}
				break
			}
			msg := apiv1.ShellOutput{Data: data}
			if n > 0 {
				seq, err := s.window.Reserve(s.ctx, n)
				if err != nil {
					return
				}
				msg.Seq = seq
			}
			if owed {
				msg.Ack = ack
			}
			if err := s.publish(msg); err != nil {
				s.end(err)
				return
			}
			s.mu.Lock()
			s.buf = s.buf[n:]
			if msg.Ack > s.ackSent {
				s.ackSent, s.ackBytes = msg.Ack, 0
			}
			s.mu.Unlock()
			signal(s.acked)
		}
	}
}

func (s *session) publish(msg apiv1.ShellOutput) error {
	b, err := json.Marshal(msg)
	if err != nil {
		return err
	}
	if err := s.m.out.Publish(s.ctx, s.spec.OutputTopic, b); err != nil {
		return fmt.Errorf("%w: %w", errOutputLost, err)
	}
	return nil
}

// finish publishes the rest of the output and the exit code, in sequence
// after it.
func (s *session) finish(code int32) error {
	if rest := s.scrub.Flush(); rest != "" {
		if err := s.write([]byte(rest)); err != nil {
			return err
		}
	}
	// Wait for the sender to empty the buffer.
	for {
		s.mu.Lock()
		empty := len(s.buf) == 0
		s.mu.Unlock()
		if empty {
			break
		}
		select {
		case <-s.acked:
		case <-s.ctx.Done():
			return context.Cause(s.ctx)
		}
	}
	seq, err := s.window.Reserve(s.ctx, 0)
	if err != nil {
		return err
	}
	s.mu.Lock()
	ack := s.ackInput
	s.mu.Unlock()
	return s.publish(apiv1.ShellOutput{Seq: seq, Exit: &code, Ack: ack})
}

// readInput takes the requester's messages in order until the session
// ends; a bad one ends it.
func (s *session) readInput(inbox <-chan []byte) {
	for {
		select {
		case <-s.ctx.Done():
			return
		case payload := <-inbox:
			if len(payload) == 0 {
				continue // a heartbeat: the requester still reads
			}
			if err := s.input(payload); err != nil {
				s.end(err)
				return
			}
		}
	}
}

func (s *session) input(payload []byte) error {
	in, err := apiv1.DecodeShellInput(payload)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrBadInput, err)
	}
	switch key := s.spec.InputKey; {
	case key == nil && in.MAC != nil:
		return fmt.Errorf("%w: a MAC, but the session has no input key", ErrBadInput)
	case key != nil && !hmac.Equal(in.MAC, apiv1.ShellInputMAC(key, s.spec.RequestID, in)):
		return fmt.Errorf("%w: the message's MAC is not the session key's (not from its requester)", ErrBadInput)
	}
	if in.Ack > 0 {
		if err := s.window.Ack(in.Ack); err != nil {
			return fmt.Errorf("%w: %w", ErrBadInput, err)
		}
	}
	if in.Seq == 0 {
		return nil
	}
	ready, err := s.reorder.Add(in.Seq, payload)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrBadInput, err)
	}
	for _, raw := range ready {
		m, _ := apiv1.DecodeShellInput(raw) // decoded once already
		// Acknowledged before it is handed on: input that ends the command
		// (exit) lets the exit message go before code after the handing on
		// runs, and that message must acknowledge it. If the hand-on fails
		// the session is over, and the ack with it. The window grows early
		// by this one message at most.
		s.mu.Lock()
		s.ackInput = m.Seq
		s.ackBytes += len(m.Data)
		s.mu.Unlock()
		if len(m.Data) > 0 {
			select {
			case s.stdin <- m.Data:
			case <-s.ctx.Done():
				return nil
			}
		}
		if m.Resize != nil {
			select {
			case s.resize <- cri.TermSize{Cols: m.Resize.Cols, Rows: m.Resize.Rows}:
			case <-s.ctx.Done():
				return nil
			}
		}
		signal(s.active)
	}
	if len(ready) > 0 {
		signal(s.pending)
	}
	return nil
}

// watchIdle ends the session after the idle bound without input or
// output.
func (s *session) watchIdle() {
	if s.m.idle <= 0 {
		return
	}
	t := time.NewTimer(s.m.idle)
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-s.active:
			if !t.Stop() {
				select {
				case <-t.C:
				default:
				}
			}
			t.Reset(s.m.idle)
		case <-t.C:
			s.end(fmt.Errorf("%w: no input or output for %s", ErrIdle, s.m.idle))
			return
		}
	}
}
