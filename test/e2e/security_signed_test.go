package e2e

import (
	"bytes"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	apiv1 "github.com/mqlet/mqlet/api/v1"
	"github.com/mqlet/mqlet/internal/testutil/mosquitto"
	"github.com/mqlet/mqlet/signing"
)

var (
	ctlOnce sync.Once
	ctlPath string
	ctlErr  error
)

// mqletctlBin returns the CLI binary: $MQLET_TEST_BIN_DIR/mqletctl when set,
// else one built once for this test run.
func mqletctlBin(t testing.TB) string {
	t.Helper()
	ctlOnce.Do(func() {
		if dir := os.Getenv("MQLET_TEST_BIN_DIR"); dir != "" {
			ctlPath = filepath.Join(dir, "mqletctl")
			_, ctlErr = os.Stat(ctlPath)
			return
		}
		dir, err := os.MkdirTemp("", "mqletctl-e2e-bin")
		if err != nil {
			ctlErr = err
			return
		}
		ctlPath = filepath.Join(dir, "mqletctl")
		if out, err := exec.Command("go", "build", "-o", ctlPath, "github.com/mqlet/mqlet/cmd/mqletctl").CombinedOutput(); err != nil {
			ctlErr = fmt.Errorf("building mqletctl: %v: %s", err, out)
		}
	})
	if ctlErr != nil {
		t.Fatalf("mqletctl binary: %v", ctlErr)
	}
	return ctlPath
}

// ctl runs the real mqletctl and returns its exit code and output.
func ctl(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	cmd := exec.Command(mqletctlBin(t), args...)
	cmd.Env = append(os.Environ(), "MQLETCTL_SIGN_KEY=", "MQLETCTL_NODE=", "MQLETCTL_BROKER=")
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("running mqletctl %v: %v", args, err)
	}
	return code, out.String(), errOut.String()
}

func configMapYAML(name string) []byte {
	return []byte("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: " + name + "\ndata:\n  k: v\n")
}

// tamperBody re-encodes a compact JWS's claims with another body and keeps
// the old signature.
func tamperBody(t *testing.T, env []byte, body []byte) []byte {
	t.Helper()
	parts := strings.Split(string(env), ".")
	raw, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		t.Fatal(err)
	}
	claims := map[string]any{}
	if err := json.Unmarshal(raw, &claims); err != nil {
		t.Fatal(err)
	}
	claims["body"] = base64.StdEncoding.EncodeToString(body)
	raw, _ = json.Marshal(claims)
	return []byte(parts[0] + "." + base64.RawURLEncoding.EncodeToString(raw) + "." + parts[2])
}

// waitFinal waits for a final reply to id recorded at or after mark.
func waitFinal(op *Client, mark int, node, id string) apiv1.Reply {
	op.t.Helper()
	var got apiv1.Reply
	op.WaitFor(mark, 20*time.Second, "final reply to "+id, func(m Msg) bool {
		var r apiv1.Reply
		if m.Topic != prefix+"/"+node+"/reply/"+id || json.Unmarshal(m.Payload, &r) != nil {
			return false
		}
		got = r
		return r.Final()
	})
	return got
}

func expectFailed(t *testing.T, op *Client, node, id, want string) {
	t.Helper()
	r := waitFinal(op, 0, node, id)
	if r.Phase != apiv1.Failed || !strings.Contains(r.Message, want) {
		t.Fatalf("request %s: %s %q, want failed saying %q", id, r.Phase, r.Message, want)
	}
}

func TestSignedOnlyAgentEndToEnd(t *testing.T) {
	b := mosquitto.Start(t)
	const node = "gw-signed"
	dir := t.TempDir()

	// The operator's key, made by the real CLI.
	keyFile := filepath.Join(dir, "ops.key")
	code, out, errOut := ctl(t, "keys", "generate", "--out", keyFile)
	if code != 0 {
		t.Fatalf("keys generate: exit %d: %s", code, errOut)
	}
	m := regexp.MustCompile(`(?m)^keyId: (\S+) publicKey: (\S+)$`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("keys generate printed no key line: %q", out)
	}
	keyID, pub := m[1], m[2]
	priv, err := signing.ReadPrivateKeyFile(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	ops, err := signing.NewSigner("", priv)
	if err != nil {
		t.Fatal(err)
	}
	if ops.KeyID() != keyID {
		t.Fatalf("CLI printed key id %s, the key derives %s", keyID, ops.KeyID())
	}
	strangerKey, err := signing.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	stranger, err := signing.NewSigner("", strangerKey)
	if err != nil {
		t.Fatal(err)
	}

	op := Connect(t, b.URL())
	op.Subscribe(prefix+"/"+node+"/reply/#", prefix+"/"+node+"/state")
	// One reply record only, so a test can make the agent forget a request
	// and see the nonce store (not the reply record) refuse its replay.
	cfg := fmt.Sprintf("requests:\n  maxRecords: 1\nsecurity:\n  commands: signed-only\n  trustedKeys:\n  - publicKey: %s\n    verbs: [\"*\"]\n", pub)
	a := StartAgent(t, AgentOpts{Node: node, Broker: b.URL(), Config: cfg})
	op.WaitState(0, node, "online", 15*time.Second)

	signed := func(s *signing.Signer, target, verb, id string, iat time.Time, ttl time.Duration, body []byte) []byte {
		t.Helper()
		env, err := s.Sign(signing.Claims{Node: target, Verb: verb, RequestID: id, IssuedAt: iat, Expires: iat.Add(ttl)}, body)
		if err != nil {
			t.Fatal(err)
		}
		return env
	}
	now := time.Now()

	// Rejected: unsigned, tampered, expired, for another node, by an unknown key.
	op.Command(node, "apply", "u1", configMapYAML("unsigned"))
	expectFailed(t, op, node, "u1", "signature required: this node accepts only signed commands")
	op.Command(node, "apply", "t1", tamperBody(t, signed(ops, node, "apply", "t1", now, time.Minute, configMapYAML("a")), configMapYAML("evil")))
	expectFailed(t, op, node, "t1", "bad signature for key "+keyID)
	op.Command(node, "apply", "e1", signed(ops, node, "apply", "e1", now.Add(-10*time.Minute), 5*time.Minute, configMapYAML("late")))
	expectFailed(t, op, node, "e1", "expired at")
	op.Command(node, "apply", "o1", signed(ops, "gw-other", "apply", "o1", now, time.Minute, configMapYAML("other")))
	expectFailed(t, op, node, "o1", `signed for node "gw-other", this is "gw-signed"`)
	op.Command(node, "apply", "k1", signed(stranger, node, "apply", "k1", now, time.Minute, configMapYAML("stranger")))
	expectFailed(t, op, node, "k1", "unknown key id")

	// Accepted: a fresh signed apply.
	s1 := signed(ops, node, "apply", "s1", now, 10*time.Minute, configMapYAML("signed"))
	op.Command(node, "apply", "s1", s1)
	op.WaitReply(node, "s1", apiv1.Succeeded, 20*time.Second)

	// Redelivered on its own request id: answered from the reply record again.
	mark := op.Mark()
	op.Command(node, "apply", "s1", s1)
	if r := waitFinal(op, mark, node, "s1"); r.Phase != apiv1.Succeeded {
		t.Fatalf("redelivery of s1 answered %s %q, want the recorded succeeded", r.Phase, r.Message)
	}
	// Replayed under another request id: the binding fails.
	op.Command(node, "apply", "s2", s1)
	expectFailed(t, op, node, "s2", `signed for request id "s1", the topic carries "s2"`)

	// A second accepted command whose record is then pushed out (maxRecords 1)...
	s3 := signed(ops, node, "apply", "s3", now, 10*time.Minute, configMapYAML("second"))
	op.Command(node, "apply", "s3", s3)
	op.WaitReply(node, "s3", apiv1.Succeeded, 20*time.Second)
	op.Command(node, "get", "g1", signed(ops, node, "get", "g1", now, time.Minute, []byte(`{"kind":"ConfigMap"}`)))
	g := op.WaitReply(node, "g1", apiv1.Succeeded, 20*time.Second)
	if !strings.Contains(g.Message, "2 configmaps") {
		t.Fatalf("get after two signed applies: %q", g.Message)
	}

	// ...and, after a restart, the same envelope on its own request id is
	// refused by the persisted nonce store, not run again.
	mark = op.Mark()
	a.Stop()
	a.Restart()
	op.WaitState(mark, node, "online", 15*time.Second)
	mark = op.Mark()
	op.Command(node, "apply", "s3", s3)
	if r := waitFinal(op, mark, node, "s3"); r.Phase != apiv1.Failed || !strings.Contains(r.Message, "replayed nonce") {
		t.Fatalf("s3 replayed after restart with its record gone: %s %q", r.Phase, r.Message)
	}

	// mqletctl signs for the node it targets; without the key it is refused.
	cm := filepath.Join(dir, "cm.yaml")
	if err := os.WriteFile(cm, configMapYAML("from-ctl"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := []string{"--broker", b.URL(), "--node", node, "--timeout", "30s"}
	if code, _, errOut := ctl(t, append(base, "apply", "-f", cm)...); code != 1 || !strings.Contains(errOut, "signature required") {
		t.Fatalf("unsigned mqletctl apply: exit %d, stderr %q", code, errOut)
	}
	if code, out, errOut := ctl(t, append(base, "--sign-key", keyFile, "apply", "-f", cm)...); code != 0 || !strings.Contains(out, "succeeded") {
		t.Fatalf("signed mqletctl apply: exit %d\n%s%s", code, out, errOut)
	}
	code, out, errOut = ctl(t, append(base, "get", "configmaps", "--sign-key", keyFile)...)
	if code != 0 || !strings.Contains(out, "from-ctl") || !strings.Contains(out, "signed") {
		t.Fatalf("signed mqletctl get: exit %d\n%s%s", code, out, errOut)
	}
	if !strings.Contains(a.Logs(), "signed command verified") {
		t.Fatal("the agent logged no verified signed command")
	}
}

func TestSigningOffKeepsUnsignedCommandsAndSignedVerbs(t *testing.T) {
	b := mosquitto.Start(t)
	const node = "gw-signoff"
	priv, err := signing.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	s, err := signing.NewSigner("ops", priv)
	if err != nil {
		t.Fatal(err)
	}
	op := Connect(t, b.URL())
	op.Subscribe(prefix+"/"+node+"/reply/#", prefix+"/"+node+"/state")
	cfg := fmt.Sprintf("security:\n  signedVerbs: [delete]\n  trustedKeys:\n  - keyId: ops\n    publicKey: %s\n    verbs: [get, delete]\n",
		signing.EncodePublicKey(priv.Public().(ed25519.PublicKey)))
	StartAgent(t, AgentOpts{Node: node, Broker: b.URL(), Config: cfg})
	op.WaitState(0, node, "online", 15*time.Second)

	// An unsigned manifest, as pasted in a dashboard, still works.
	op.Command(node, "apply", "p1", configMapYAML("pasted"))
	op.WaitReply(node, "p1", apiv1.Succeeded, 20*time.Second)
	// delete must be signed here.
	op.Command(node, "delete", "d1", []byte(`{"kind":"ConfigMap","name":"pasted"}`))
	expectFailed(t, op, node, "d1", "verb delete must be signed on this node (security.signedVerbs)")
	// A signed command is checked although signing is off: ops may not sign apply.
	now := time.Now()
	env, err := s.Sign(signing.Claims{Node: node, Verb: "apply", RequestID: "p2", IssuedAt: now, Expires: now.Add(time.Minute)}, configMapYAML("x"))
	if err != nil {
		t.Fatal(err)
	}
	op.Command(node, "apply", "p2", env)
	expectFailed(t, op, node, "p2", "key ops may not sign verb apply")
	env, err = s.Sign(signing.Claims{Node: node, Verb: "delete", RequestID: "d2", IssuedAt: now, Expires: now.Add(time.Minute)}, []byte(`{"kind":"ConfigMap","name":"pasted"}`))
	if err != nil {
		t.Fatal(err)
	}
	op.Command(node, "delete", "d2", env)
	op.WaitReply(node, "d2", apiv1.Accepted, 20*time.Second)
}
