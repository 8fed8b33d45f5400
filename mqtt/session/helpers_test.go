package session

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	"github.com/rs/zerolog"

	"github.com/mqlet/mqlet/internal/testutil/mosquitto"
	"github.com/mqlet/mqlet/mqtt/broker"
)

const waitFor = 15 * time.Second

// testBroker is a real broker that a test can restart on the same port.
type testBroker interface {
	URL() string
	Addr() string
	Restart()
	Stop()
}

type embedded struct {
	t    *testing.T
	addr string
	b    *broker.Broker
}

func startEmbedded(t *testing.T) *embedded {
	e := &embedded{t: t, addr: "127.0.0.1:0"}
	e.start()
	t.Cleanup(e.Stop)
	return e
}

func (e *embedded) start() {
	e.t.Helper()
	b, err := broker.Start(context.Background(), broker.Options{Listen: e.addr}, zerolog.Nop())
	if err != nil {
		e.t.Fatalf("start embedded broker: %v", err)
	}
	e.b, e.addr = b, b.Addr()
}

func (e *embedded) URL() string  { return "tcp://" + e.addr }
func (e *embedded) Addr() string { return e.addr }
func (e *embedded) Stop() {
	if e.b != nil {
		_ = e.b.Close()
		e.b = nil
	}
}

// Restart starts a fresh broker on the same port: sessions and
// subscriptions are gone, so clients must subscribe again.
func (e *embedded) Restart() {
	e.Stop()
	e.start()
}

// brokers runs a test body against mosquitto and the embedded broker.
func brokers(t *testing.T, body func(t *testing.T, b testBroker)) {
	t.Run("mosquitto", func(t *testing.T) { body(t, mosquitto.Start(t)) })
	t.Run("embedded", func(t *testing.T) { body(t, startEmbedded(t)) })
}

// proxy forwards TCP to a broker and can cut every connection abruptly,
// which is what a dead link looks like to the broker (no DISCONNECT).
type proxy struct {
	ln     net.Listener
	target string
	wg     sync.WaitGroup

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	paused bool
}

func startProxy(t *testing.T, target string) *proxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("proxy listen: %v", err)
	}
	p := &proxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(func() {
		_ = ln.Close()
		p.cut()
		p.wg.Wait()
	})
	return p
}

func (p *proxy) URL() string { return "tcp://" + p.ln.Addr().String() }

func (p *proxy) accept() {
	defer p.wg.Done()
	for {
		in, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		paused := p.paused
		p.mu.Unlock()
		if paused {
			_ = in.Close()
			continue
		}
		out, err := net.DialTimeout("tcp", p.target, 5*time.Second)
		if err != nil {
			_ = in.Close()
			continue
		}
		p.mu.Lock()
		p.conns[in], p.conns[out] = struct{}{}, struct{}{}
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(in, out)
		go p.pipe(out, in)
	}
}

func (p *proxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	_, _ = io.Copy(dst, src)
	_ = dst.Close()
	_ = src.Close()
}

// cut closes every proxied connection and refuses new ones until resume.
func (p *proxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.paused = true
	for c := range p.conns {
		_ = c.Close()
	}
	p.conns = map[net.Conn]struct{}{}
}

func (p *proxy) resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.paused = false
}

type received struct {
	topic    string
	payload  string
	retained bool
}

// observer is an independent MQTT client recording what it receives.
type observer struct {
	client paho.Client
	msgs   chan received
}

func newObserver(t *testing.T, url, id string) *observer {
	t.Helper()
	o := &observer{msgs: make(chan received, 100)}
	opts := paho.NewClientOptions().AddBroker(url).SetClientID(id).SetAutoReconnect(false).SetCleanSession(true)
	o.client = paho.NewClient(opts)
	if tok := o.client.Connect(); !tok.WaitTimeout(waitFor) || tok.Error() != nil {
		t.Fatalf("observer connect: %v", tok.Error())
	}
	t.Cleanup(func() { o.client.Disconnect(100) })
	return o
}

func (o *observer) subscribe(t *testing.T, filter string) {
	t.Helper()
	// QoS 0: mochi re-sends an unacknowledged QoS 1 message whenever the
	// client sends another packet, which would show up here as a duplicate.
	tok := o.client.Subscribe(filter, 0, func(_ paho.Client, m paho.Message) {
		o.msgs <- received{m.Topic(), string(m.Payload()), m.Retained()}
	})
	if !tok.WaitTimeout(waitFor) || tok.Error() != nil {
		t.Fatalf("observer subscribe %s: %v", filter, tok.Error())
	}
}

func (o *observer) publish(t *testing.T, topic, payload string, retained bool) {
	t.Helper()
	tok := o.client.Publish(topic, 1, retained, payload)
	if !tok.WaitTimeout(waitFor) || tok.Error() != nil {
		t.Fatalf("observer publish %s: %v", topic, tok.Error())
	}
}

// next waits for the next message.
func (o *observer) next(t *testing.T, what string) received {
	t.Helper()
	select {
	case m := <-o.msgs:
		return m
	case <-time.After(waitFor):
		t.Fatalf("timed out waiting for %s", what)
		return received{}
	}
}

// nextOtherThan waits for the next message whose payload is not skip: QoS 1
// is at least once, so a publication the outbox re-sent because its PUBACK
// was slow may reach the observer twice.
func (o *observer) nextOtherThan(t *testing.T, what, skip string) received {
	t.Helper()
	for {
		if m := o.next(t, what); m.payload != skip {
			return m
		}
	}
}

// runSession runs s until the test ends and checks that Run stopped.
func runSession(t *testing.T, s *Session) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("Run returned %v", err)
			}
		case <-time.After(waitFor):
			t.Error("Run did not stop after cancel")
		}
	})
}

func waitClosed(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(waitFor):
		t.Fatalf("timed out waiting for %s", what)
	}
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond) // polling a test condition with a deadline
	}
}
