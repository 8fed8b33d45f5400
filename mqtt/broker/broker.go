// Package broker runs an embedded MQTT broker (mochi-mqtt) so a gateway can
// be commanded without an external broker.
//
// Password file format: one "user:password" per line, in plain text (the
// password is everything after the first ':'); blank lines and lines
// starting with '#' are ignored. Keep the file mode 0600: a group- or
// world-readable file is refused.
package broker

import (
	"bufio"
	"bytes"
	"context"
	"crypto/subtle"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/listeners"
	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/rs/zerolog"
)

// DefaultListen is the listener address when none is given.
const DefaultListen = "127.0.0.1:1883"

// Options configure the embedded broker.
type Options struct {
	Listen         string      // host:port; DefaultListen when empty
	TLS            *tls.Config // serve MQTT over TLS when set
	PasswordFile   string      // user:password lines; empty means anonymous
	AllowAnonymous bool        // allow anonymous clients on a non-loopback address
}

// Broker is a running embedded broker. One goroutine of its own (run)
// waits for the end and closes the server; Done says when it has ended.
type Broker struct {
	server    *mqtt.Server
	listener  *listeners.TCP
	closeOnce sync.Once
	stop      chan struct{}
	closed    chan struct{}
	closeErr  error // set by run before it closes closed
}

// Start binds the listener and starts serving. The broker closes when ctx
// ends or Close is called.
func Start(ctx context.Context, opts Options, log zerolog.Logger) (*Broker, error) {
	if opts.Listen == "" {
		opts.Listen = DefaultListen
	}
	log = log.With().Str("component", "broker").Logger()
	var users map[string]string
	if opts.PasswordFile != "" {
		var err error
		if users, err = LoadPasswordFile(opts.PasswordFile); err != nil {
			return nil, err
		}
	} else if !opts.AllowAnonymous {
		loopback, err := isLoopback(opts.Listen)
		if err != nil {
			return nil, err
		}
		if !loopback {
			return nil, fmt.Errorf("start broker on %s: anonymous access on a non-loopback address needs AllowAnonymous (or give a password file)", opts.Listen)
		}
	}

	server := mqtt.New(&mqtt.Options{Logger: newSlogLogger(log), InlineClient: false})
	var err error
	if users != nil {
		err = server.AddHook(&passwordHook{users: users}, nil)
	} else {
		err = server.AddHook(new(allowAllHook), nil)
	}
	if err != nil {
		return nil, fmt.Errorf("start broker: add auth hook: %w", err)
	}
	tcp := listeners.NewTCP(listeners.Config{ID: "mqtt", Address: opts.Listen, TLSConfig: opts.TLS})
	if err := server.AddListener(tcp); err != nil {
		return nil, fmt.Errorf("start broker: listen on %s: %w", opts.Listen, err)
	}
	if err := server.Serve(); err != nil {
		_ = server.Close()
		return nil, fmt.Errorf("start broker on %s: %w", opts.Listen, err)
	}
	b := &Broker{server: server, listener: tcp, stop: make(chan struct{}), closed: make(chan struct{})}
	go b.run(ctx)
	log.Info().Str("addr", b.Addr()).Bool("tls", opts.TLS != nil).Bool("passwords", users != nil).Msg("embedded broker started")
	return b, nil
}

// Addr is the bound host:port (useful with a ":0" listen address).
func (b *Broker) Addr() string { return b.listener.Address() }

// closeTimeout bounds how long Close waits for the broker to stop.
const closeTimeout = 5 * time.Second

// Close stops the broker and disconnects its clients. It waits at most
// closeTimeout: mochi's Close was seen to hang under load (a client
// connecting while it runs), and the agent's shutdown must not hang with
// it; Done then tells when the broker has really stopped.
func (b *Broker) Close() error {
	b.closeOnce.Do(func() { close(b.stop) })
	t := time.NewTimer(closeTimeout)
	defer t.Stop()
	select {
	case <-b.closed:
		return b.closeErr
	case <-t.C:
		return fmt.Errorf("close broker: not stopped after %v; giving up waiting for it", closeTimeout)
	}
}

// Done is closed once the broker has shut down (after Close or the end of
// Start's context).
func (b *Broker) Done() <-chan struct{} { return b.closed }

// run closes the server when ctx ends or Close is called.
func (b *Broker) run(ctx context.Context) {
	defer close(b.closed)
	select {
	case <-ctx.Done():
	case <-b.stop:
	}
	if err := b.server.Close(); err != nil {
		b.closeErr = fmt.Errorf("close broker: %w", err)
	}
}

func isLoopback(listen string) (bool, error) {
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return false, fmt.Errorf("broker listen address %q: %w", listen, err)
	}
	if host == "localhost" {
		return true, nil
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback(), nil
}

// LoadPasswordFile reads user:password lines (see the package comment).
func LoadPasswordFile(path string) (map[string]string, error) {
	info, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("read broker password file: %w", err)
	}
	if info.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("broker password file %s is readable by group or others (mode %v); chmod 600 it", path, info.Mode().Perm())
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read broker password file: %w", err)
	}
	users := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for line := 1; sc.Scan(); line++ {
		text := strings.TrimRight(sc.Text(), "\r")
		if strings.TrimSpace(text) == "" || strings.HasPrefix(strings.TrimSpace(text), "#") {
			continue
		}
		user, pass, ok := strings.Cut(text, ":")
		if !ok || user == "" || pass == "" {
			return nil, fmt.Errorf("broker password file %s line %d: want user:password", path, line)
		}
		users[user] = pass
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read broker password file: %w", err)
	}
	if len(users) == 0 {
		return nil, errors.New("broker password file " + path + " has no users")
	}
	return users, nil
}

// passwordHook admits clients whose username and password match the file;
// every authenticated client may publish and subscribe.
type passwordHook struct {
	mqtt.HookBase
	users map[string]string
}

func (h *passwordHook) ID() string { return "mqlet-password-file" }

func (h *passwordHook) Provides(b byte) bool {
	return b == mqtt.OnConnectAuthenticate || b == mqtt.OnACLCheck
}

func (h *passwordHook) OnConnectAuthenticate(cl *mqtt.Client, pk packets.Packet) bool {
	want, ok := h.users[string(pk.Connect.Username)]
	if !ok {
		// Compare anyway so an unknown user takes as long as a wrong password.
		subtle.ConstantTimeCompare(pk.Connect.Password, pk.Connect.Password)
		return false
	}
	return subtle.ConstantTimeCompare([]byte(want), pk.Connect.Password) == 1
}

func (h *passwordHook) OnACLCheck(cl *mqtt.Client, topic string, write bool) bool { return true }

// allowAllHook admits every client (anonymous mode). Written here rather
// than using mochi's hooks/auth, whose ledger pulls in a YAML module.
type allowAllHook struct{ mqtt.HookBase }

func (h *allowAllHook) ID() string { return "mqlet-allow-all" }

func (h *allowAllHook) Provides(b byte) bool {
	return b == mqtt.OnConnectAuthenticate || b == mqtt.OnACLCheck
}

func (h *allowAllHook) OnConnectAuthenticate(*mqtt.Client, packets.Packet) bool { return true }

func (h *allowAllHook) OnACLCheck(*mqtt.Client, string, bool) bool { return true }
