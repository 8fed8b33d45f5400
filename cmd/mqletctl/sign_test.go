package main

import (
	"crypto/ed25519"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	apiv1 "github.com/mqlet/mqlet/api/v1"
	"github.com/mqlet/mqlet/mqtt/broker"
	"github.com/mqlet/mqlet/signing"
)

type nonces map[string]bool

func (n nonces) Use(keyID, nonce string, _, _ time.Time) error {
	if n[keyID+nonce] {
		return signing.ErrReplayed
	}
	n[keyID+nonce] = true
	return nil
}

var keyLine = regexp.MustCompile(`(?m)^keyId: ([0-9a-f]{16}) publicKey: (\S+)$`)

// generateKey runs `keys generate` and returns the key file, id and public key.
func generateKey(t *testing.T) (file, id, pub string) {
	t.Helper()
	file = filepath.Join(t.TempDir(), "ops.key")
	res := runCLIEnv(t, nil, "", "keys", "generate", "--out", file)
	if res.code != 0 {
		t.Fatalf("keys generate: %v", res)
	}
	m := keyLine.FindStringSubmatch(res.stdout)
	if m == nil {
		t.Fatalf("no key id line in %q", res.stdout)
	}
	// The entry lets the key sign every verb mqletctl sends.
	if !strings.Contains(res.stdout, "  - keyId: "+m[1]+"\n    publicKey: "+m[2]+"\n    verbs: ["+strings.Join(apiv1.Verbs(), ", ")+"]\n") {
		t.Fatalf("no trustedKeys entry for every verb (%v) in %q", apiv1.Verbs(), res.stdout)
	}
	return file, m[1], m[2]
}

func TestKeysGenerate(t *testing.T) {
	file, id, pub := generateKey(t)
	st, err := os.Stat(file)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Fatalf("key file mode %04o, want 0600", st.Mode().Perm())
	}
	key, err := signing.ReadPrivateKeyFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if got := signing.EncodePublicKey(key.Public().(ed25519.PublicKey)); got != pub {
		t.Fatalf("printed public key %s, file holds %s", pub, got)
	}
	if signing.KeyID(key.Public().(ed25519.PublicKey)) != id {
		t.Fatalf("printed key id %s is not derived from the key", id)
	}
	if res := runCLIEnv(t, nil, "", "keys", "show", "--sign-key", file); res.code != 0 || !strings.Contains(res.stdout, "keyId: "+id+" publicKey: "+pub+"\n") {
		t.Fatalf("keys show: %v", res)
	}
	if res := runCLIEnv(t, nil, "", "keys", "generate", "--out", file); res.code == 0 || !strings.Contains(res.stderr, "exists") {
		t.Fatalf("overwrote an existing key: %v", res)
	}
	if err := os.Chmod(file, 0o644); err != nil {
		t.Fatal(err)
	}
	if res := runCLIEnv(t, map[string]string{envNode: "n1"}, "", "get", "pods", "--sign-key", file); res.code == 0 || !strings.Contains(res.stderr, "chmod 600") {
		t.Fatalf("a world-readable key was used: %v", res)
	}
}

func TestSignKeySignsEveryCommandForItsTopic(t *testing.T) {
	file, id, pub := generateKey(t)
	url := startBroker(t, broker.Options{})
	agent := startFakeAgent(t, url, func(r received) []fakeReply {
		return []fakeReply{{Phase: "succeeded", Message: "ok", Result: map[string]any{"pods": []any{}}}}
	})
	manifest := writeFile(t, "pod.yaml", podManifest)
	if res := runCLI(t, url, "", "apply", "-f", manifest, "--sign-key", file, "--sign-ttl", "2m"); res.code != 0 {
		t.Fatalf("signed apply: %v", res)
	}
	if res := runCLI(t, url, "", "--sign-key", file, "get", "pods"); res.code != 0 {
		t.Fatalf("signed get: %v", res)
	}
	pubKey, err := signing.ParsePublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	v, err := signing.NewVerifier(signing.Policy{Required: true, Targets: []string{"n1"}, MaxLifetime: 5 * time.Minute, MaxEnvelopeBytes: 1 << 20,
		Keys: []signing.Key{{ID: id, Public: pubKey, Verbs: []string{"*"}}}}, nonces{}, func() time.Time { return testNow })
	if err != nil {
		t.Fatal(err)
	}
	agent.mu.Lock()
	cmds := append([]received(nil), agent.commands...)
	agent.mu.Unlock()
	if len(cmds) != 2 {
		t.Fatalf("agent got %d commands", len(cmds))
	}
	wantBody := []string{podManifest, `{"kind":"Pod"}`}
	for i, c := range cmds {
		if !signing.LooksSigned(c.Payload) {
			t.Fatalf("%s was sent unsigned: %q", c.Verb, c.Payload)
		}
		opened, err := v.Open(c.Verb, c.RequestID, c.Payload)
		if err != nil {
			t.Fatalf("%s %s does not verify: %v", c.Verb, c.RequestID, err)
		}
		if string(opened.Body) != wantBody[i] || opened.KeyID != id {
			t.Fatalf("%s opened to %q by %s", c.Verb, opened.Body, opened.KeyID)
		}
	}
	// Beyond --sign-ttl 2m the node's clock finds the apply expired; the
	// get, sent with the default 5m, is still valid.
	late, err := signing.NewVerifier(signing.Policy{Targets: []string{"n1"}, MaxLifetime: time.Hour, MaxEnvelopeBytes: 1 << 20,
		Keys: []signing.Key{{ID: id, Public: pubKey, Verbs: []string{"*"}}}}, nonces{}, func() time.Time { return testNow.Add(3 * time.Minute) })
	if err != nil {
		t.Fatal(err)
	}
	if _, err := late.Open(cmds[0].Verb, cmds[0].RequestID, cmds[0].Payload); err == nil || !strings.Contains(err.Error(), "expired") {
		t.Fatalf("after --sign-ttl: %v", err)
	}
	if _, err := late.Open(cmds[1].Verb, cmds[1].RequestID, cmds[1].Payload); err != nil {
		t.Fatalf("within the default ttl: %v", err)
	}
}

func TestSignPrintsAnEnvelopeForMosquittoPub(t *testing.T) {
	file, id, pub := generateKey(t)
	manifest := writeFile(t, "cm.yaml", "kind: ConfigMap\n")
	res := runCLIEnv(t, map[string]string{envNode: "n1"}, "", "sign", "apply", "-f", manifest, "--sign-key", file, "--request-id", "r7")
	if res.code != 0 {
		t.Fatalf("sign: %v", res)
	}
	if !strings.Contains(res.stderr, "publish to mqlet/v1/n1/cmd/apply/r7") {
		t.Fatalf("sign does not name the topic: %q", res.stderr)
	}
	pubKey, _ := signing.ParsePublicKey(pub)
	v, err := signing.NewVerifier(signing.Policy{Required: true, Targets: []string{"n1"}, MaxLifetime: time.Hour, MaxEnvelopeBytes: 1 << 20,
		Keys: []signing.Key{{ID: id, Public: pubKey, Verbs: []string{"apply"}}}}, nonces{}, func() time.Time { return testNow })
	if err != nil {
		t.Fatal(err)
	}
	opened, err := v.Open("apply", "r7", []byte(res.stdout))
	if err != nil || string(opened.Body) != "kind: ConfigMap\n" {
		t.Fatalf("printed envelope: %+v, %v", opened, err)
	}
	if res := runCLIEnv(t, map[string]string{envNode: "n1"}, "", "sign", "apply", "-f", manifest); res.code != exitUsage {
		t.Fatalf("sign without a key: %v", res)
	}
}
