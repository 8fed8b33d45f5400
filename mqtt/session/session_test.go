package session

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	apiv1 "github.com/mqlet/mqlet/api/v1"
	"github.com/mqlet/mqlet/internal/testutil/mosquitto"
	"github.com/mqlet/mqlet/mqtt/broker"
	"github.com/mqlet/mqlet/mqtt/broker/testcert"
	"github.com/mqlet/mqlet/mqtt/outbox"
)

var nodeCounter atomic.Int64

// fixture is a session for a fresh node name, publishing its birth on
// connect and recording the commands it receives.
type fixture struct {
	scheme apiv1.Scheme
	s      *Session
	cmds   chan received
}

func newFixture(t *testing.T, url string, tune func(*Options)) *fixture {
	t.Helper()
	f := &fixture{
		scheme: apiv1.Scheme{Node: fmt.Sprintf("node%d-%d", time.Now().UnixNano()%100000, nodeCounter.Add(1))},
		cmds:   make(chan received, 100),
	}
	opts := Options{
		BrokerURL:      url,
		ClientID:       ClientID(f.scheme.Node),
		ReconnectMin:   20 * time.Millisecond,
		ReconnectMax:   200 * time.Millisecond,
		Will:           &outbox.Message{Topic: f.scheme.State(), Payload: []byte("offline"), QoS: 1, Retained: true},
		CommandFilters: f.scheme.CommandFilters(),
		Handler: func(m Inbound) {
			f.cmds <- received{topic: m.Topic, payload: string(m.Payload), retained: m.Retained}
		},
	}
	opts.OnConnect = func(ctx context.Context) error {
		return f.s.Publish(ctx, outbox.Message{Topic: f.scheme.State(), Payload: []byte("online"), QoS: 1, Retained: true})
	}
	if tune != nil {
		tune(&opts)
	}
	s, err := New(opts, zerolog.New(zerolog.NewTestWriter(t)))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	f.s = s
	return f
}

func (f *fixture) nextCommand(t *testing.T) received {
	t.Helper()
	select {
	case m := <-f.cmds:
		return m
	case <-time.After(waitFor):
		t.Fatal("timed out waiting for a command at the handler")
		return received{}
	}
}

func expect(t *testing.T, got received, topic, payload string) {
	t.Helper()
	if got.topic != topic || got.payload != payload {
		t.Fatalf("got %s=%q, want %s=%q", got.topic, got.payload, topic, payload)
	}
}

func TestConnectCommandWillAndReconnect(t *testing.T) {
	brokers(t, func(t *testing.T, b testBroker) {
		p := startProxy(t, b.Addr())
		f := newFixture(t, p.URL(), nil)
		obs := newObserver(t, b.URL(), "obs-"+f.scheme.Node)
		obs.subscribe(t, f.scheme.State())
		runSession(t, f.s)
		waitClosed(t, f.s.Connected(), "first connection")
		expect(t, obs.next(t, "birth"), f.scheme.State(), "online")

		cmd := f.scheme.Command("apply", "req-1")
		obs.publish(t, cmd, "kind: Pod", false)
		expect(t, f.nextCommand(t), cmd, "kind: Pod")

		// Kill the link abruptly: the broker must publish the retained will.
		_, down := f.s.Connection()
		p.cut()
		expect(t, obs.nextOtherThan(t, "will", "online"), f.scheme.State(), "offline")
		waitClosed(t, down, "session noticing the lost link")
		late := newObserver(t, b.URL(), "late-"+f.scheme.Node)
		late.subscribe(t, f.scheme.State())
		if m := late.next(t, "retained will"); m.payload != "offline" || !m.retained {
			t.Fatalf("late subscriber got %+v, want retained offline", m)
		}

		// The session reconnects by itself once the link is back.
		p.resume()
		waitClosed(t, f.s.Connected(), "reconnection")
		expect(t, obs.next(t, "second birth"), f.scheme.State(), "online")
		waitUntil(t, "both births counted", func() bool { return f.s.Stats().MessagesOut >= 2 })
		if st := f.s.Stats(); st.Reconnects < 1 || st.MessagesIn < 1 || !st.Connected {
			t.Fatalf("stats = %+v, want >=1 reconnect, >=1 in, connected", st)
		}
		cmd2 := f.scheme.Command("delete", "")
		obs.publish(t, cmd2, "x", false)
		got := f.nextCommand(t)
		for got.topic == cmd { // at least once: the first command may come again if its ack died with the link
			got = f.nextCommand(t)
		}
		expect(t, got, cmd2, "x")
	})
}

func TestSubscriptionRestoredAfterBrokerRestart(t *testing.T) {
	brokers(t, func(t *testing.T, b testBroker) {
		f := newFixture(t, b.URL(), nil)
		runSession(t, f.s)
		waitClosed(t, f.s.Connected(), "first connection")
		_, down := f.s.Connection()
		b.Restart()
		waitClosed(t, down, "loss of the connection at broker restart")
		waitClosed(t, f.s.Connected(), "reconnection after broker restart")
		obs := newObserver(t, b.URL(), "obs-"+f.scheme.Node)
		cmd := f.scheme.Command("sync", "after-restart")
		obs.publish(t, cmd, "list", false)
		expect(t, f.nextCommand(t), cmd, "list")
		if st := f.s.Stats(); st.Reconnects != 1 {
			t.Fatalf("reconnects = %d, want 1", st.Reconnects)
		}
	})
}

func TestReconnectAfterBrokerStopStart(t *testing.T) {
	brokers(t, func(t *testing.T, b testBroker) {
		f := newFixture(t, b.URL(), nil)
		runSession(t, f.s)
		waitClosed(t, f.s.Connected(), "first connection")
		_, down := f.s.Connection()
		b.Stop()
		waitClosed(t, down, "loss of the connection")
		if err := f.s.Publish(context.Background(), outbox.Message{Topic: "x", QoS: 1}); !errors.Is(err, ErrNotConnected) {
			t.Fatalf("Publish while down = %v, want ErrNotConnected", err)
		}
		waitUntil(t, "failed attempts while the broker is down", func() bool { return f.s.Stats().ConnectFailures >= 2 })
		b.Restart()
		waitClosed(t, f.s.Connected(), "reconnection")
		if st := f.s.Stats(); !st.Connected || st.Reconnects != 1 {
			t.Fatalf("stats = %+v", st)
		}
	})
}

func TestCommandSentWhileAwayIsDelivered(t *testing.T) {
	brokers(t, func(t *testing.T, b testBroker) {
		p := startProxy(t, b.Addr())
		f := newFixture(t, p.URL(), nil)
		runSession(t, f.s)
		waitClosed(t, f.s.Connected(), "first connection")
		_, down := f.s.Connection()
		p.cut()
		waitClosed(t, down, "loss of the connection")
		obs := newObserver(t, b.URL(), "obs-"+f.scheme.Node)
		cmd := f.scheme.Command("apply", "while-away")
		obs.publish(t, cmd, "queued", false)
		p.resume()
		expect(t, f.nextCommand(t), cmd, "queued")
	})
}

// A command is acknowledged only after the handler returns: if the link
// dies while the handler runs, the broker delivers it again.
func TestUnacknowledgedCommandIsRedelivered(t *testing.T) {
	brokers(t, func(t *testing.T, b testBroker) {
		p := startProxy(t, b.Addr())
		release := make(chan struct{})
		var calls atomic.Int32
		f := newFixture(t, p.URL(), func(o *Options) {
			next := o.Handler
			o.Handler = func(m Inbound) {
				next(m)
				if calls.Add(1) == 1 {
					<-release // hold the first delivery until the link is cut
				}
			}
		})
		runSession(t, f.s)
		waitClosed(t, f.s.Connected(), "first connection")
		obs := newObserver(t, b.URL(), "obs-"+f.scheme.Node)
		cmd := f.scheme.Command("apply", "ack-late")
		obs.publish(t, cmd, "once", false)
		expect(t, f.nextCommand(t), cmd, "once")
		p.cut()
		close(release)
		p.resume()
		expect(t, f.nextCommand(t), cmd, "once")
	})
}

func TestDisconnectIsClean(t *testing.T) {
	b := startEmbedded(t)
	f := newFixture(t, b.URL(), nil)
	done := make(chan error, 1)
	go func() { done <- f.s.Run(context.Background()) }()
	waitClosed(t, f.s.Connected(), "connection")
	f.s.Disconnect(time.Second)
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run after Disconnect = %v, want nil", err)
		}
	case <-time.After(waitFor):
		t.Fatal("Run did not return after Disconnect")
	}
	// A clean DISCONNECT discards the will: the retained state stays online.
	obs := newObserver(t, b.URL(), "obs-"+f.scheme.Node)
	obs.subscribe(t, f.scheme.State())
	if m := obs.next(t, "retained state"); m.payload != "online" {
		t.Fatalf("retained state after clean disconnect = %q, want online", m.payload)
	}
}

func TestMutualTLS(t *testing.T) {
	certs := testcert.Generate(t)
	b, err := broker.Start(context.Background(), broker.Options{Listen: "127.0.0.1:0", TLS: certs.ServerTLS(t, true)}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	url := "ssl://" + b.Addr()

	withCert, err := TLSConfig(certs.CA, certs.ClientCert, certs.ClientKey, false)
	if err != nil {
		t.Fatalf("TLSConfig: %v", err)
	}
	f := newFixture(t, url, func(o *Options) { o.TLS = withCert })
	runSession(t, f.s)
	waitClosed(t, f.s.Connected(), "mTLS connection")

	noCert, err := TLSConfig(certs.CA, "", "", false)
	if err != nil {
		t.Fatal(err)
	}
	g := newFixture(t, url, func(o *Options) { o.TLS = noCert })
	runSession(t, g.s)
	waitUntil(t, "refused attempts without a client certificate", func() bool { return g.s.Stats().ConnectFailures >= 2 })
	if g.s.Stats().Connected {
		t.Fatal("connected without a client certificate")
	}

	if _, err := TLSConfig(certs.CA, certs.ClientCert, "", false); err == nil {
		t.Error("TLSConfig accepted a certificate without a key")
	}
	if _, err := TLSConfig(filepath.Join(t.TempDir(), "none.pem"), "", "", false); err == nil {
		t.Error("TLSConfig accepted a missing CA file")
	}
	if _, err := TLSConfig(certs.ClientKey, "", "", false); err == nil {
		t.Error("TLSConfig accepted a CA file without certificates")
	}
	var _ *tls.Config = withCert
}

func TestBackoffDelay(t *testing.T) {
	var asked []int64
	top := func(n int64) int64 { asked = append(asked, n); return n - 1 }
	wantCeilings := []time.Duration{1 * time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second, 32 * time.Second, 64 * time.Second, 2 * time.Minute, 2 * time.Minute}
	for attempt, ceiling := range wantCeilings {
		got := BackoffDelay(attempt, time.Second, 2*time.Minute, top)
		if got != ceiling-1 {
			t.Errorf("attempt %d: delay %v, want just under %v", attempt, got, ceiling)
		}
		if asked[attempt] != int64(ceiling) {
			t.Errorf("attempt %d: jitter drawn over %v, want [0, %v)", attempt, time.Duration(asked[attempt]), ceiling)
		}
	}
	if got := BackoffDelay(1000, time.Second, 2*time.Minute, top); got != 2*time.Minute-1 {
		t.Errorf("huge attempt: %v, want capped", got)
	}
	zero := func(int64) int64 { return 0 }
	if got := BackoffDelay(5, time.Second, 2*time.Minute, zero); got != 0 {
		t.Errorf("full jitter low end = %v, want 0", got)
	}
}

func TestValidateBrokerURL(t *testing.T) {
	for _, u := range []string{"tcp://127.0.0.1:1883", "ssl://broker.example:8883", "ws://h/mqtt", "wss://h:443/mqtt"} {
		if err := ValidateBrokerURL(u); err != nil {
			t.Errorf("ValidateBrokerURL(%q) = %v", u, err)
		}
	}
	for _, u := range []string{"", "http://h:1", "tcp://h", "tcp://:1883", "ssl://h", "ws://", "h:1883"} {
		if err := ValidateBrokerURL(u); err == nil {
			t.Errorf("ValidateBrokerURL(%q) = nil, want error", u)
		}
	}
	err := ValidateBrokerURL("tcp://user:hunter2@h")
	if err == nil || strings.Contains(err.Error(), "hunter2") {
		t.Errorf("error %v must exist and not show the password", err)
	}
	if _, err := New(Options{BrokerURL: "tcp://h:1", Handler: func(Inbound) {}}, zerolog.Nop()); err == nil {
		t.Error("New accepted an empty client id")
	}
	if _, err := New(Options{BrokerURL: "mqtt://h:1", ClientID: "c", Handler: func(Inbound) {}}, zerolog.Nop()); err == nil {
		t.Error("New accepted an unsupported scheme")
	}
}

// A retained message on a command topic is replayed by the broker on every
// subscribe; the handler must be told so it can refuse to execute it.
func TestRetainedCommandIsFlagged(t *testing.T) {
	brokers(t, func(t *testing.T, b testBroker) {
		f := newFixture(t, b.URL(), nil)
		obs := newObserver(t, b.URL(), "obs-"+f.scheme.Node)
		retainedCmd := f.scheme.Command("apply", "stored")
		obs.publish(t, retainedCmd, "old", true)
		t.Cleanup(func() { obs.publish(t, retainedCmd, "", true) })
		runSession(t, f.s)
		waitClosed(t, f.s.Connected(), "connection")
		got := f.nextCommand(t)
		expect(t, got, retainedCmd, "old")
		if !got.retained {
			t.Fatal("a retained command replayed on subscribe was not flagged Retained")
		}
		fresh := f.scheme.Command("apply", "fresh")
		obs.publish(t, fresh, "new", false)
		got = f.nextCommand(t)
		for got.topic == retainedCmd && got.retained { // a subscription retried (mochi's 0x91 under load) replays it
			got = f.nextCommand(t)
		}
		expect(t, got, fresh, "new")
		if got.retained {
			t.Fatal("a fresh command was flagged Retained")
		}
	})
}

// With ManualAck a handler that returned has not acknowledged: the message
// comes again after a reconnect. Ack may be called from any goroutine, more
// than once.
func TestManualAckFollowsAckNotReturn(t *testing.T) {
	brokers(t, func(t *testing.T, b testBroker) {
		p := startProxy(t, b.Addr())
		acks := make(chan func(), 10)
		f := newFixture(t, p.URL(), func(o *Options) {
			o.ManualAck = true
			next := o.Handler
			o.Handler = func(m Inbound) {
				acks <- m.Ack
				next(m)
			}
		})
		runSession(t, f.s)
		waitClosed(t, f.s.Connected(), "first connection")
		obs := newObserver(t, b.URL(), "obs-"+f.scheme.Node)
		first := f.scheme.Command("apply", "manual-1")
		obs.publish(t, first, "one", false)
		expect(t, f.nextCommand(t), first, "one")
		<-acks // returned, never acknowledged
		p.cut()
		p.resume()
		expect(t, f.nextCommand(t), first, "one")
		go (<-acks)() // acknowledged from another goroutine
		second := f.scheme.Command("apply", "manual-2")
		obs.publish(t, second, "two", false)
		expect(t, f.nextCommand(t), second, "two")
		ack := <-acks
		ack()
		ack() // a second call is harmless
	})
}

// With two brokers, the session starts on the first; when that one dies it
// retries it, moves to the second, subscribes there and runs OnConnect
// there; a lost connection to the second is retried on the second.
func TestFailoverToTheNextBroker(t *testing.T) {
	first, second := mosquitto.Start(t), mosquitto.Start(t)
	var onConnect []string
	var mu sync.Mutex
	f := newFixture(t, "", func(o *Options) {
		o.BrokerURL, o.Brokers = "", []string{first.URL(), "tcp://user:secret@" + second.Addr()}
		publish := o.OnConnect
		o.OnConnect = func(ctx context.Context) error {
			mu.Lock()
			onConnect = append(onConnect, "")
			mu.Unlock()
			return publish(ctx)
		}
	})
	runSession(t, f.s)
	waitClosed(t, f.s.Connected(), "first connection")
	if got := f.s.Broker(); got != first.URL() {
		t.Fatalf("first connection to %s, want %s", got, first.URL())
	}
	_, down := f.s.Connection()
	first.Stop()
	waitClosed(t, down, "loss of the first broker")
	waitClosed(t, f.s.Connected(), "connection to the second broker")
	if got, want := f.s.Broker(), "tcp://"+second.Addr(); got != want {
		t.Fatalf("moved to %s, want %s (its id holds no user info)", got, want)
	}
	if st := f.s.Stats(); st.Failovers != 1 || st.Reconnects != 1 {
		t.Fatalf("stats %+v: want 1 failover, 1 reconnect", st)
	}
	obs := newObserver(t, second.URL(), "obs-"+f.scheme.Node)
	cmd := f.scheme.Command("apply", "on-second")
	obs.publish(t, cmd, "hello", false)
	expect(t, f.nextCommand(t), cmd, "hello")

	// The first comes back: the session stays where it is.
	first.Restart()
	_, down = f.s.Connection()
	select {
	case <-down:
		t.Fatal("the session left a working broker")
	case <-time.After(500 * time.Millisecond):
	}
	mu.Lock()
	n := len(onConnect)
	mu.Unlock()
	if n != 2 {
		t.Fatalf("OnConnect ran %d times, want 2", n)
	}
}
