package e2e

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	apiv1 "github.com/mqlet/mqlet/api/v1"
)

// The smaller holes a broker login opened (issue 20, class 8); each part
// failed on the binary before its fix.

// A request id someone else used first: the operator's later command under
// it is refused loudly (failed, naming the reuse) and not run, instead of
// being answered from the other command's record and silently dropped.
func TestAttackRequestIDSquatIsRefusedLoudly(t *testing.T) {
	e := newPodEnv(t, "")
	id := e.nextID("apply")
	e.mq.Command(e.node, "get", id, []byte(`{}`)) // the attacker's, first
	e.mq.WaitReply(e.node, id, apiv1.Succeeded, 30*time.Second)
	mark := e.mq.Mark()
	e.mq.Command(e.node, "apply", id, podYAML("squatted", e.ns, "Never", "sleep 3600"))
	var got apiv1.Reply
	e.mq.WaitFor(mark, 30*time.Second, "an answer to the operator's apply", func(m Msg) bool {
		return m.Topic == prefix+"/"+e.node+"/reply/"+id && json.Unmarshal(m.Payload, &got) == nil
	})
	if got.Phase != apiv1.Failed || got.Verb != "apply" || !strings.Contains(got.Message, "already used by a different command") {
		t.Fatalf("the operator's apply under a used id was answered %s %s: %q", got.Phase, got.Verb, got.Message)
	}
	if _, ok := e.status("squatted"); ok || len(e.cri.Containers(e.ns, "squatted")) > 0 {
		t.Fatal("the refused apply ran")
	}
}

// A fake status a broker user publishes, retained, on the node's pod
// topics is cleared: one published while mqlet runs at once, one left
// while it was down at its start; the node's own pods keep theirs.
func TestAttackFakeRetainedPodStatusIsCleared(t *testing.T) {
	e := newPodEnv(t, "")
	e.cleanupPods("real")
	e.apply(e.pod("real", "Always", "sleep 3600"), apiv1.Succeeded, podReadyTimeout)
	fake := func(name string) []byte {
		return []byte(fmt.Sprintf(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":%q,"namespace":%q},"status":{"phase":"Running","message":"all good, trust me"}}`, name, e.ns))
	}
	cleared := func(from int, name string) {
		t.Helper()
		e.mq.WaitFor(from, 30*time.Second, "the fake status of "+name+" cleared", func(m Msg) bool {
			return m.Topic == e.podTopic(name) && len(m.Payload) == 0
		})
	}
	mark := e.mq.Mark()
	e.mq.Publish(e.podTopic("ghost-live"), fake("ghost-live"), true)
	cleared(mark, "ghost-live")

	e.agent.Stop()
	mark = e.mq.Mark()
	e.mq.Publish(e.podTopic("ghost-down"), fake("ghost-down"), true)
	e.agent.Restart()
	e.mq.WaitState(mark, e.node, "online", 30*time.Second)
	cleared(mark, "ghost-down")
	if p, ok := e.status("real"); !ok || p.Status.Phase != "Running" {
		t.Fatalf("the node's own pod lost its status: %+v", p)
	}
	if !strings.Contains(e.agent.Logs(), "cleared a pod status the node did not publish") {
		t.Error("no log line about the cleared fake")
	}
}

// The settings view any broker login may read does not reveal the host
// paths pods may mount, the MQTT login nor where the password lies.
func TestAttackSettingsViewHidesHostPathsAndLogin(t *testing.T) {
	e := newPodEnv(t, "admission:\n  allowedHostPaths: [\"/srv/private-place\"]\n")
	id := e.nextID("get")
	e.mq.Command(e.node, "get", id, []byte(`{"kind":"Config"}`))
	r := e.mq.WaitReply(e.node, id, apiv1.Succeeded, 30*time.Second)
	raw, _ := json.Marshal(r.Result)
	if strings.Contains(string(raw), "private-place") {
		t.Fatalf("the settings view reveals allowedHostPaths: %s", raw)
	}
	var view apiv1.ConfigView
	if err := json.Unmarshal(raw, &view); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"admission.allowedHostPaths", "mqtt.username", "mqtt.passwordFile"} {
		var shown string
		if v, ok := view.Settings[path]; !ok || json.Unmarshal(v.Value, &shown) != nil || shown != "<hidden>" {
			t.Errorf("%s shown as %s", path, v.Value)
		}
	}
}
