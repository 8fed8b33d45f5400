package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	apiv1 "github.com/mqlet/mqlet/api/v1"
)

// The scrubber as a weapon (issue 20, class 3): each test failed on the
// binary that scrubbed every published message with every secret value.

// A Secret whose values are the protocol's own words blinds nothing:
// replies, pod statuses, node conditions and the node state keep them.
func TestAttackProtocolWordSecretsBlindNothing(t *testing.T) {
	e := newPodEnv(t, "  nodeStatusInterval: 2s\n") // under telemetry
	e.cleanupPods("web")
	e.apply([]byte(fmt.Sprintf(`{"apiVersion":"v1","kind":"Secret","metadata":{"name":"words","namespace":%q},"stringData":{"a":"succeeded","b":"Running","c":"True","d":"online","e":"Ready"}}`, e.ns)), apiv1.Succeeded, 30*time.Second)
	mark := e.mq.Mark()
	r := e.apply(e.pod("web", "Always", "sleep 3600"), apiv1.Succeeded, podReadyTimeout)
	if r.Phase != apiv1.Succeeded {
		t.Fatalf("reply %+v", r)
	}
	e.waitStatus("web", 30*time.Second, "Running and Ready True", func(p *v1.Pod) bool {
		for _, c := range p.Status.Conditions {
			if c.Type == v1.PodReady && c.Status == v1.ConditionTrue {
				return p.Status.Phase == v1.PodRunning
			}
		}
		return false
	})
	e.mq.WaitFor(mark, 30*time.Second, "a node status with Ready True", func(m Msg) bool {
		var n v1.Node
		if m.Topic != prefix+"/"+e.node+"/node" || json.Unmarshal(m.Payload, &n) != nil {
			return false
		}
		for _, c := range n.Status.Conditions {
			if c.Type == v1.NodeReady && c.Status == v1.ConditionTrue {
				return true
			}
		}
		return false
	})
	for _, m := range e.mq.Messages()[mark:] {
		if strings.Contains(m.Topic, "/cmd/") {
			continue
		}
		if bytes.Contains(m.Payload, []byte("redacted")) {
			t.Errorf("the protocol blinded on %s: %s", m.Topic, m.Payload)
		}
	}
}

// Secret values come back redacted only in the text of a pod given them:
// a ConfigMap of candidates and the logs of a pod printing candidates come
// back as sent, so nobody learns which candidate is another's secret.
func TestAttackScrubberOracleLearnsNothing(t *testing.T) {
	e := newPodEnv(t, "")
	e.cleanupPods("guesser")
	pin := "48" + fmt.Sprint(time.Now().UnixNano()%10000+1000)
	e.apply([]byte(fmt.Sprintf(`{"apiVersion":"v1","kind":"Secret","metadata":{"name":"pin","namespace":%q},"stringData":{"pin":%q}}`, e.ns, pin)), apiv1.Succeeded, 30*time.Second)
	candidates := []string{"111111", pin, "222222"}
	e.apply([]byte(fmt.Sprintf(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"guess","namespace":%q},"data":{"a":%q,"b":%q,"c":%q}}`, e.ns, candidates[0], candidates[1], candidates[2])), apiv1.Succeeded, 30*time.Second)
	id := e.nextID("get")
	e.mq.Command(e.node, "get", id, []byte(fmt.Sprintf(`{"kind":"ConfigMap","namespace":%q,"name":"guess"}`, e.ns)))
	r := e.mq.WaitReply(e.node, id, apiv1.Succeeded, 30*time.Second)
	raw, _ := json.Marshal(r.Result)
	for _, c := range candidates {
		if !strings.Contains(string(raw), c) {
			t.Errorf("candidate %s did not come back as sent: %s", c, raw)
		}
	}
	e.apply(e.pod("guesser", "Never", "echo 111111; echo "+pin+"; echo 222222"), apiv1.Succeeded, podReadyTimeout)
	e.waitStatus("guesser", 60*time.Second, "finished", func(p *v1.Pod) bool { return p.Status.Phase == v1.PodSucceeded })
	lid := e.nextID("logs")
	e.mq.Command(e.node, "logs", lid, []byte(fmt.Sprintf(`{"namespace":%q,"name":"guesser"}`, e.ns)))
	lr := e.mq.WaitReply(e.node, lid, apiv1.Succeeded, 30*time.Second)
	lraw, _ := json.Marshal(lr.Result)
	if !strings.Contains(string(lraw), pin) || strings.Contains(string(lraw), "redacted") {
		t.Fatalf("a pod not given the secret had its output redacted (an oracle): %s", lraw)
	}
}

// A value printed across a log chunk boundary is not reconstructable from
// the published chunks: the chunker holds back an end that begins a value.
func TestAttackSecretAcrossLogChunksIsScrubbed(t *testing.T) {
	e := newPodEnv(t, "logs:\n  maxChunkBytes: 4096\n")
	e.cleanupPods("splitter")
	value := "SplitSecret-" + randomToken(t)
	// One line longer than a chunk, the value straddling the cut.
	cmd := `head -c 2556 /dev/zero | tr '\0' x; echo "$PW tail"`
	pod := fmt.Sprintf(`{"apiVersion":"v1","kind":"List","items":[
	  {"apiVersion":"v1","kind":"Secret","metadata":{"name":"pw","namespace":%q},"stringData":{"PW":%q}},
	  {"apiVersion":"v1","kind":"Pod","metadata":{"name":"splitter","namespace":%q},"spec":{"restartPolicy":"Never","terminationGracePeriodSeconds":1,
	    "containers":[{"name":"main","image":%q,"imagePullPolicy":"Never","command":["sh","-c",%q],
	      "env":[{"name":"PW","valueFrom":{"secretKeyRef":{"name":"pw","key":"PW"}}}]}]}}]}`, e.ns, value, e.ns, busybox, cmd)
	e.apply([]byte(pod), apiv1.Succeeded, podReadyTimeout)
	e.waitStatus("splitter", 60*time.Second, "finished", func(p *v1.Pod) bool { return p.Status.Phase == v1.PodSucceeded })
	id := e.nextID("logs")
	mark := e.mq.Mark()
	e.mq.Command(e.node, "logs", id, []byte(fmt.Sprintf(`{"namespace":%q,"name":"splitter"}`, e.ns)))
	e.mq.WaitReply(e.node, id, apiv1.Succeeded, 30*time.Second)
	var joined strings.Builder
	chunks := 0
	for _, m := range e.mq.Messages()[mark:] {
		var rep struct {
			Seq    int `json:"seq"`
			Result struct {
				Lines []string `json:"lines"`
			} `json:"result"`
		}
		if m.Topic != prefix+"/"+e.node+"/reply/"+id || json.Unmarshal(m.Payload, &rep) != nil {
			continue
		}
		if rep.Seq > 0 {
			chunks++
		}
		joined.WriteString(strings.Join(rep.Result.Lines, ""))
	}
	if chunks < 2 {
		t.Fatalf("the log came in %d chunks; the test needs a cut", chunks)
	}
	if strings.Contains(joined.String(), value) || !strings.Contains(joined.String(), "<redacted> tail") {
		t.Fatalf("the value is reconstructable from the chunks (or not redacted): ...%s", joined.String()[max(0, joined.Len()-120):])
	}
}

// A deleted Secret's value stays scrubbed across a restart of the agent: a
// pod that was given it still prints it in its log, and after the restart
// the agent must still know the value it no longer stores (kept sealed as
// a retired value), or the log is published in clear.
func TestAttackRetiredSecretScrubbedInLogsAfterRestart(t *testing.T) {
	e := newPodEnv(t, "")
	e.cleanupPods("retired")
	value := "Retired-" + randomToken(t)
	pod := fmt.Sprintf(`{"apiVersion":"v1","kind":"List","items":[
	  {"apiVersion":"v1","kind":"Secret","metadata":{"name":"pw","namespace":%q},"stringData":{"PW":%q}},
	  {"apiVersion":"v1","kind":"Pod","metadata":{"name":"retired","namespace":%q},"spec":{"restartPolicy":"Never","terminationGracePeriodSeconds":1,
	    "containers":[{"name":"main","image":%q,"imagePullPolicy":"Never","command":["sh","-c","echo \"$PW retired\""],
	      "env":[{"name":"PW","valueFrom":{"secretKeyRef":{"name":"pw","key":"PW"}}}]}]}}]}`, e.ns, value, e.ns, busybox)
	e.apply([]byte(pod), apiv1.Succeeded, podReadyTimeout)
	e.waitStatus("retired", 60*time.Second, "finished", func(p *v1.Pod) bool { return p.Status.Phase == v1.PodSucceeded })
	del := e.nextID("delete")
	e.mq.Command(e.node, "delete", del, []byte(`{"kind":"Secret","namespace":"`+e.ns+`","name":"pw"}`))
	e.mq.WaitReply(e.node, del, apiv1.Succeeded, 30*time.Second)

	e.agent.Stop()
	mark := e.mq.Mark()
	e.agent.Restart()
	e.mq.WaitState(mark, e.node, "online", 30*time.Second)
	id := e.nextID("logs")
	e.mq.Command(e.node, "logs", id, []byte(fmt.Sprintf(`{"namespace":%q,"name":"retired"}`, e.ns)))
	r := e.mq.WaitReply(e.node, id, apiv1.Succeeded, 30*time.Second)
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false) // the test reads "<redacted>" as published
	_ = enc.Encode(r.Result)
	raw := buf.Bytes()
	if !strings.Contains(string(raw), "retired") {
		t.Fatalf("the log of the pod is not in the reply: %s", raw)
	}
	for _, m := range e.mq.Messages()[mark:] {
		if bytes.Contains(m.Payload, []byte(value)) {
			t.Fatalf("after a restart the deleted secret's value was published on %s: %s", m.Topic, m.Payload)
		}
	}
	if !strings.Contains(string(raw), "<redacted> retired") {
		t.Fatalf("the log line does not show the value redacted: %s", raw)
	}
}
