package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	apiv1 "github.com/mqlet/mqlet/api/v1"
	"github.com/mqlet/mqlet/internal/testutil/mosquitto"
)

// groupDocConvergeLimit is how soon after coming back a member that was
// offline during a document's publish must run it (docs/fleet.md).
const groupDocConvergeLimit = 30 * time.Second

// groupDocEnv is two mqlets, each on a fleet containerd of its own, on one
// mosquitto, with a recording operator client.
type groupDocEnv struct {
	t      *testing.T
	broker string
	mq     *Client
	ns     string
	group  string
	scheme apiv1.Scheme
	nodes  []*fleetNode
}

func newGroupDocEnv(t *testing.T, groupsOf func(i int, group string) []string) *groupDocEnv {
	t.Helper()
	eps := fleetEndpoints(t)[1:] // the two fleet containerds
	broker := mosquitto.Start(t)
	e := &groupDocEnv{t: t, broker: broker.URL(), mq: Connect(t, broker.URL()), scheme: apiv1.Scheme{Prefix: prefix}}
	e.mq.Subscribe(prefix + "/#")
	suffix := strconv.FormatInt(time.Now().UnixNano()%1e9, 36)
	e.ns, e.group = "e2e-gdoc-"+suffix, "gdoc-"+suffix
	for i, ep := range eps {
		n := &fleetNode{name: fmt.Sprintf("e2e-gdoc-%s-%d", suffix, i)}
		n.cri, n.rt = connectCRIAt(t, ep)
		t.Cleanup(func() { sweepNamespace(t, n.rt, e.ns) })
		var args []string
		if gs := groupsOf(i, e.group); len(gs) > 0 {
			args = append(args, "--groups", strings.Join(gs, ","))
		}
		mark := e.mq.Mark()
		n.agent = StartAgent(t, AgentOpts{Node: n.name, Broker: broker.URL(), CRI: ep, Config: podTestConfig(t.TempDir(), ""), Args: args})
		e.mq.WaitState(mark, n.name, "online", 30*time.Second)
		e.nodes = append(e.nodes, n)
	}
	return e
}

// document is the JSON of the group's document of generation gen running
// busybox pods of the given names.
func (e *groupDocEnv) document(gen uint64, pods ...string) []byte {
	items := []json.RawMessage{}
	for _, p := range pods {
		items = append(items, fmt.Appendf(nil, `{"apiVersion":"v1","kind":"Pod","metadata":{"name":%q,"namespace":%q},"spec":{"restartPolicy":"Always","terminationGracePeriodSeconds":2,"containers":[{"name":"main","image":"docker.io/mqlet/busybox:test","imagePullPolicy":"Never","command":["sh","-c","sleep 3600"]}]}}`, p, e.ns))
	}
	list, err := json.Marshal(map[string]any{"apiVersion": "v1", "kind": "List", "items": items})
	if err != nil {
		e.t.Fatal(err)
	}
	doc, err := json.Marshal(apiv1.GroupDocument{APIVersion: apiv1.GroupDocumentAPIVersion, Kind: apiv1.GroupDocumentKind, Group: e.group, Generation: gen, Objects: list})
	if err != nil {
		e.t.Fatal(err)
	}
	return doc
}

// publish retains doc on the group's document topic.
func (e *groupDocEnv) publish(doc []byte) { e.mq.Publish(e.scheme.GroupDesired(e.group), doc, true) }

// final waits for n's final answer to the document of generation gen.
func (e *groupDocEnv) final(from int, n *fleetNode, gen uint64, timeout time.Duration) apiv1.Reply {
	e.t.Helper()
	id := apiv1.GroupDocumentRequestID(e.group, gen)
	var got apiv1.Reply
	e.mq.WaitFor(from, timeout, n.name+"'s final answer to "+id, func(m Msg) bool {
		var r apiv1.Reply
		if m.Topic != prefix+"/"+n.name+"/reply/"+id || json.Unmarshal(m.Payload, &r) != nil || !r.Final() {
			return false
		}
		got = r
		return true
	})
	return got
}

// generationIn waits for n's retained state to name generation gen of the
// group's document.
func (e *groupDocEnv) generationIn(from int, n *fleetNode, gen uint64) {
	e.t.Helper()
	e.mq.WaitFor(from, 30*time.Second, fmt.Sprintf("%s's state naming generation %d", n.name, gen), func(m Msg) bool {
		var st apiv1.NodeState
		return m.Topic == prefix+"/"+n.name+"/state" && json.Unmarshal(m.Payload, &st) == nil && st.State == apiv1.StateOnline && st.GroupGenerations[e.group] == gen
	})
}

// lastState is n's last state message.
func (e *groupDocEnv) lastState(n *fleetNode) apiv1.NodeState {
	var st apiv1.NodeState
	for _, m := range e.mq.Messages() {
		if m.Topic == prefix+"/"+n.name+"/state" {
			st = apiv1.NodeState{}
			_ = json.Unmarshal(m.Payload, &st)
		}
	}
	return st
}

// event waits for an event of reason on n's events topic since from.
func (e *groupDocEnv) event(from int, n *fleetNode, reason string, timeout time.Duration) v1.Event {
	e.t.Helper()
	var ev v1.Event
	e.mq.WaitFor(from, timeout, n.name+" event "+reason, func(m Msg) bool {
		return m.Topic == prefix+"/"+n.name+"/events" && json.Unmarshal(m.Payload, &ev) == nil && ev.Reason == reason
	})
	return ev
}

// sandboxIDs are the ids of n's sandboxes of pod name.
func (e *groupDocEnv) sandboxIDs(n *fleetNode, name string) []string {
	var ids []string
	for _, sb := range n.cri.Sandboxes(e.ns, name) {
		ids = append(ids, sb.Id)
	}
	return ids
}

// A group's retained document reaches members that were not there when it
// was published: a member offline during the publish runs it within 30 s
// of coming back; a node that joins the group later (live config) runs
// the group's current document; an older generation published later is
// refused with a StaleGroupDocument event and changes nothing on either;
// a document naming an object the node holds from its own commands is
// refused there naming both sources (the node keeps its object and the
// generation it had), while the other member applies it.
func TestGroupDocumentReachesOfflineAndLateMembers(t *testing.T) {
	e := newGroupDocEnv(t, func(i int, group string) []string {
		if i == 0 {
			return []string{"other-x"} // in another group only; joins later
		}
		return []string{group}
	})
	late, member := e.nodes[0], e.nodes[1]
	mark := e.mq.Mark()

	// Generation 1 reaches the online member.
	e.publish(e.document(1, "web1"))
	if r := e.final(mark, member, 1, podReadyTimeout); r.Phase != apiv1.Succeeded || r.Node != member.name {
		t.Fatalf("generation 1 on %s: %s %q (node %q)", member.name, r.Phase, r.Message, r.Node)
	}
	if len(member.cri.Running(e.ns, "web1")) != 1 {
		t.Fatalf("web1 does not run on %s after generation 1", member.name)
	}
	e.generationIn(mark, member, 1)
	if len(late.cri.Sandboxes(e.ns, "web1")) != 0 || len(e.mq.Replies(late.name, apiv1.GroupDocumentRequestID(e.group, 1))) != 0 {
		t.Fatalf("%s, not in the group, took its document", late.name)
	}

	// The member goes offline; generation 2 is published while it is away.
	mark = e.mq.Mark()
	member.agent.Stop()
	e.mq.WaitState(mark, member.name, "offline", 30*time.Second)
	// mqletctl group publish: generation 2 (one above the retained 1);
	// the only member is offline, so its row is Pending and the exit 3.
	code, out, errOut := e.ctlPublish("web2")
	if code != 3 || !regexp.MustCompile(`(?m)^`+member.name+`\s+Pending\s+offline since .*the document is retained`).MatchString(out) || !strings.Contains(errOut, "generation 2 published") {
		t.Fatalf("mqletctl group publish with the only member offline: exit %d\n%s%s", code, out, errOut)
	}
	mark = e.mq.Mark()
	member.agent.Restart()
	e.mq.WaitState(mark, member.name, "online", 30*time.Second)
	back := time.Now()
	if r := e.final(mark, member, 2, podReadyTimeout); r.Phase != apiv1.Succeeded {
		t.Fatalf("generation 2 on %s after coming back: %s %q", member.name, r.Phase, r.Message)
	}
	converged := time.Since(back)
	t.Logf("%s ran generation 2 %v after coming back online", member.name, converged.Round(time.Millisecond))
	if converged > groupDocConvergeLimit {
		t.Fatalf("%s took %v after coming back to run generation 2, want at most %v", member.name, converged, groupDocConvergeLimit)
	}
	if len(member.cri.Running(e.ns, "web2")) != 1 {
		t.Fatalf("web2 does not run on %s after generation 2", member.name)
	}
	Eventually(t, podGoneTimeout, "web1 gone from "+member.name+" (generation 2 replaces the group's objects)", func() bool {
		return len(member.cri.Sandboxes(e.ns, "web1")) == 0
	})
	e.generationIn(mark, member, 2)
	if code, out, errOut := ctl(t, "--broker", e.broker, "--retained-wait", "1s", "group", "status", e.group); code != 0 || !regexp.MustCompile(`(?m)^`+member.name+`\s+online\s+2\s+Applied`).MatchString(out) {
		t.Fatalf("mqletctl group status after the member came back: exit %d\n%s%s", code, out, errOut)
	}
	// Applied once: the queued copy and the retained copy at the
	// resubscription are one generation.
	if n := len(e.finals(member, 2)); n != 1 {
		t.Fatalf("%s answered generation 2 finally %d times, want once", member.name, n)
	}

	// A node that joins the group later gets its current document.
	mark = e.mq.Mark()
	e.mq.Command(late.name, "config", "join2", fmt.Appendf(nil, `{"groups":["other-x",%q]}`, e.group))
	if r := e.mq.WaitReply(late.name, "join2", apiv1.Succeeded, 30*time.Second); r.Phase != apiv1.Succeeded {
		t.Fatalf("joining the group late: %s %q", r.Phase, r.Message)
	}
	if r := e.final(mark, late, 2, podReadyTimeout); r.Phase != apiv1.Succeeded || r.Node != late.name {
		t.Fatalf("generation 2 on the late joiner %s: %s %q (node %q)", late.name, r.Phase, r.Message, r.Node)
	}
	if len(late.cri.Running(e.ns, "web2")) != 1 {
		t.Fatalf("web2 does not run on the late joiner %s", late.name)
	}
	e.generationIn(mark, late, 2)
	if len(late.cri.Sandboxes(e.ns, "web1")) != 0 {
		t.Fatalf("the late joiner ran web1 of generation 1, which it never received")
	}

	// An older generation published later is refused and changes nothing.
	// mqletctl refuses to publish it (the members applied 2)...
	if code, _, errOut := e.ctlPublish("old", "--generation", "1"); code != 1 || !strings.Contains(errOut, "--generation 1 is not newer than generation 2") {
		t.Fatalf("mqletctl group publish of an old generation: exit %d %s", code, errOut)
	}
	// ... and the members refuse it when it is published all the same.
	before := map[string][]string{member.name: e.sandboxIDs(member, "web2"), late.name: e.sandboxIDs(late, "web2")}
	mark = e.mq.Mark()
	e.publish(e.document(1, "old"))
	for _, n := range []*fleetNode{member, late} {
		ev := e.event(mark, n, "StaleGroupDocument", 30*time.Second)
		if ev.Type != v1.EventTypeWarning || !strings.Contains(ev.Message, "generation 1 not applied") || !strings.Contains(ev.Message, "generation 2 was applied") {
			t.Fatalf("stale document event on %s: %s %q", n.name, ev.Type, ev.Message)
		}
	}
	for _, n := range []*fleetNode{member, late} {
		e.barrier(n, "after-stale")
		if got := e.sandboxIDs(n, "web2"); len(got) != 1 || got[0] != before[n.name][0] {
			t.Fatalf("the stale document changed web2 on %s: sandboxes %v, before %v", n.name, got, before[n.name])
		}
		if len(n.cri.Sandboxes(e.ns, "old")) != 0 {
			t.Fatalf("the stale document's pod runs on %s", n.name)
		}
		for _, m := range e.mq.Messages()[mark:] {
			if strings.HasPrefix(m.Topic, prefix+"/"+n.name+"/reply/") && !strings.HasSuffix(m.Topic, "/after-stale") {
				t.Fatalf("%s answered the stale document: %s %s", n.name, m.Topic, m.Payload)
			}
		}
		if g := e.lastState(n).GroupGenerations[e.group]; g != 2 {
			t.Fatalf("%s's state names generation %d after the stale document, want 2", n.name, g)
		}
	}

	// The late joiner holds a pod of its own named as the next
	// generation's: there the document is refused naming both sources and
	// changes nothing; the member applies it.
	if r := e.applyOwn(late, "clash"); r.Phase != apiv1.Succeeded {
		t.Fatalf("node apply of clash on %s: %s %q", late.name, r.Phase, r.Message)
	}
	clashBefore := e.sandboxIDs(late, "clash")
	web2Before := e.sandboxIDs(late, "web2")
	mark = e.mq.Mark()
	// mqletctl group publish: generation 3 (above the members' 2, though
	// the stale 1 is retained now); one row per member, the refusal
	// failed naming both sources, exit 1.
	code, out, errOut = e.ctlPublish("web2", "clash")
	if code != 1 || !regexp.MustCompile(`(?m)^`+member.name+`\s+succeeded`).MatchString(out) || !regexp.MustCompile(`(?m)^`+late.name+`\s+failed\s+.*source node`).MatchString(out) || !strings.Contains(errOut, "generation 3 published") {
		t.Fatalf("mqletctl group publish of generation 3: exit %d\n%s%s", code, out, errOut)
	}
	if r := e.final(mark, member, 3, podReadyTimeout); r.Phase != apiv1.Succeeded {
		t.Fatalf("generation 3 on %s: %s %q", member.name, r.Phase, r.Message)
	}
	if len(member.cri.Running(e.ns, "clash")) != 1 {
		t.Fatalf("clash does not run on %s after generation 3", member.name)
	}
	r := e.final(mark, late, 3, 30*time.Second)
	if r.Phase != apiv1.Failed || !strings.Contains(r.Message, "source node") || !strings.Contains(r.Message, "group/"+e.group) {
		t.Fatalf("generation 3 on %s, which holds clash from its own commands: %s %q, want failed naming both sources", late.name, r.Phase, r.Message)
	}
	e.barrier(late, "after-clash")
	if got := e.sandboxIDs(late, "clash"); len(got) != 1 || got[0] != clashBefore[0] {
		t.Fatalf("the refused document changed clash on %s: %v, before %v", late.name, got, clashBefore)
	}
	if got := e.sandboxIDs(late, "web2"); len(got) != 1 || got[0] != web2Before[0] {
		t.Fatalf("the refused document changed web2 on %s: %v, before %v", late.name, got, web2Before)
	}
	if g := e.lastState(late).GroupGenerations[e.group]; g != 2 {
		t.Fatalf("%s's state names generation %d after refusing generation 3, want 2", late.name, g)
	}
	e.generationIn(mark, member, 3)
	code, out, errOut = ctl(t, "--broker", e.broker, "--retained-wait", "1s", "group", "status", e.group)
	if code != 1 || !regexp.MustCompile(`(?m)^`+member.name+`\s+online\s+3\s+Applied`).MatchString(out) || !regexp.MustCompile(`(?m)^`+late.name+`\s+online\s+2\s+Behind`).MatchString(out) {
		t.Fatalf("mqletctl group status with the late joiner behind: exit %d\n%s%s", code, out, errOut)
	}
	// The node's own pod is still its own.
	mark = e.mq.Mark()
	e.mq.Command(late.name, "delete", "del-clash", fmt.Appendf(nil, `{"kind":"Pod","namespace":%q,"name":"clash"}`, e.ns))
	if r := e.mq.WaitReply(late.name, "del-clash", apiv1.Succeeded, podGoneTimeout); r.Phase != apiv1.Succeeded {
		t.Fatalf("node delete of its own clash on %s: %s %q", late.name, r.Phase, r.Message)
	}
}

// ctlPublish runs mqletctl group publish of busybox pods named pods.
func (e *groupDocEnv) ctlPublish(pods ...string) (int, string, string) {
	e.t.Helper()
	var names, extra []string
	for i, p := range pods {
		if strings.HasPrefix(p, "--") {
			extra = pods[i:]
			break
		}
		names = append(names, p)
	}
	var docs []string
	for _, n := range names {
		docs = append(docs, string(podYAML(n, e.ns, "Always", "sleep 3600")))
	}
	file := filepath.Join(e.t.TempDir(), "group.yaml")
	if err := os.WriteFile(file, []byte(strings.Join(docs, "---\n")), 0o600); err != nil {
		e.t.Fatal(err)
	}
	args := append([]string{"--broker", e.broker, "--retained-wait", "1s", "--timeout", "90s", "group", "publish", e.group, "-f", file}, extra...)
	return ctl(e.t, args...)
}

// finals are n's final answers to generation gen.
func (e *groupDocEnv) finals(n *fleetNode, gen uint64) []apiv1.Reply {
	var out []apiv1.Reply
	for _, r := range e.mq.Replies(n.name, apiv1.GroupDocumentRequestID(e.group, gen)) {
		if r.Final() {
			out = append(out, r)
		}
	}
	return out
}

// applyOwn applies a busybox pod name with n's own (node) source.
func (e *groupDocEnv) applyOwn(n *fleetNode, name string) apiv1.Reply {
	e.t.Helper()
	id := "own-" + name
	e.mq.Command(n.name, "apply", id, podYAML(name, e.ns, "Always", "sleep 3600"))
	return e.mq.WaitReply(n.name, id, apiv1.Succeeded, podReadyTimeout)
}

// barrier sends n a get and waits for its answer: n handles commands and
// documents one at a time in the order they came, so whatever a document
// published before did to the store (and its replies) is done by then.
func (e *groupDocEnv) barrier(n *fleetNode, id string) {
	e.t.Helper()
	e.mq.Command(n.name, "get", id, fmt.Appendf(nil, `{"kind":"Pod","namespace":%q}`, e.ns))
	e.mq.WaitReply(n.name, id, apiv1.Succeeded, 30*time.Second)
}

// nodeLabelsOf waits for a node object of n on the node topic whose labels
// satisfy ok, and returns them.
func nodeLabelsOf(t *testing.T, mq *Client, from int, node, what string, timeout time.Duration, ok func(map[string]string) bool) map[string]string {
	t.Helper()
	var got map[string]string
	mq.WaitFor(from, timeout, node+"'s node object "+what, func(m Msg) bool {
		var n v1.Node
		if m.Topic != prefix+"/"+node+"/node" || json.Unmarshal(m.Payload, &n) != nil || !ok(n.Labels) {
			return false
		}
		got = n.Labels
		return true
	})
	return got
}

// A node's groups are labels of its published v1.Node
// (group.mqlet.io/<g>: "true") beside its configured nodeLabels, from the
// start and, when it joins or leaves a group live (config), within a few
// seconds (not at the next restart): `get nodes --group` and `-L` see
// them, and pods are admitted against them (a nodeSelector on a group's
// label runs only once the node is in it). The configured nodeLabels
// change live the same way.
func TestGroupLabelsFollowLiveGroups(t *testing.T) {
	eps := fleetEndpoints(t)[1:]
	broker := mosquitto.Start(t)
	mq := Connect(t, broker.URL())
	mq.Subscribe(prefix + "/#")
	suffix := strconv.FormatInt(time.Now().UnixNano()%1e9, 36)
	name, ns, g1, g2 := "e2e-glabels-"+suffix, "e2e-glabels-"+suffix, "gl1-"+suffix, "gl2-"+suffix
	cri, rt := connectCRIAt(t, eps[0])
	t.Cleanup(func() { sweepNamespace(t, rt, ns) })
	mark := mq.Mark()
	StartAgent(t, AgentOpts{Node: name, Broker: broker.URL(), CRI: eps[0], Config: podTestConfig(t.TempDir(), "nodeLabels:\n  site: plant-3\n"), Args: []string{"--groups", g1}})
	mq.WaitState(mark, name, "online", 30*time.Second)
	nodeLabelsOf(t, mq, mark, name, "labelled with "+g1+" and site", 30*time.Second, func(l map[string]string) bool {
		return l[apiv1.GroupLabel(g1)] == "true" && l["site"] == "plant-3" && l["kubernetes.io/hostname"] == name
	})
	listed := func(args ...string) {
		t.Helper()
		code, out, errOut := ctl(t, append([]string{"--broker", broker.URL(), "--retained-wait", "1s", "get", "nodes"}, args...)...)
		if code != 0 || !regexp.MustCompile(`(?m)^`+name+`\s+online`).MatchString(out) {
			t.Fatalf("get nodes %v: exit %d\n%s%s", args, code, out, errOut)
		}
	}
	listed("--group", g1)
	listed("-L", apiv1.GroupLabel(g1)+"=true,site=plant-3")

	// A pod for the members of g2 is not admitted before the node joins it.
	selected := fmt.Appendf(nil, `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"for-g2","namespace":%q},"spec":{"nodeSelector":{%q:"true"},"terminationGracePeriodSeconds":2,"containers":[{"name":"main","image":"docker.io/mqlet/busybox:test","imagePullPolicy":"Never","command":["sh","-c","sleep 3600"]}]}}`, ns, apiv1.GroupLabel(g2))
	mq.Command(name, "apply", "sel1", selected)
	if r := mq.WaitReply(name, "sel1", apiv1.Failed, 30*time.Second); !strings.Contains(r.Message, "NodeAffinity") {
		t.Fatalf("a pod selecting %s's label on a node outside it: %s %q", g2, r.Phase, r.Message)
	}

	// Joining g2 live: the published node carries its label within 5 s
	// (the node status check runs every 10 s: this is the live change, not
	// the next check), and pods selecting it are admitted.
	mark = mq.Mark()
	mq.Command(name, "config", "join", fmt.Appendf(nil, `{"groups":[%q,%q]}`, g1, g2))
	mq.WaitReply(name, "join", apiv1.Succeeded, 30*time.Second)
	joined := time.Now()
	nodeLabelsOf(t, mq, mark, name, "labelled with "+g2, 5*time.Second, func(l map[string]string) bool {
		return l[apiv1.GroupLabel(g1)] == "true" && l[apiv1.GroupLabel(g2)] == "true" && l["site"] == "plant-3"
	})
	t.Logf("the node object named %s %v after the config reply", g2, time.Since(joined).Round(time.Millisecond))
	listed("--group", g2)
	listed("-L", apiv1.GroupLabel(g2)+"=true")
	mq.Command(name, "apply", "sel2", selected)
	mq.WaitReply(name, "sel2", apiv1.Succeeded, podReadyTimeout)
	if len(cri.Running(ns, "for-g2")) != 1 {
		t.Fatalf("for-g2 does not run after the node joined %s", g2)
	}

	// Leaving g1 live: its label goes.
	mark = mq.Mark()
	mq.Command(name, "config", "leave", fmt.Appendf(nil, `{"groups":[%q]}`, g2))
	mq.WaitReply(name, "leave", apiv1.Succeeded, 30*time.Second)
	nodeLabelsOf(t, mq, mark, name, "without "+g1, 5*time.Second, func(l map[string]string) bool {
		_, in1 := l[apiv1.GroupLabel(g1)]
		return !in1 && l[apiv1.GroupLabel(g2)] == "true"
	})
	if code, out, _ := ctl(t, "--broker", broker.URL(), "--retained-wait", "1s", "get", "nodes", "-L", apiv1.GroupLabel(g1)+"=true"); code == 0 || strings.Contains(out, name) {
		t.Fatalf("get nodes -L %s=true still lists the node after it left: exit %d\n%s", apiv1.GroupLabel(g1), code, out)
	}
	// The configured labels are live too (mqletctl config set): the node
	// object and -L follow, a group's label cannot be set as one.
	mark = mq.Mark()
	if code, out, errOut := ctl(t, "--broker", broker.URL(), "--node", name, "config", "set", "nodeLabels=site=plant-4,tier=edge"); code != 0 {
		t.Fatalf("config set nodeLabels: exit %d\n%s%s", code, out, errOut)
	}
	nodeLabelsOf(t, mq, mark, name, "with site=plant-4", 5*time.Second, func(l map[string]string) bool {
		return l["site"] == "plant-4" && l["tier"] == "edge" && l[apiv1.GroupLabel(g2)] == "true" && l["kubernetes.io/hostname"] == name
	})
	listed("-L", "site=plant-4,tier=edge")
	if code, out, errOut := ctl(t, "--broker", broker.URL(), "--node", name, "config", "set", "nodeLabels="+apiv1.GroupLabel(g1)+"=true"); code == 0 || !strings.Contains(out+errOut, "from the node's groups") {
		t.Fatalf("config set of a group's label as a node label: exit %d\n%s%s", code, out, errOut)
	}
	mq.Command(name, "delete", "del", fmt.Appendf(nil, `{"kind":"Pod","namespace":%q,"name":"for-g2"}`, ns))
	mq.WaitReply(name, "del", apiv1.Succeeded, podGoneTimeout)
}

// A member in signed-only mode applies only a group document signed by a
// trusted key: mqletctl group publish without a key, or with a key the
// node does not trust, gets the member's refusal (its FailedGroupDocument
// event) as a failed row and exit 1, and nothing is applied; with the
// trusted key the member applies it and group status names the key.
func TestSignedGroupDocumentOnARealAgent(t *testing.T) {
	b := mosquitto.Start(t)
	dir := t.TempDir()
	suffix := strconv.FormatInt(time.Now().UnixNano()%1e9, 36)
	node, group := "e2e-gsign-"+suffix, "gsign-"+suffix
	key := func(name string) (file, id, pub string) {
		file = filepath.Join(dir, name+".key")
		code, out, errOut := ctl(t, "keys", "generate", "--out", file)
		m := regexp.MustCompile(`(?m)^keyId: (\S+) publicKey: (\S+)$`).FindStringSubmatch(out)
		if code != 0 || m == nil {
			t.Fatalf("keys generate: exit %d: %s%s", code, out, errOut)
		}
		return file, m[1], m[2]
	}
	opsKey, opsID, opsPub := key("ops")
	strangerKey, _, _ := key("stranger")
	mq := Connect(t, b.URL())
	mq.Subscribe(prefix + "/#")
	cfg := fmt.Sprintf("security:\n  commands: signed-only\n  trustedKeys:\n  - publicKey: %s\n    verbs: [\"*\"]\n", opsPub)
	StartAgent(t, AgentOpts{Node: node, Broker: b.URL(), Config: cfg, Args: []string{"--groups", group}})
	mq.WaitState(0, node, "online", 30*time.Second)
	file := filepath.Join(dir, "cm.yaml")
	if err := os.WriteFile(file, []byte("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: line-settings\n  namespace: default\ndata:\n  speed: \"3\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	publish := func(extra ...string) (int, string) {
		t.Helper()
		code, out, errOut := ctl(t, append([]string{"--broker", b.URL(), "--retained-wait", "1s", "--timeout", "30s", "group", "publish", group, "-f", file}, extra...)...)
		return code, out + errOut
	}
	for _, tc := range []struct {
		extra []string
		want  string
	}{
		{nil, "signature required"},
		{[]string{"--sign-key", strangerKey}, "unknown key id"},
	} {
		code, out := publish(tc.extra...)
		if code != 1 || !regexp.MustCompile(`(?m)^`+node+`\s+failed\s+FailedGroupDocument: .*`+tc.want).MatchString(out) {
			t.Fatalf("publish %v: want exit 1 and the member's refusal (%s): exit %d\n%s", tc.extra, tc.want, code, out)
		}
	}
	if st := lastStateOf(mq, node); len(st.GroupGenerations) != 0 {
		t.Fatalf("a refused document was applied: %v", st.GroupGenerations)
	}
	code, out := publish("--sign-key", opsKey)
	if code != 0 || !regexp.MustCompile(`(?m)^`+node+`\s+succeeded`).MatchString(out) {
		t.Fatalf("publish signed by the trusted key: exit %d\n%s", code, out)
	}
	code, out, errOut := ctl(t, "--broker", b.URL(), "--retained-wait", "1s", "group", "status", group)
	if code != 0 || !strings.Contains(out, "signed by key "+opsID) || !regexp.MustCompile(`(?m)^`+node+`\s+online\s+3\s+Applied`).MatchString(out) {
		t.Fatalf("group status: exit %d\n%s%s", code, out, errOut)
	}
}

// lastStateOf is node's last state message seen by mq.
func lastStateOf(mq *Client, node string) apiv1.NodeState {
	var st apiv1.NodeState
	for _, m := range mq.Messages() {
		if m.Topic == prefix+"/"+node+"/state" {
			st = apiv1.NodeState{}
			_ = json.Unmarshal(m.Payload, &st)
		}
	}
	return st
}
