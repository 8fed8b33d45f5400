package broker

import (
	"context"
	"crypto/tls"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	"github.com/rs/zerolog"

	"github.com/mqlet/mqlet/mqtt/broker/testcert"
)

func startBroker(t *testing.T, opts Options) *Broker {
	t.Helper()
	b, err := Start(context.Background(), opts, zerolog.Nop())
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

// connect tries one MQTT connection and reports the broker's answer.
func connect(url, user, pass string, tlsConfig *tls.Config) error {
	opts := paho.NewClientOptions().AddBroker(url).SetClientID("probe").
		SetUsername(user).SetPassword(pass).SetTLSConfig(tlsConfig).
		SetAutoReconnect(false).SetConnectTimeout(5 * time.Second)
	c := paho.NewClient(opts)
	tok := c.Connect()
	if !tok.WaitTimeout(10 * time.Second) {
		return errors.New("connect timed out")
	}
	if err := tok.Error(); err != nil {
		return err
	}
	c.Disconnect(100)
	return nil
}

// roundTrip publishes a message and receives it through the broker.
func roundTrip(t *testing.T, url string, tlsConfig *tls.Config) {
	t.Helper()
	got := make(chan string, 1)
	opts := paho.NewClientOptions().AddBroker(url).SetClientID("rt").SetTLSConfig(tlsConfig).SetAutoReconnect(false)
	c := paho.NewClient(opts)
	if tok := c.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("connect %s: %v", url, tok.Error())
	}
	defer c.Disconnect(100)
	if tok := c.Subscribe("t/x", 1, func(_ paho.Client, m paho.Message) { got <- string(m.Payload()) }); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("subscribe: %v", tok.Error())
	}
	if tok := c.Publish("t/x", 1, false, "hello"); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("publish: %v", tok.Error())
	}
	select {
	case v := <-got:
		if v != "hello" {
			t.Fatalf("received %q", v)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("message not received through the broker")
	}
}

func TestAnonymousLoopback(t *testing.T) {
	b := startBroker(t, Options{Listen: "127.0.0.1:0"})
	if !strings.HasPrefix(b.Addr(), "127.0.0.1:") || strings.HasSuffix(b.Addr(), ":0") {
		t.Fatalf("Addr() = %q, want the bound loopback port", b.Addr())
	}
	roundTrip(t, "tcp://"+b.Addr(), nil)
}

func TestAnonymousRefusedOffLoopback(t *testing.T) {
	_, err := Start(context.Background(), Options{Listen: "0.0.0.0:0"}, zerolog.Nop())
	if err == nil || !strings.Contains(err.Error(), "AllowAnonymous") {
		t.Fatalf("Start anonymous on 0.0.0.0 = %v, want a refusal naming AllowAnonymous", err)
	}
	b := startBroker(t, Options{Listen: "0.0.0.0:0", AllowAnonymous: true})
	if err := connect("tcp://"+strings.Replace(b.Addr(), "[::]", "127.0.0.1", 1), "", "", nil); err != nil {
		t.Fatalf("connect with AllowAnonymous: %v", err)
	}
}

func TestPasswordFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "passwd")
	if err := os.WriteFile(path, []byte("# operators\nalice:s3cret:with:colons\n\nbob:pw\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	b := startBroker(t, Options{Listen: "127.0.0.1:0", PasswordFile: path})
	url := "tcp://" + b.Addr()
	if err := connect(url, "alice", "s3cret:with:colons", nil); err != nil {
		t.Fatalf("right password refused: %v", err)
	}
	if err := connect(url, "bob", "pw", nil); err != nil {
		t.Fatalf("second user refused: %v", err)
	}
	for _, c := range []struct{ user, pass string }{{"alice", "wrong"}, {"mallory", "pw"}, {"", ""}, {"bob", ""}} {
		if err := connect(url, c.user, c.pass, nil); err == nil {
			t.Errorf("connect as %q/%q accepted, want refused", c.user, c.pass)
		}
	}
}

func TestPasswordFileRejects(t *testing.T) {
	dir := t.TempDir()
	loose := filepath.Join(dir, "loose")
	if err := os.WriteFile(loose, []byte("a:b\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadPasswordFile(loose); err == nil {
		t.Error("world-readable password file accepted")
	}
	bad := filepath.Join(dir, "bad")
	if err := os.WriteFile(bad, []byte("nocolon\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadPasswordFile(bad); err == nil || !strings.Contains(err.Error(), "line 1") {
		t.Errorf("malformed line: %v", err)
	}
	if _, err := Start(context.Background(), Options{Listen: "127.0.0.1:0", PasswordFile: filepath.Join(dir, "missing")}, zerolog.Nop()); err == nil {
		t.Error("Start with a missing password file succeeded")
	}
}

func TestTLSListener(t *testing.T) {
	certs := testcert.Generate(t)
	// This broker is deliberately never closed: mochi handles each refused
	// TLS connection on a goroutine that does not synchronise with
	// Server.Close, so closing after the refusals below is a data race
	// inside mochi (seen under load). It lives until the test binary exits;
	// Close itself is covered by the other tests.
	b, err := Start(context.Background(), Options{Listen: "127.0.0.1:0", TLS: certs.ServerTLS(t, false)}, zerolog.Nop())
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	url := "ssl://" + b.Addr()
	roundTrip(t, url, &tls.Config{RootCAs: certs.Pool, MinVersion: tls.VersionTLS12})
	// A client that does not trust the test CA must fail the handshake.
	if err := connect(url, "", "", &tls.Config{MinVersion: tls.VersionTLS12}); err == nil {
		t.Fatal("TLS connect without the CA succeeded")
	}
	// Plain MQTT on the TLS port must not work.
	if err := connect("tcp://"+b.Addr(), "", "", nil); err == nil {
		t.Fatal("plain connect to the TLS listener succeeded")
	}
}

func TestCloseOnContextEnd(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	b, err := Start(ctx, Options{Listen: "127.0.0.1:0"}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	addr := b.Addr()
	cancel()
	select {
	case <-b.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("broker did not shut down after its context ended")
	}
	if err := connect("tcp://"+addr, "", "", nil); err == nil {
		t.Fatal("broker still accepts after its context ended")
	}
	if err := b.Close(); err != nil {
		t.Fatalf("Close after context end: %v", err)
	}
}
