package e2e

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mqlet/mqlet/mqtt/broker/testcert"
)

// fleetCerts makes a fleet CA and the broker's certificate with the real
// `mqletctl certs`, the way an operator would, and returns them in the
// shape the mosquitto helpers take; IssueClient runs `mqletctl certs node`
// (or `certs operator` for the operator's CN).
func fleetCerts(t *testing.T) testcert.Files {
	t.Helper()
	dir := t.TempDir()
	ctl := mqletctlBin(t)
	certs := func(args ...string) string {
		t.Helper()
		out, err := exec.Command(ctl, append([]string{"certs"}, append(args, "--dir", dir)...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("mqletctl certs %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	certs("ca")
	if out := certs("broker", "--host", "127.0.0.1", "--host", "localhost"); !strings.Contains(out, "/etc/mosquitto/certs/server.key") {
		t.Fatalf("certs broker does not say where the key goes:\n%s", out)
	}
	pem, err := os.ReadFile(filepath.Join(dir, "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		t.Fatal("ca.crt from mqletctl certs holds no certificate")
	}
	return testcert.Files{
		CA: filepath.Join(dir, "ca.crt"), ServerCert: filepath.Join(dir, "broker.crt"), ServerKey: filepath.Join(dir, "broker.key"),
		Pool: pool,
		IssueClient: func(t testing.TB, cn string) (string, string) {
			if cn == "operator" {
				certs("operator")
			} else if out := certs("node", cn); !strings.Contains(out, "--node "+cn) {
				t.Fatalf("certs node does not give the init line:\n%s", out)
			}
			return filepath.Join(dir, cn+".crt"), filepath.Join(dir, cn+".key")
		},
	}
}

// startTLSMosquitto runs mosquitto with the project's deploy configuration
// (client certificates required, CN as username, the per-node ACL), only
// with test paths and a free loopback port.
func startTLSMosquitto(t *testing.T, certs testcert.Files) string {
	t.Helper()
	conf, err := os.ReadFile(filepath.Join("..", "..", "deploy", "mosquitto-tls.conf"))
	if err != nil {
		t.Fatal(err)
	}
	port := freeLoopbackPort(t)
	acl, err := filepath.Abs(filepath.Join("..", "..", "deploy", "mosquitto-mqlet.acl"))
	if err != nil {
		t.Fatal(err)
	}
	text := string(conf)
	for old, repl := range map[string]string{
		"listener 8883":                   fmt.Sprintf("listener %d 127.0.0.1", port),
		"/etc/mosquitto/certs/ca.crt":     certs.CA,
		"/etc/mosquitto/certs/server.crt": certs.ServerCert,
		"/etc/mosquitto/certs/server.key": certs.ServerKey,
		"/etc/mosquitto/mqlet.acl":        acl,
		"persistence true":                "persistence false",
	} {
		if !strings.Contains(text, old) {
			t.Fatalf("deploy/mosquitto-tls.conf no longer contains %q", old)
		}
		text = strings.ReplaceAll(text, old, repl)
	}
	runMosquitto(t, text, port)
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	return "ssl://" + addr
}

func clientTLS(t *testing.T, certs testcert.Files, cert, key string) *tls.Config {
	t.Helper()
	pair, err := tls.LoadX509KeyPair(cert, key)
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Config{RootCAs: certs.Pool, Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}
}

// A gateway on mTLS with the per-node ACL: it comes online and obeys the
// operator; another gateway's certificate cannot command it; without a
// client certificate, or trusting another CA, mqlet never gets on the broker.
// Every certificate comes from `mqletctl certs`.
func TestMutualTLSAndPerNodeACL(t *testing.T) {
	certs := fleetCerts(t)
	url := startTLSMosquitto(t, certs)
	const node = "gw-tls"
	gwCert, gwKey := certs.IssueClient(t, node)
	opCert, opKey := certs.IssueClient(t, "operator")
	rogueCert, rogueKey := certs.IssueClient(t, "gw-rogue")

	op := ConnectTLS(t, url, clientTLS(t, certs, opCert, opKey))
	op.Subscribe(prefix + "/#")
	tlsConfig := func(ca, cert, key string) string {
		return fmt.Sprintf("mqtt:\n  caFile: %s\n  certFile: %s\n  keyFile: %s\n  reconnectMax: 2s\n", ca, cert, key)
	}
	a := StartAgent(t, AgentOpts{Node: node, Broker: url, Config: tlsConfig(certs.CA, gwCert, gwKey)})
	op.WaitState(0, node, "online", 15*time.Second)

	op.Command(node, "apply", "tls-1", []byte(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"c"},"data":{"k":"v"}}`))
	op.WaitReply(node, "tls-1", "succeeded", 10*time.Second)

	// Another gateway's certificate is allowed on the broker but may not
	// publish to this gateway's command topics: the broker drops it.
	rogue := ConnectTLS(t, url, clientTLS(t, certs, rogueCert, rogueKey))
	rogue.Command(node, "apply", "evil", []byte(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"evil"},"data":{}}`))
	op.Command(node, "get", "after-evil", []byte(`{"kind":"ConfigMap"}`))
	got := op.WaitReply(node, "after-evil", "succeeded", 10*time.Second)
	if strings.Contains(a.Logs(), `"requestId":"evil"`) || strings.Contains(fmt.Sprint(got.Result), "evil") {
		t.Fatal("a command from another gateway's certificate reached mqlet")
	}

	// No client certificate, or a CA that does not sign the broker: no session.
	other := fleetCerts(t)
	noCert := StartAgent(t, AgentOpts{Node: "gw-nocert", Broker: url, Config: fmt.Sprintf("mqtt:\n  caFile: %s\n  reconnectMax: 1s\n", certs.CA)})
	wrongCA := StartAgent(t, AgentOpts{Node: "gw-wrongca", Broker: url, Config: tlsConfig(other.CA, gwCert, gwKey)})
	Eventually(t, 15*time.Second, "both agents fail to connect, repeatedly", func() bool {
		return strings.Count(noCert.Logs(), "mqtt connection down; reconnecting") >= 2 && strings.Count(wrongCA.Logs(), "mqtt connection down; reconnecting") >= 2
	})
	for _, m := range op.Messages() {
		if strings.Contains(m.Topic, "/gw-nocert/") || strings.Contains(m.Topic, "/gw-wrongca/") {
			t.Fatalf("an agent without valid TLS published %s", m.Topic)
		}
	}
}
