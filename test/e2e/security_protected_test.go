package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	apiv1 "github.com/mqlet/mqlet/api/v1"
)

// A privileged pod admitted because a signing key allowed it runs a script
// from a ConfigMap. Changing (or deleting) that ConfigMap without a
// signature of that profile would run the changer's script with host
// privileges: it is refused, and the pod keeps running the signed script
// until a signed command changes it.
func TestSecuritySignedPrivilegedPodNotSteeredByUnsignedCommands(t *testing.T) {
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "ops.key")
	code, out, errOut := ctl(t, "keys", "generate", "--out", keyFile)
	if code != 0 {
		t.Fatalf("keys generate: exit %d: %s", code, errOut)
	}
	m := regexp.MustCompile(`(?m)^keyId: (\S+) publicKey: (\S+)$`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("keys generate printed no key line: %q", out)
	}
	e := newPodEnv(t, fmt.Sprintf("security:\n  trustedKeys:\n  - publicKey: %s\n    verbs: [\"*\"]\n    maxProfile: privileged\n", m[2]))
	e.cleanupPods("steered")
	cm := func(line string) string {
		return fmt.Sprintf("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: script, namespace: %s}\ndata: {run: %q}\n", e.ns, "echo "+line)
	}
	pod := fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: steered, namespace: %s}
spec:
  terminationGracePeriodSeconds: 1
  volumes:
  - {name: s, configMap: {name: script}}
  containers:
  - name: main
    image: %s
    imagePullPolicy: Never
    securityContext: {privileged: true}
    volumeMounts:
    - {name: s, mountPath: /s}
    command: ["sh", "-c", "while true; do sh /s/run; sleep 1; done"]
`, e.ns, busybox)
	signedApply := func(manifest string) {
		t.Helper()
		file := filepath.Join(dir, "m.yaml")
		if err := os.WriteFile(file, []byte(manifest), 0o600); err != nil {
			t.Fatal(err)
		}
		code, out, errOut := ctl(t, "--broker", e.broker.URL(), "--node", e.node, "--sign-key", keyFile, "--timeout", "3m", "--retained-wait", "20s", "apply", "-f", file)
		if code != 0 {
			t.Fatalf("signed apply: exit %d\n%s\n%s", code, out, errOut)
		}
	}
	printed := func(line string) func() bool {
		return func() bool {
			tail := int64(5)
			lines, _ := logLines(t, e.command("logs", apiv1.LogsRequest{Namespace: e.ns, Name: "steered", TailLines: &tail}, verbsTimeout))
			return len(lines) > 0 && strings.HasSuffix(lines[len(lines)-1], line)
		}
	}
	signedApply(cm("signed-one") + "---\n" + pod)
	Eventually(t, podReadyTimeout, "the pod runs the signed script", printed("signed-one"))

	// Unsigned: refused, nothing changed.
	const refused = "is used by Pod " + "%s/steered, admitted with profile privileged by its signing key"
	for _, c := range []struct{ verb, payload string }{
		{"apply", cm("evil")},
		{"delete", fmt.Sprintf(`{"kind":"ConfigMap","namespace":%q,"name":"script"}`, e.ns)},
	} {
		id := e.nextID(c.verb)
		e.mq.Command(e.node, c.verb, id, []byte(c.payload))
		r := e.mq.WaitReply(e.node, id, apiv1.Failed, 30*time.Second)
		if !strings.Contains(r.Message, fmt.Sprintf(refused, e.ns)) {
			t.Fatalf("unsigned %s of the ConfigMap: %+v", c.verb, r)
		}
	}
	// A signed change goes through and reaches the pod; the refused one
	// never did before it.
	signedApply(cm("signed-two"))
	Eventually(t, podReadyTimeout, "the pod runs the second signed script", printed("signed-two"))
	tail := int64(1000)
	lines, _ := logLines(t, e.command("logs", apiv1.LogsRequest{Namespace: e.ns, Name: "steered", TailLines: &tail}, verbsTimeout))
	for _, l := range lines {
		if strings.Contains(l, "evil") {
			t.Fatalf("the pod ran the unsigned script: %q", l)
		}
	}
}
