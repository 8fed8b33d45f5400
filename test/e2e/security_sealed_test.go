package e2e

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apiv1 "github.com/mqlet/mqlet/api/v1"
)

// A Secret applied with mqletctl travels sealed to the node and rests
// encrypted: a subscriber to the whole prefix never sees its value, nor
// does state.db hold it, and the pod still gets it (env and volume). With
// security.requireSealedSecrets a Secret sent in clear is refused.
func TestSecuritySealedSecretNotOnTheBusNorInTheStore(t *testing.T) {
	e := newPodEnv(t, "security:\n  requireSealedSecrets: true\n")
	e.cleanupPods("sealed")
	// Everything published under the prefix, commands included.
	bus := Connect(t, e.broker.URL())
	bus.Subscribe(prefix + "/#")
	value := "Sealed-" + randomToken(t)
	sum := sha256.Sum256([]byte(value))
	// The pod checks the value against its hash, so neither the value nor
	// its output is in the pod spec or its status; it exits 0 on a match.
	manifest := fmt.Sprintf(`apiVersion: v1
kind: Secret
metadata: {name: pw, namespace: %[1]s}
stringData: {PW: %[2]s}
---
apiVersion: v1
kind: Pod
metadata: {name: sealed, namespace: %[1]s}
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  volumes:
  - {name: s, secret: {secretName: pw}}
  containers:
  - name: main
    image: %[3]s
    imagePullPolicy: Never
    env:
    - {name: PW, valueFrom: {secretKeyRef: {name: pw, key: PW}}}
    volumeMounts:
    - {name: s, mountPath: /s}
    command: ["sh", "-c", "test \"$(printf %%s \"$PW\" | sha256sum | cut -c1-64)\" = %[4]s && test \"$(cat /s/PW | sha256sum | cut -c1-64)\" = %[4]s"]
`, e.ns, value, busybox, hex.EncodeToString(sum[:]))
	file := filepath.Join(t.TempDir(), "sealed.yaml")
	if err := os.WriteFile(file, []byte(manifest), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := ctl(t, "--broker", e.broker.URL(), "--node", e.node, "--timeout", "3m", "--retained-wait", "20s", "apply", "-f", file)
	if code != 0 {
		t.Fatalf("mqletctl apply: exit %d\n%s\n%s", code, out, errOut)
	}
	if !strings.Contains(out, "succeeded") {
		t.Fatalf("the pod did not get the value (its check failed):\n%s\n%s", out, errOut)
	}

	forms := [][]byte{[]byte(value), []byte(base64.StdEncoding.EncodeToString([]byte(value)))}
	var saw int
	for _, m := range bus.Messages() {
		if strings.Contains(m.Topic, "/cmd/apply/") {
			saw++
		}
		for _, f := range forms {
			if bytes.Contains(m.Payload, f) {
				t.Fatalf("the value is readable on the bus, on %s: %s", m.Topic, m.Payload)
			}
		}
	}
	if saw == 0 {
		t.Fatal("the bus subscriber saw no apply command: the test proves nothing")
	}
	db, err := os.ReadFile(filepath.Join(e.stateDir, "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range forms {
		if bytes.Contains(db, f) {
			t.Fatalf("state.db holds the value (%q)", f)
		}
	}
	if strings.Contains(e.agent.Logs(), value) {
		t.Fatal("the value is in mqlet's log")
	}

	// Sent in clear (a dashboard), it is refused and not stored.
	id := e.nextID("apply")
	e.mq.Command(e.node, "apply", id, []byte(fmt.Sprintf(`{"apiVersion":"v1","kind":"Secret","metadata":{"name":"clear","namespace":%q},"stringData":{"PW":"x"}}`, e.ns)))
	r := e.mq.WaitReply(e.node, id, apiv1.Failed, 30*time.Second)
	if !strings.Contains(r.Message, "accepts only sealed Secrets") {
		t.Fatalf("a Secret in clear: %+v", r)
	}
}
