package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/mqlet/mqlet/mqtt/broker"
	"github.com/mqlet/mqlet/sealing"
	"github.com/mqlet/mqlet/signing"
)

const cliSecretValue = "cli-sealed-value-0c41"

// apply seals a Secret to the sealing key in the node's retained state:
// the command on the broker holds no value, and the node's key opens it.
func TestApplySealsSecretsToTheNodesKey(t *testing.T) {
	url := startBroker(t, broker.Options{})
	agent := startFakeAgent(t, url, func(r received) []fakeReply { return []fakeReply{{Phase: "succeeded"}} })
	file := writeFile(t, "secret.yaml", "apiVersion: v1\nkind: Secret\nmetadata: {name: creds}\nstringData: {pw: "+cliSecretValue+"}\n")
	res := runCLI(t, url, "", "apply", "-f", file)
	if res.code != 0 {
		t.Fatalf("apply: %v", res)
	}
	got := agent.only(t).Payload
	if bytes.Contains(got, []byte(cliSecretValue)) {
		t.Fatalf("the command holds the value: %s", got)
	}
	var sec v1.Secret
	if err := json.Unmarshal(got, &sec); err != nil {
		t.Fatal(err)
	}
	if err := agent.sealing.UnsealSecret(&sec); err != nil || string(sec.Data["pw"]) != cliSecretValue {
		t.Fatalf("the node cannot open it: %v %q", err, sec.Data["pw"])
	}

	// --seal-to names the key: one the node does not hold makes a Secret it refuses.
	other, err := sealing.NewIdentity()
	if err != nil {
		t.Fatal(err)
	}
	res = runCLI(t, url, "", "apply", "-f", file, "--seal-to", other.Recipient())
	if res.code != 0 {
		t.Fatalf("apply --seal-to: %v", res)
	}
	<-agent.got // the first apply
	last := <-agent.got
	sec = v1.Secret{}
	if err := json.Unmarshal(last.Payload, &sec); err != nil {
		t.Fatal(err)
	}
	if err := other.UnsealSecret(&sec); err != nil {
		t.Fatalf("--seal-to key cannot open it: %v", err)
	}

	res = runCLI(t, url, "", "apply", "-f", file, "--unsealed")
	if res.code != 0 {
		t.Fatalf("apply --unsealed: %v", res)
	}
	if last = <-agent.got; !bytes.Contains(last.Payload, []byte(cliSecretValue)) {
		t.Fatalf("--unsealed did not send the manifest as it is: %s", last.Payload)
	}
}

// A node that publishes no sealing key gets no Secret in clear by mistake.
func TestApplyRefusesToSendASecretInClearByDefault(t *testing.T) {
	url := startBroker(t, broker.Options{})
	startFakeAgent(t, url, func(r received) []fakeReply { return []fakeReply{{Phase: "succeeded"}} })
	c := testClient(t, url, "old-node")
	mustPublish(t, c, scheme.State(), true, []byte(`{"state":"online","bootId":"b1","version":"old"}`))
	file := writeFile(t, "secret.yaml", "apiVersion: v1\nkind: Secret\nmetadata: {name: creds}\nstringData: {pw: "+cliSecretValue+"}\n")
	res := runCLI(t, url, "", "apply", "-f", file)
	if res.code != 1 || !strings.Contains(res.stderr, "publishes no sealingKey") || !strings.Contains(res.stderr, "--unsealed") {
		t.Fatalf("apply to a node without a sealing key: %v", res)
	}
}

// sign --seal-to seals the Secrets of the body it signs: the envelope for
// mosquitto_pub carries no value.
func TestSignSealsSecretsWithSealTo(t *testing.T) {
	file, id, pub := generateKey(t)
	node, err := sealing.NewIdentity()
	if err != nil {
		t.Fatal(err)
	}
	manifest := writeFile(t, "secret.yaml", "apiVersion: v1\nkind: Secret\nmetadata: {name: creds}\nstringData: {pw: "+cliSecretValue+"}\n")
	res := runCLIEnv(t, map[string]string{envNode: "n1"}, "", "sign", "apply", "-f", manifest, "--sign-key", file, "--request-id", "r8", "--seal-to", node.Recipient())
	if res.code != 0 {
		t.Fatalf("sign --seal-to: %v", res)
	}
	pubKey, _ := signing.ParsePublicKey(pub)
	v, err := signing.NewVerifier(signing.Policy{Required: true, Targets: []string{"n1"}, MaxLifetime: time.Hour, MaxEnvelopeBytes: 1 << 20,
		Keys: []signing.Key{{ID: id, Public: pubKey, Verbs: []string{"apply"}}}}, nonces{}, func() time.Time { return testNow })
	if err != nil {
		t.Fatal(err)
	}
	opened, err := v.Open("apply", "r8", []byte(res.stdout))
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(opened.Body, []byte(cliSecretValue)) {
		t.Fatalf("the signed body holds the value: %s", opened.Body)
	}
	var sec v1.Secret
	if err := json.Unmarshal(opened.Body, &sec); err != nil {
		t.Fatal(err)
	}
	if err := node.UnsealSecret(&sec); err != nil || string(sec.Data["pw"]) != cliSecretValue {
		t.Fatalf("the node cannot open it: %v", err)
	}
}
