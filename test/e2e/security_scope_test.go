package e2e

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	apiv1 "github.com/mqlet/mqlet/api/v1"
)

// scoped publishes a command on the namespace topic of ns and returns its
// request id.
func (e *podEnv) scoped(ns, verb, payload string) string {
	e.t.Helper()
	id := e.nextID(verb)
	e.mq.Publish(apiv1.Scheme{Prefix: prefix, Node: e.node}.CommandIn(apiv1.Scope{Namespace: ns}, verb, id), []byte(payload), false)
	return id
}

// A broker user who may publish only on namespace B's topics (a mosquitto
// ACL on <prefix>/<node>/ns/B/cmd/#) cannot read namespace A's secret:
// not by get, not by a pod of B referring to it (references resolve in the
// pod's own namespace), not by placing a pod in A, not through A's pods.
func TestNamespaceTopicCannotReachAnotherNamespacesSecret(t *testing.T) {
	e := newPodEnv(t, "")
	nsA, nsB := e.ns, e.ns+"-b"
	// Namespace A's secret and a pod of A, applied node-wide.
	const valueA, valueB = "value-of-a-2f81c", "value-of-b-9d03e"
	id := e.nextID("apply")
	e.mq.Command(e.node, "apply", id, fmt.Appendf(nil, `{"apiVersion":"v1","kind":"Secret","metadata":{"name":"pw","namespace":%q},"stringData":{"pw":%q}}`, nsA, valueA))
	e.waitFinal(id, apiv1.Succeeded, podReadyTimeout)
	e.apply(podYAML("holder", nsA, "Always", "sleep 3600"), apiv1.Succeeded, podReadyTimeout)
	e.cleanupPods("holder")

	refused := func(verb, payload string) {
		t.Helper()
		r := e.waitFinalAny(e.scoped(nsB, verb, payload), 30*time.Second)
		if r.Phase != apiv1.Failed || !strings.Contains(r.Message, "scope") {
			t.Errorf("%s %s on namespace %s's topic: %s %q, want failed naming the scope", verb, payload, nsB, r.Phase, r.Message)
		}
		if r.Node != e.node {
			t.Errorf("reply names node %q, want %q", r.Node, e.node)
		}
	}
	refused("get", fmt.Sprintf(`{"kind":"Secret","namespace":%q,"name":"pw"}`, nsA))
	refused("delete", fmt.Sprintf(`{"kind":"Secret","namespace":%q,"name":"pw"}`, nsA))
	refused("logs", fmt.Sprintf(`{"namespace":%q,"name":"holder"}`, nsA))
	refused("restart", fmt.Sprintf(`{"namespace":%q,"name":"holder"}`, nsA))
	// A pod placed in A (where the secret is) is refused whole.
	refused("apply", strings.Replace(string(secretReader("thief", true, valueA, valueB)), `"name":"thief"`, fmt.Sprintf(`"name":"thief","namespace":%q`, nsA), 1))
	// A listing on B's topic shows B only.
	r := e.waitFinalAny(e.scoped(nsB, "get", `{"kind":"Secret"}`), 30*time.Second)
	if r.Phase != apiv1.Succeeded || !strings.HasPrefix(r.Message, "0 pods, 0 configmaps, 0 secrets") {
		t.Fatalf("namespace %s's listing: %s %q", nsB, r.Phase, r.Message)
	}

	t.Cleanup(func() {
		if e.agent.Running() {
			e.waitFinalAny(e.scoped(nsB, "sync", `{"apiVersion":"v1","kind":"List","items":[]}`), podGoneTimeout)
			Eventually(t, podGoneTimeout, "namespace "+nsB+" gone from containerd", func() bool {
				return len(e.cri.Sandboxes(nsB, "reader")) == 0
			})
		}
	})
	// A pod of B naming "pw" does not get A's secret: there is none in B.
	r = e.waitFinalAny(e.scoped(nsB, "apply", string(secretReader("reader", false, valueA, valueB))), podReadyTimeout)
	if r.Phase != apiv1.Failed || !strings.Contains(r.Message, "CreateContainerConfigError") {
		t.Fatalf("pod of %s referring to a secret of %s: %s %q, want CreateContainerConfigError", nsB, nsA, r.Phase, r.Message)
	}
	if n := len(e.cri.Running(nsB, "reader")); n != 0 {
		t.Fatalf("%d containers of %s/reader run without their secret", n, nsB)
	}
	// With B's own secret of that name the pod runs, and sees B's value
	// in its environment and its volume.
	r = e.waitFinalAny(e.scoped(nsB, "apply", fmt.Sprintf(`{"apiVersion":"v1","kind":"Secret","metadata":{"name":"pw"},"stringData":{"pw":%q}}`, valueB)), 30*time.Second)
	if r.Phase != apiv1.Succeeded {
		t.Fatalf("namespace %s's own secret: %s %q", nsB, r.Phase, r.Message)
	}
	r = e.waitFinalAny(e.scoped(nsB, "apply", string(secretReader("reader", true, valueA, valueB))), podReadyTimeout)
	if r.Phase != apiv1.Succeeded {
		t.Fatalf("reader with its own secret: %s %q", r.Phase, r.Message)
	}
	Eventually(t, podReadyTimeout, nsB+"/reader running", func() bool { return len(e.cri.Running(nsB, "reader")) == 1 })
	var lines string
	Eventually(t, 30*time.Second, "reader's verdict in its log", func() bool {
		r := e.waitFinalAny(e.scoped(nsB, "logs", `{"name":"reader"}`), 30*time.Second)
		b, _ := json.Marshal(r.Result)
		lines = string(b)
		if !strings.Contains(lines, "verdict") {
			t.Logf("logs of reader: %s %q %s", r.Phase, r.Message, lines)
		}
		return strings.Contains(lines, "verdict")
	})
	if !strings.Contains(lines, "verdict: own") {
		t.Fatalf("reader's log %s, want verdict: own", lines)
	}
	// The sync of B leaves A alone.
	r = e.waitFinalAny(e.scoped(nsB, "sync", `{"apiVersion":"v1","kind":"List","items":[]}`), podGoneTimeout)
	if r.Phase != apiv1.Succeeded {
		t.Fatalf("sync of %s: %s %q", nsB, r.Phase, r.Message)
	}
	if len(e.cri.Running(nsA, "holder")) != 1 {
		t.Fatalf("sync of %s stopped %s/holder", nsB, nsA)
	}
	id = e.nextID("get")
	e.mq.Command(e.node, "get", id, fmt.Appendf(nil, `{"kind":"Secret","namespace":%q,"name":"pw"}`, nsA))
	e.waitFinal(id, apiv1.Succeeded, 30*time.Second)
}

// secretReader is a pod that reads secret "pw" of its own namespace (env,
// and with volume also a mounted volume) and logs which value it saw,
// never the value itself.
func secretReader(name string, volume bool, valueA, valueB string) []byte {
	script := fmt.Sprintf(`v=$(cat /s/pw 2>/dev/null || echo "$PW"); if [ "$v" = %q ] || [ "$PW" = %q ]; then echo "verdict: leak"; elif [ "$v" = %q ] && [ "$PW" = %q ]; then echo "verdict: own"; else echo "verdict: none"; fi; sleep 3600`, valueA, valueA, valueB, valueB)
	volumes, mounts := "", ""
	if volume {
		volumes = `"volumes":[{"name":"s","secret":{"secretName":"pw"}}],`
		mounts = `,"volumeMounts":[{"name":"s","mountPath":"/s"}]`
	}
	return fmt.Appendf(nil, `{"apiVersion":"v1","kind":"Pod","metadata":{"name":%q},"spec":{"terminationGracePeriodSeconds":2,%s
"containers":[{"name":"main","image":"docker.io/mqlet/busybox:test","imagePullPolicy":"Never","command":["sh","-c",%q],
"env":[{"name":"PW","valueFrom":{"secretKeyRef":{"name":"pw","key":"pw"}}}]%s}]}}`, name, volumes, script, mounts)
}
