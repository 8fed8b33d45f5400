// Package session keeps mqlet's MQTT broker session: it connects with
// paho.mqtt.golang to one of its brokers, reconnects (failing over to the
// next broker) with capped exponential backoff and full jitter, subscribes the command filter on every connect, hands inbound
// commands to a handler before they are acknowledged, and publishes with
// broker acknowledgement. It satisfies outbox.Publisher.
package session

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	"github.com/rs/zerolog"

	"github.com/mqlet/mqlet/mqtt/outbox"
)

// ErrNotConnected is returned by Send and Publish while no connection is up.
var ErrNotConnected = errors.New("mqtt session not connected")

// Defaults for zero Options fields.
const (
	DefaultKeepAlive      = 30 * time.Second
	DefaultPingTimeout    = 10 * time.Second
	DefaultConnectTimeout = 30 * time.Second
	DefaultReconnectMin   = time.Second
	DefaultReconnectMax   = 2 * time.Minute
	DefaultStableAfter    = time.Minute
	DefaultMaxInflight    = 32
	DefaultWriteTimeout   = 30 * time.Second
)

// Inbound is one message received on the command subscription.
type Inbound struct {
	Topic   string
	Payload []byte
	// Retained is set when the broker delivered a stored retained message
	// (replayed on every subscribe), not a fresh publication.
	Retained bool
	// Duplicate is the MQTT DUP flag: the broker may have sent it before.
	Duplicate bool
	// Ack sends the QoS 1 acknowledgement. With Options.ManualAck the
	// handler must call it once the message's effect is persisted (from any
	// goroutine, at most once counts); otherwise it does nothing and the
	// acknowledgement follows the handler's return. An Ack after the
	// connection was lost is dropped: the broker redelivers the message.
	Ack func()
}

// Options configure a Session.
type Options struct {
	BrokerURL string // tcp://, ssl://, ws:// or wss://; the one-element case of Brokers
	// Brokers, when set (instead of BrokerURL), are tried in turn: a lost
	// connection is retried on its broker first (it holds the session), and
	// each failed attempt moves on to the next, in list order, so a dead
	// broker costs one attempt. A connection stays on its broker until it
	// is lost; nothing moves back to an earlier broker by itself.
	Brokers  []string
	ClientID string // ClientID(node) by convention
	Username string
	Password string      // never logged
	TLS      *tls.Config // for ssl:// and wss://; see TLSConfig

	KeepAlive      time.Duration
	PingTimeout    time.Duration
	ConnectTimeout time.Duration
	ReconnectMin   time.Duration
	ReconnectMax   time.Duration
	// StableAfter is how long a connection must last for the backoff to
	// start again from ReconnectMin, so a broker that accepts and then drops
	// us at once is not hammered.
	StableAfter time.Duration

	// CleanSession false (the default) keeps a persistent session, so QoS 1
	// commands sent while we were away are delivered on reconnect.
	CleanSession bool
	// Will is published by the broker if the connection dies without a
	// DISCONNECT; it is always sent retained.
	Will *outbox.Message

	// CommandFilters are subscribed at QoS 1 on every connect;
	// SetCommandFilters changes them.
	CommandFilters []string
	// InputFilter, when set, is subscribed at QoS 1 on every connect: the
	// input of running requests (readers' heartbeats, an interactive
	// session's keystrokes), which nothing persists.
	InputFilter string
	// Handler receives every inbound message, one at a time, in order.
	// paho sends the QoS 1 acknowledgement only after it returns (or, with
	// ManualAck, when the handler calls m.Ack), so a handler that stores the
	// command first never loses it. It must not block for long nor publish
	// synchronously.
	Handler func(m Inbound)
	// WatchFilter, when set, is subscribed at QoS 0 on every connect after
	// the command filters; its messages go to WatchHandler (Ack does nothing),
	// never to Handler. A refused watch subscription is logged, not fatal.
	WatchFilter  string
	WatchHandler func(m Inbound)
	// ManualAck leaves the acknowledgement to Inbound.Ack, so a handler can
	// queue messages and persist many at once before acknowledging them.
	ManualAck bool
	// OnConnect runs after each connect's subscription and before Connected
	// is signalled, e.g. to publish the birth state with Publish. An error
	// drops the connection and reconnects.
	OnConnect func(ctx context.Context) error

	// MaxInflight bounds QoS>0 publications awaiting the broker's ack.
	MaxInflight int

	// RandInt63n draws the jitter in [0, n); nil uses math/rand/v2.
	RandInt63n func(n int64) int64
}

func noAck() {}

// ClientID is the conventional MQTT client id of a node.
func ClientID(node string) string { return "mqlet-" + node }

// Stats are the session's counters.
type Stats struct {
	Connected       bool
	MessagesIn      uint64
	MessagesOut     uint64 // publications confirmed by the broker (or written, QoS 0)
	Connects        uint64
	Reconnects      uint64 // successful connects after the first
	ConnectFailures uint64
	Failovers       uint64 // connects to another broker than the last one
}

// Session is one logical MQTT session spanning many connections.
type Session struct {
	opts Options
	log  zerolog.Logger

	mu      sync.Mutex
	active  *conn    // usable connection, nil when none
	epoch   *epoch   // signals of the current or next connection
	filters []string // subscribed at the next connect (opts.CommandFilters, then SetCommandFilters)

	stop     chan struct{} // closed by Disconnect
	stopOnce sync.Once

	messagesIn, messagesOut, connects, connectFailures, failovers atomic.Uint64
	// broker is the index in opts.Brokers of the current or last
	// connection; written by Run only.
	broker atomic.Int64
}

// epoch is one connection's lifetime as seen by the outbox.
type epoch struct{ up, down chan struct{} }

func newEpoch() *epoch { return &epoch{up: make(chan struct{}), down: make(chan struct{})} }

// conn is one paho client connected to the broker.
type conn struct {
	client   paho.Client
	lost     chan struct{}
	lostOnce sync.Once
	lostErr  error
	slots    chan struct{} // in-flight QoS>0 publications
}

func (c *conn) markLost(err error) {
	c.lostOnce.Do(func() {
		c.lostErr = err
		close(c.lost)
	})
}

func (c *conn) isLost() bool {
	select {
	case <-c.lost:
		return true
	default:
		return false
	}
}

// New validates opts and returns an unconnected session; call Run.
func New(opts Options, log zerolog.Logger) (*Session, error) {
	switch {
	case len(opts.Brokers) == 0:
		opts.Brokers = []string{opts.BrokerURL}
	case opts.BrokerURL != "":
		return nil, errors.New("mqtt session: BrokerURL and Brokers both set (BrokerURL is the one-element case)")
	default:
		opts.Brokers = slices.Clone(opts.Brokers)
	}
	for _, b := range opts.Brokers {
		if err := ValidateBrokerURL(b); err != nil {
			return nil, err
		}
	}
	if opts.ClientID == "" {
		return nil, errors.New("mqtt session: empty client id")
	}
	if opts.Handler == nil {
		return nil, errors.New("mqtt session: no inbound handler")
	}
	if opts.Will != nil && opts.Will.Topic == "" {
		return nil, errors.New("mqtt session: will has an empty topic")
	}
	setDefault(&opts.KeepAlive, DefaultKeepAlive)
	setDefault(&opts.PingTimeout, DefaultPingTimeout)
	setDefault(&opts.ConnectTimeout, DefaultConnectTimeout)
	setDefault(&opts.ReconnectMin, DefaultReconnectMin)
	setDefault(&opts.ReconnectMax, DefaultReconnectMax)
	setDefault(&opts.StableAfter, DefaultStableAfter)
	if opts.ReconnectMax < opts.ReconnectMin {
		opts.ReconnectMax = opts.ReconnectMin
	}
	if opts.MaxInflight <= 0 {
		opts.MaxInflight = DefaultMaxInflight
	}
	if opts.RandInt63n == nil {
		opts.RandInt63n = rand.Int64N
	}
	return &Session{
		opts:    opts,
		filters: slices.Clone(opts.CommandFilters),
		log:     log.With().Str("component", "mqtt").Str("clientId", opts.ClientID).Logger(),
		epoch:   newEpoch(),
		stop:    make(chan struct{}),
	}, nil
}

func setDefault(d *time.Duration, def time.Duration) {
	if *d <= 0 {
		*d = def
	}
}

// BrokerID names a broker by its URL without user info: the identity under
// which what a broker is owed is kept, never holding a secret.
func BrokerID(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return ""
	}
	u.User = nil
	return u.String()
}

// Broker is the identity (BrokerID) of the broker of the current or last
// connection (the first broker before any).
func (s *Session) Broker() string { return BrokerID(s.opts.Brokers[s.broker.Load()]) }

// BrokerIDs are the identities of the session's brokers, in order.
func (o Options) BrokerIDs() []string {
	list := o.Brokers
	if len(list) == 0 {
		list = []string{o.BrokerURL}
	}
	ids := make([]string, len(list))
	for i, b := range list {
		ids[i] = BrokerID(b)
	}
	return ids
}

// redacted is raw for a log line: its password, if any, masked.
func redacted(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable broker URL)"
	}
	return u.Redacted()
}

// ValidateBrokerURL accepts tcp://, ssl://, ws:// and wss:// URLs with a host
// (and port for tcp/ssl).
func ValidateBrokerURL(raw string) error {
	if raw == "" {
		return errors.New("broker URL is empty (want tcp://host:port, ssl://host:port, ws://host/path or wss://host/path)")
	}
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("broker URL: %w", err)
	}
	switch u.Scheme {
	case "tcp", "ssl":
		if u.Hostname() == "" || u.Port() == "" {
			return fmt.Errorf("broker URL %q: %s:// needs host:port", u.Redacted(), u.Scheme)
		}
	case "ws", "wss":
		if u.Hostname() == "" {
			return fmt.Errorf("broker URL %q: needs a host", u.Redacted())
		}
	default:
		return fmt.Errorf("broker URL %q: scheme %q not supported (use tcp://, ssl://, ws:// or wss://)", u.Redacted(), u.Scheme)
	}
	return nil
}

// TLSConfig builds a client TLS config: caFile (PEM) replaces the system
// roots when given; certFile and keyFile (both or neither) add a client
// certificate for mTLS.
func TLSConfig(caFile, certFile, keyFile string, insecureSkipVerify bool) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: insecureSkipVerify} //nolint:gosec // opt-in for lab brokers
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("read broker CA file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("broker CA file %s holds no PEM certificate", caFile)
		}
		cfg.RootCAs = pool
	}
	if (certFile == "") != (keyFile == "") {
		return nil, errors.New("client certificate and key must be given together")
	}
	if certFile != "" {
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("load client certificate: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

// BackoffDelay is the wait before reconnect attempt number attempt (0 for
// the first retry): a uniformly random duration in [0, min(max, min·2^attempt))
// ("full jitter"), drawn with randInt63n.
func BackoffDelay(attempt int, min, max time.Duration, randInt63n func(int64) int64) time.Duration {
	ceiling := min
	for i := 0; i < attempt && ceiling < max; i++ {
		ceiling *= 2
	}
	if ceiling > max {
		ceiling = max
	}
	if ceiling <= 0 {
		return 0
	}
	return time.Duration(randInt63n(int64(ceiling)))
}

// Stats returns the current counters.
func (s *Session) Stats() Stats {
	s.mu.Lock()
	connected := s.active != nil
	s.mu.Unlock()
	connects := s.connects.Load()
	var reconnects uint64
	if connects > 0 {
		reconnects = connects - 1
	}
	return Stats{
		Connected:       connected,
		MessagesIn:      s.messagesIn.Load(),
		MessagesOut:     s.messagesOut.Load(),
		Connects:        connects,
		Reconnects:      reconnects,
		ConnectFailures: s.connectFailures.Load(),
		Failovers:       s.failovers.Load(),
	}
}

// Connection returns the signals of the current or next connection: up is
// closed once it is subscribed and OnConnect ran, down once it is lost.
func (s *Session) Connection() (up, down <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.epoch.up, s.epoch.down
}

// Connected returns a channel closed once the current or next connection is up.
func (s *Session) Connected() <-chan struct{} {
	up, _ := s.Connection()
	return up
}

type delivery struct{ tok paho.Token }

func (d delivery) Done() <-chan struct{} { return d.tok.Done() }
func (d delivery) Err() error            { return d.tok.Error() }

// Send hands m to the current connection without waiting for the broker's
// acknowledgement; sends go out in call order. It waits (bounded by ctx) for
// a free in-flight slot.
func (s *Session) Send(ctx context.Context, m outbox.Message) (outbox.Delivery, error) {
	d, _, err := s.send(ctx, m)
	return d, err
}

func (s *Session) send(ctx context.Context, m outbox.Message) (outbox.Delivery, *conn, error) {
	s.mu.Lock()
	c := s.active
	s.mu.Unlock()
	if c == nil {
		return nil, nil, ErrNotConnected
	}
	if m.QoS > 0 {
		select {
		case c.slots <- struct{}{}:
		case <-c.lost:
			return nil, nil, ErrNotConnected
		case <-ctx.Done():
			return nil, nil, fmt.Errorf("wait for an in-flight slot to publish %s: %w", m.Topic, ctx.Err())
		}
	}
	tok := c.client.Publish(m.Topic, m.QoS, m.Retained, m.Payload)
	// The watcher lives until the broker answers or this connection is lost.
	go func() {
		select {
		case <-tok.Done():
		case <-c.lost:
		}
		// Counted when acknowledged, also when the link was lost after the
		// ack but before this goroutine ran (a select picks at random).
		select {
		case <-tok.Done():
			if tok.Error() == nil {
				s.messagesOut.Add(1)
			}
		default:
		}
		if m.QoS > 0 {
			<-c.slots
		}
	}()
	return delivery{tok}, c, nil
}

// Publish sends m and waits for the broker's acknowledgement (QoS 1/2) or
// the write (QoS 0), the loss of the connection, or ctx.
func (s *Session) Publish(ctx context.Context, m outbox.Message) error {
	d, c, err := s.send(ctx, m)
	if err != nil {
		return fmt.Errorf("publish %s: %w", m.Topic, err)
	}
	select {
	case <-d.Done():
		if err := d.Err(); err != nil {
			return fmt.Errorf("publish %s: %w", m.Topic, err)
		}
		return nil
	case <-c.lost:
		return fmt.Errorf("publish %s: %w", m.Topic, ErrNotConnected)
	case <-ctx.Done():
		return fmt.Errorf("publish %s: %w", m.Topic, ctx.Err())
	}
}

// Disconnect ends the session cleanly: it sends DISCONNECT (so the broker
// discards the will), waiting up to quiesce for pending work, and makes Run
// return nil.
func (s *Session) Disconnect(quiesce time.Duration) {
	s.stopOnce.Do(func() { close(s.stop) })
	s.mu.Lock()
	c := s.active
	s.active = nil
	s.mu.Unlock()
	if c != nil {
		c.client.Disconnect(uint(quiesce.Milliseconds()))
		c.markLost(errors.New("disconnected on request"))
	}
}

// Run connects and keeps reconnecting until ctx ends (it then disconnects
// cleanly and returns ctx.Err()) or Disconnect is called (it returns nil).
//
// With several brokers, a lost connection is retried on its broker, and
// every failed attempt moves to the next broker; the backoff grows with each
// failed attempt whatever the broker, so a fleet losing a broker spreads
// over the others with jitter instead of arriving at once.
func (s *Session) Run(ctx context.Context) error {
	attempt := 0
	next := 0 // index in opts.Brokers of the next attempt
	for {
		if s.stopped() {
			return nil
		}
		c, err := s.connect(ctx, next)
		if err == nil {
			var stable bool
			stable, err = s.serve(ctx, c)
			if stable {
				attempt = 0
			}
		} else {
			next = (next + 1) % len(s.opts.Brokers)
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if s.stopped() {
			return nil
		}
		delay := BackoffDelay(attempt, s.opts.ReconnectMin, s.opts.ReconnectMax, s.opts.RandInt63n)
		attempt++
		s.log.Warn().Err(err).Dur("retryIn", delay).Int("attempt", attempt).Str("nextBroker", redacted(s.opts.Brokers[next])).Msg("mqtt connection down; reconnecting")
		timer := time.NewTimer(delay)
		select {
		case <-timer.C:
		case <-ctx.Done():
			timer.Stop()
			return ctx.Err()
		case <-s.stop:
			timer.Stop()
			return nil
		}
	}
}

func (s *Session) stopped() bool {
	select {
	case <-s.stop:
		return true
	default:
		return false
	}
}

// connect makes one connection attempt: CONNECT, then SUBSCRIBE of the
// command filter, then OnConnect.
func (s *Session) connect(ctx context.Context, broker int) (*conn, error) {
	c := &conn{lost: make(chan struct{}), slots: make(chan struct{}, s.opts.MaxInflight)}
	po := paho.NewClientOptions().
		AddBroker(s.opts.Brokers[broker]).
		SetClientID(s.opts.ClientID).
		SetUsername(s.opts.Username).
		SetPassword(s.opts.Password).
		SetCleanSession(s.opts.CleanSession).
		SetAutoReconnect(false). // Run owns reconnection and its backoff
		SetConnectRetry(false).
		SetResumeSubs(false).
		SetOrderMatters(true). // handler runs synchronously, in order
		SetAutoAckDisabled(s.opts.ManualAck).
		SetKeepAlive(s.opts.KeepAlive).
		SetPingTimeout(s.opts.PingTimeout).
		SetConnectTimeout(s.opts.ConnectTimeout).
		SetWriteTimeout(DefaultWriteTimeout).
		SetDefaultPublishHandler(func(_ paho.Client, m paho.Message) {
			s.messagesIn.Add(1)
			// A persistent session may deliver the watch filter's messages
			// before this connection subscribed it again: routed by topic,
			// they never reach the command handler.
			if s.opts.WatchFilter != "" && MatchFilter(s.opts.WatchFilter, m.Topic()) {
				if s.opts.WatchHandler != nil {
					s.opts.WatchHandler(Inbound{Topic: m.Topic(), Payload: m.Payload(), Retained: m.Retained(), Duplicate: m.Duplicate(), Ack: noAck})
				}
				if s.opts.ManualAck {
					m.Ack()
				}
				return
			}
			ack := noAck
			if s.opts.ManualAck {
				ack = m.Ack
			}
			s.opts.Handler(Inbound{Topic: m.Topic(), Payload: m.Payload(), Retained: m.Retained(), Duplicate: m.Duplicate(), Ack: ack})
		}).
		SetConnectionLostHandler(func(_ paho.Client, err error) { c.markLost(err) })
	if s.opts.TLS != nil {
		po.SetTLSConfig(s.opts.TLS)
	}
	if w := s.opts.Will; w != nil {
		po.SetBinaryWill(w.Topic, w.Payload, w.QoS, true)
	}
	c.client = paho.NewClient(po)

	fail := func(what string, err error) (*conn, error) {
		s.connectFailures.Add(1)
		// A clean DISCONNECT, so a connection we give up on during setup
		// does not make the broker publish the will.
		c.client.Disconnect(uint(failQuiesce.Milliseconds()))
		c.markLost(err)
		return nil, fmt.Errorf("%s %s: %w", what, redacted(s.opts.Brokers[broker]), err)
	}
	if err := s.wait(ctx, c, c.client.Connect()); err != nil {
		return fail("connect to broker", err)
	}
	s.mu.Lock()
	filters := slices.Clone(s.filters)
	s.mu.Unlock()
	if len(filters) > 0 {
		if err := s.subscribeAll(ctx, c, filters); err != nil {
			return fail("subscribe "+strings.Join(filters, " "), err)
		}
	}
	// A broker whose ACL predates the input topics refuses this one: the
	// node still runs, and its followers end when their unread bound passes.
	if s.opts.InputFilter != "" {
		// QoS 1: an interactive session's keystrokes must not be lost
		// (a reader's heartbeats are published at QoS 0 and stay so).
		if err := s.subscribe(ctx, c, s.opts.InputFilter, 1); err != nil {
			s.log.Warn().Err(err).Str("filter", s.opts.InputFilter).Msg("not subscribed to the input of running requests; a followed log ends after logs.unreadTimeout (grant the node read on it in the broker's ACL)")
		}
	}
	if s.opts.WatchFilter != "" {
		if err := s.subscribe(ctx, c, s.opts.WatchFilter, 0); err != nil {
			if c.isLost() {
				return fail("subscribe "+s.opts.WatchFilter, err)
			}
			s.log.Warn().Err(err).Str("filter", s.opts.WatchFilter).Msg("watch subscription refused (the broker's ACL must let the node read it); going on without it")
		}
	}
	if prev := s.broker.Swap(int64(broker)); prev != int64(broker) {
		s.failovers.Add(1)
	}
	s.mu.Lock()
	s.active = c
	now := slices.Clone(s.filters)
	s.mu.Unlock()
	// Changed while this connection subscribed: catch up.
	if !slices.Equal(now, filters) {
		if err := s.refilter(ctx, c, filters, now); err != nil {
			s.deactivate(c)
			return fail("subscribe", err)
		}
	}
	if s.opts.OnConnect != nil {
		hookCtx, cancel := context.WithCancel(ctx)
		// The hook's context also ends if this connection drops under it.
		go func() {
			select {
			case <-c.lost:
				cancel()
			case <-hookCtx.Done():
			}
		}()
		err := s.opts.OnConnect(hookCtx)
		cancel()
		if err != nil {
			s.deactivate(c)
			return fail("on-connect hook", err)
		}
	}
	return c, nil
}

// subscribeTries bounds SUBSCRIBE retries: a broker may refuse one whose
// packet id collides with a message it is redelivering from the persistent
// session (mochi answers 0x91); the retry gets the next id.
const subscribeTries = 3

// failQuiesce is how long a connection abandoned during setup may take to
// send its DISCONNECT.
const failQuiesce = 100 * time.Millisecond

func (s *Session) subscribe(ctx context.Context, c *conn, filter string, qos byte) error {
	var err error
	for try := 0; try < subscribeTries; try++ {
		tok := c.client.Subscribe(filter, qos, nil) // nil: the default handler
		if err = s.wait(ctx, c, tok); err != nil {
			return err
		}
		granted := tok.(*paho.SubscribeToken).Result()[filter]
		if granted <= 2 {
			return nil
		}
		err = fmt.Errorf("broker refused the subscription (code 0x%02x)", granted)
		s.log.Debug().Err(err).Int("try", try+1).Msg("retrying subscription")
	}
	return err
}

// subscribeAll subscribes filters at QoS 1 in one SUBSCRIBE.
func (s *Session) subscribeAll(ctx context.Context, c *conn, filters []string) error {
	want := make(map[string]byte, len(filters))
	for _, f := range filters {
		want[f] = 1
	}
	var err error
	for try := 0; try < subscribeTries; try++ {
		tok := c.client.SubscribeMultiple(want, nil) // nil: the default handler
		if err = s.wait(ctx, c, tok); err != nil {
			return err
		}
		err = nil
		for f, granted := range tok.(*paho.SubscribeToken).Result() {
			if granted > 2 {
				err = fmt.Errorf("broker refused the subscription to %s (code 0x%02x)", f, granted)
			}
		}
		if err == nil {
			return nil
		}
		s.log.Debug().Err(err).Int("try", try+1).Msg("retrying subscription")
	}
	return err
}

// SetCommandFilters makes filters the command subscriptions: on the
// connection up now (new ones subscribed, dropped ones unsubscribed) and
// at every later connect. A filter dropped while no connection is up stays
// in the broker's persistent session until a later change; the receiver
// must refuse what arrives on it.
func (s *Session) SetCommandFilters(ctx context.Context, filters []string) error {
	s.mu.Lock()
	old := s.filters
	s.filters = slices.Clone(filters)
	c := s.active
	s.mu.Unlock()
	if c == nil {
		return nil
	}
	return s.refilter(ctx, c, old, filters)
}

// refilter moves c's subscriptions from old to filters.
func (s *Session) refilter(ctx context.Context, c *conn, old, filters []string) error {
	var added, dropped []string
	for _, f := range filters {
		if !slices.Contains(old, f) {
			added = append(added, f)
		}
	}
	for _, f := range old {
		if !slices.Contains(filters, f) {
			dropped = append(dropped, f)
		}
	}
	if len(added) > 0 {
		if err := s.subscribeAll(ctx, c, added); err != nil {
			return fmt.Errorf("subscribe %s: %w", strings.Join(added, " "), err)
		}
	}
	if len(dropped) > 0 {
		if err := s.wait(ctx, c, c.client.Unsubscribe(dropped...)); err != nil {
			return fmt.Errorf("unsubscribe %s: %w", strings.Join(dropped, " "), err)
		}
	}
	return nil
}

// wait waits for a paho token, bounded by the connect timeout, ctx,
// Disconnect and the loss of the connection.
func (s *Session) wait(ctx context.Context, c *conn, tok paho.Token) error {
	timer := time.NewTimer(s.opts.ConnectTimeout + time.Second)
	defer timer.Stop()
	select {
	case <-tok.Done():
		return tok.Error()
	case <-c.lost:
		return fmt.Errorf("connection lost: %w", c.lostErr)
	case <-timer.C:
		return errors.New("timed out")
	case <-ctx.Done():
		return ctx.Err()
	case <-s.stop:
		return errors.New("session disconnected")
	}
}

func (s *Session) deactivate(c *conn) {
	s.mu.Lock()
	if s.active == c {
		s.active = nil
	}
	s.mu.Unlock()
}

// serve signals the connection up and waits until it ends. stable reports
// whether it lasted StableAfter, so the backoff starts over.
func (s *Session) serve(ctx context.Context, c *conn) (stable bool, err error) {
	s.mu.Lock()
	ep := s.epoch
	s.mu.Unlock()
	n := s.connects.Add(1)
	s.log.Info().Bool("reconnect", n > 1).Str("broker", redacted(s.opts.Brokers[s.broker.Load()])).Msg("mqtt connected")
	close(ep.up)
	start := time.Now()
	select {
	case <-c.lost:
		err = fmt.Errorf("connection lost: %w", c.lostErr)
	case <-ctx.Done():
		s.deactivate(c)
		c.client.Disconnect(250)
		c.markLost(ctx.Err())
		err = ctx.Err()
	case <-s.stop:
		err = errors.New("session disconnected")
	}
	s.deactivate(c)
	s.mu.Lock()
	close(ep.down)
	s.epoch = newEpoch()
	s.mu.Unlock()
	return time.Since(start) >= s.opts.StableAfter, err
}

// MatchFilter reports whether topic matches the MQTT topic filter (with
// the + and # wildcards).
func MatchFilter(filter, topic string) bool {
	f, t := strings.Split(filter, "/"), strings.Split(topic, "/")
	for i, level := range f {
		if level == "#" {
			return i < len(t) || i == len(t)
		}
		if i >= len(t) || (level != "+" && level != t[i]) {
			return false
		}
	}
	return len(f) == len(t)
}
