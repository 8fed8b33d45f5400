package cri

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/gorilla/websocket"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// An interactive exec (exec -it) is the runtime's Exec: the CRI call
// answers a one-time URL of the runtime's streaming server, and the
// command's terminal is carried over a WebSocket to it with the channel
// protocol the kubelet's streaming server speaks (v4.channel.k8s.io): one
// leading byte names the channel (0 stdin, 1 stdout, 2 stderr, 3 the
// final status, 4 terminal size).

// TermSize is a terminal's size in characters.
type TermSize struct {
	Cols, Rows uint16
}

// ShellIO are the ends of an interactive command: Stdin and Resize are
// read until they are closed or the command ends; Stdout gets the
// terminal's output (a tty merges stderr into it) and should not block for
// long, since the runtime's stream waits for it.
type ShellIO struct {
	Stdin  <-chan []byte
	Resize <-chan TermSize
	Stdout func(p []byte) error
	// Opened, when set, is called once the terminal is connected.
	Opened func()
}

// Channel numbers and the subprotocol of the streaming server.
const (
	shellProtocol  = "v4.channel.k8s.io"
	chanStdin      = 0
	chanStdout     = 1
	chanStderr     = 2
	chanStatus     = 3
	chanResize     = 4
	maxShellStatus = 64 << 10 // bytes of the final status kept
	// maxShellFrame bounds one message read from the streaming server.
	maxShellFrame = 1 << 20
	// shellDialTimeout bounds the connection to the streaming server.
	shellDialTimeout = 10 * time.Second
)

// ErrShellEnded says an interactive command's stream ended without a
// final status (the runtime went away, or ctx ended).
var ErrShellEnded = errors.New("the terminal stream ended without an exit status")

// ExecInteractive runs cmd in the running container of the pod with a
// terminal, stdin attached, until it exits or ctx ends, and returns its
// exit code. Cancelling ctx closes the stream, which hangs the terminal up
// (the runtime closes its pty, so the command gets SIGHUP).
func (m *Manager) ExecInteractive(ctx context.Context, pod PodKey, container string, cmd []string, size TermSize, sio ShellIO) (int, error) {
	if err := checkLabelName("container", container); err != nil {
		return 0, fmt.Errorf("exec in pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	svc, err := m.conn.await(ctx, m.cfg.ConnectTimeout)
	if err != nil {
		return 0, err
	}
	c, err := m.attempt(ctx, pod, container, false)
	if err != nil {
		return 0, err
	}
	if c.State != ContainerRunning {
		return 0, fmt.Errorf("%w: container %q in pod %s/%s is not running (%s)", ErrNoContainer, container, pod.Namespace, pod.Name, c.State)
	}
	resp, err := svc.runtime.Exec(ctx, &runtimeapi.ExecRequest{ContainerId: c.ID, Cmd: cmd, Tty: true, Stdin: true, Stdout: true})
	if err != nil {
		return 0, fmt.Errorf("exec in container %s of pod %s/%s: %w", container, pod.Namespace, pod.Name, err)
	}
	code, err := streamShell(ctx, resp.GetUrl(), size, sio)
	if err != nil {
		return 0, fmt.Errorf("exec in container %s of pod %s/%s: %w", container, pod.Namespace, pod.Name, err)
	}
	return code, nil
}

// streamShell carries one terminal over the streaming server's WebSocket
// at rawURL until the command's status arrives.
func streamShell(ctx context.Context, rawURL string, size TermSize, sio ShellIO) (int, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return 0, fmt.Errorf("the runtime's streaming URL: %w", err)
	}
	switch u.Scheme {
	case "http":
		u.Scheme = "ws"
	case "https":
		u.Scheme = "wss"
	default:
		return 0, fmt.Errorf("the runtime's streaming URL has scheme %q (want http or https)", u.Scheme)
	}
	d := websocket.Dialer{Subprotocols: []string{shellProtocol}, HandshakeTimeout: shellDialTimeout, Proxy: nil}
	ws, resp, err := d.DialContext(ctx, u.String(), http.Header{})
	if resp != nil && resp.Body != nil {
		_ = resp.Body.Close()
	}
	if err != nil {
		return 0, fmt.Errorf("connecting to the runtime's streaming server: %w", err)
	}
	if ws.Subprotocol() != shellProtocol {
		_ = ws.Close()
		return 0, fmt.Errorf("the runtime's streaming server speaks %q, not %s", ws.Subprotocol(), shellProtocol)
	}
	ws.SetReadLimit(maxShellFrame)
	if sio.Opened != nil {
		sio.Opened()
	}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel() // before the wait: it ends the writer
	// One writer: gorilla's connection takes one at a time.
	wg.Add(1)
	go func() {
		defer wg.Done()
		writeShell(ctx, ws, size, sio)
	}()
	go func() {
		<-ctx.Done()
		_ = ws.Close() // ends the reader below
	}()
	return readShell(ws, sio.Stdout)
}

// writeShell sends the first size, then stdin and resizes, until ctx ends.
func writeShell(ctx context.Context, ws *websocket.Conn, size TermSize, sio ShellIO) {
	send := func(ch byte, p []byte) bool {
		msg := make([]byte, 1+len(p))
		msg[0] = ch
		copy(msg[1:], p)
		return ws.WriteMessage(websocket.BinaryMessage, msg) == nil
	}
	resize := func(s TermSize) bool {
		b, _ := json.Marshal(struct{ Width, Height uint16 }{s.Cols, s.Rows}) // two numbers always encode
		return send(chanResize, b)
	}
	if size.Cols > 0 && size.Rows > 0 && !resize(size) {
		return
	}
	stdin, sizes := sio.Stdin, sio.Resize
	for stdin != nil || sizes != nil {
		select {
		case <-ctx.Done():
			return
		case p, ok := <-stdin:
			if !ok {
				stdin = nil
				continue
			}
			if !send(chanStdin, p) {
				return
			}
		case s, ok := <-sizes:
			if !ok {
				sizes = nil
				continue
			}
			if !resize(s) {
				return
			}
		}
	}
	<-ctx.Done()
}

// readShell hands the terminal's output on until the status arrives and
// returns the exit code it carries.
func readShell(ws *websocket.Conn, stdout func([]byte) error) (int, error) {
	var status []byte
	for {
		_, msg, err := ws.ReadMessage()
		if err != nil {
			if status != nil {
				return exitCodeOf(status)
			}
			if errors.Is(err, io.ErrUnexpectedEOF) || websocket.IsCloseError(err, websocket.CloseNormalClosure) || errors.Is(err, net.ErrClosed) {
				return 0, ErrShellEnded
			}
			return 0, fmt.Errorf("%w: %w", ErrShellEnded, err)
		}
		if len(msg) < 2 {
			continue // the server's opening frames carry no data
		}
		switch msg[0] {
		case chanStdout, chanStderr:
			if err := stdout(msg[1:]); err != nil {
				return 0, err
			}
		case chanStatus:
			if len(status)+len(msg)-1 <= maxShellStatus {
				status = append(status, msg[1:]...)
			}
		}
	}
}

// exitCodeOf reads the v4 status: Success, or a Failure whose reason is
// NonZeroExitCode with the code as the message of an ExitCode cause.
func exitCodeOf(status []byte) (int, error) {
	var st struct {
		Status  string `json:"status"`
		Message string `json:"message"`
		Reason  string `json:"reason"`
		Details struct {
			Causes []struct {
				Type    string `json:"reason"`
				Message string `json:"message"`
			} `json:"causes"`
		} `json:"details"`
	}
	if err := json.Unmarshal(status, &st); err != nil {
		return 0, fmt.Errorf("the runtime's exit status is not JSON: %w", err)
	}
	if st.Status == "Success" {
		return 0, nil
	}
	if st.Reason == "NonZeroExitCode" {
		for _, c := range st.Details.Causes {
			if c.Type == "ExitCode" {
				code, err := strconv.Atoi(c.Message)
				if err != nil || code < 0 || code > 255 {
					return 0, fmt.Errorf("the runtime's exit status names exit code %q", c.Message)
				}
				return code, nil
			}
		}
	}
	return 0, fmt.Errorf("the runtime could not run the command: %s", st.Message)
}
