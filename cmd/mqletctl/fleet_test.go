package main

import (
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/yaml"

	apiv1 "github.com/mqlet/mqlet/api/v1"
	"github.com/mqlet/mqlet/internal/testutil/mosquitto"
	"github.com/mqlet/mqlet/signing"
)

// fakeNode is one node of a fake fleet on a real mosquitto: it publishes
// its retained state (with its groups) and node object (with its labels),
// takes its own and its groups' commands, and answers them with answer.
// It keeps the Pods applied to it and publishes their retained status
// (Ready unless the node's image check fails), as the agent does.
type fakeNode struct {
	t      *testing.T
	name   string
	groups []string
	labels map[string]string
	c      paho.Client
	// badImage: an apply of a pod with this image fails, as
	// ErrImageNeverPull does.
	badImage string
	// hang: an apply is accepted and never finishes (a pull that takes
	// forever).
	hang bool
	// holdGet, when set, holds every get until it is closed.
	holdGet chan struct{}
	// flood: a get is answered with this many in_progress replies of
	// 1 KiB and no final one.
	flood int

	mu       sync.Mutex
	offline  bool
	commands []fleetCmd
	pods     map[string]*v1.Pod // ns/name -> stored pod
	gen      map[string]int64
}

type fleetCmd struct {
	Topic, Verb, ID string
	Scope           apiv1.Scope
	Payload         []byte
}

func startFakeNode(t *testing.T, url, name string, groups []string, labels map[string]string, online bool) *fakeNode {
	t.Helper()
	n := &fakeNode{t: t, name: name, groups: groups, labels: labels, pods: map[string]*v1.Pod{}, gen: map[string]int64{}}
	n.c = testClient(t, url, "fake-"+name)
	var answering sync.WaitGroup
	t.Cleanup(answering.Wait)
	s := apiv1.Scheme{Node: name}
	handler := func(cl paho.Client, m paho.Message) {
		ct, err := s.ParseCommand(m.Topic())
		if err != nil {
			t.Errorf("fake %s: bad command topic %q: %v", name, m.Topic(), err)
			return
		}
		cmd := fleetCmd{Topic: m.Topic(), Verb: ct.Verb, ID: ct.RequestID, Scope: ct.Scope, Payload: append([]byte(nil), m.Payload()...)}
		n.mu.Lock()
		n.commands = append(n.commands, cmd)
		n.mu.Unlock()
		n.mu.Lock()
		offline := n.offline
		n.mu.Unlock()
		if offline {
			return // an offline agent answers nothing (its session keeps the command)
		}
		answering.Add(1)
		go func() {
			defer answering.Done()
			for _, rep := range n.answer(cmd) {
				rep.RequestID, rep.Verb, rep.Node, rep.TS = cmd.ID, cmd.Verb, name, testNow.Add(-time.Second)
				b, _ := json.Marshal(rep)
				mustPublish(t, cl, s.Reply(cmd.ID), false, b)
			}
		}()
	}
	filters := map[string]byte{}
	for _, f := range s.CommandFilters() {
		filters[f] = 1
	}
	for _, g := range groups {
		for _, f := range s.GroupFilters(g) {
			filters[f] = 1
		}
	}
	tok := n.c.SubscribeMultiple(filters, handler)
	if !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatalf("fake %s subscribing: %v", name, tok.Error())
	}
	n.setOnline(online)
	node := v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
	b, _ := json.Marshal(node)
	mustPublish(t, n.c, s.NodeTopic(), true, b)
	return n
}

var offlineSince = time.Date(2026, 3, 1, 11, 58, 0, 0, time.UTC)

func (n *fakeNode) setOnline(online bool) {
	n.mu.Lock()
	n.offline = !online
	n.mu.Unlock()
	st := apiv1.NodeState{State: apiv1.StateOnline, BootID: "b", Version: "test", Groups: n.groups, TS: time.Now().UTC()}
	if !online {
		st.State, st.TS = apiv1.StateOffline, offlineSince
	}
	b, _ := json.Marshal(st)
	mustPublish(n.t, n.c, apiv1.Scheme{Node: n.name}.State(), true, b)
}

func (n *fakeNode) received() []fleetCmd {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]fleetCmd(nil), n.commands...)
}

func (n *fakeNode) verbs() string {
	var out []string
	for _, c := range n.received() {
		out = append(out, c.Verb)
	}
	return strings.Join(out, ",")
}

// answer is what the fake agent says to a command.
func (n *fakeNode) answer(c fleetCmd) []fakeReply {
	switch c.Verb {
	case apiv1.VerbApply:
		pods, err := decodePods(c.Payload)
		if err != nil {
			return []fakeReply{{Phase: apiv1.Failed, Message: err.Error()}}
		}
		var changes []apiv1.ChangeResult
		bad := ""
		n.mu.Lock()
		for _, p := range pods {
			key := p.Namespace + "/" + p.Name
			n.gen[key]++
			p.UID = types.UID(fmt.Sprintf("uid-%s-%s", n.name, p.Name))
			p.Generation = n.gen[key]
			n.pods[key] = p
			changes = append(changes, apiv1.ChangeResult{Kind: "Pod", Key: key, Action: "configured", UID: string(p.UID), Generation: p.Generation})
			if p.Spec.Containers[0].Image == n.badImage && n.badImage != "" {
				bad = key
			}
		}
		n.mu.Unlock()
		out := []fakeReply{{Phase: apiv1.Accepted, Message: "stored", Result: changes}}
		if n.hang {
			return out
		}
		for _, p := range pods {
			n.publishPod(p, bad == "")
		}
		if bad != "" {
			time.Sleep(200 * time.Millisecond) // a runtime takes a moment to find the image missing
			return append(out, fakeReply{Phase: apiv1.Failed, Message: "Pod " + bad + ": ErrImageNeverPull: image " + n.badImage + " is not present with pull policy of Never"})
		}
		return append(out, fakeReply{Phase: apiv1.Succeeded, Message: "pods run"})
	case apiv1.VerbDelete:
		pods, _ := decodePods(c.Payload)
		n.mu.Lock()
		for _, p := range pods {
			delete(n.pods, p.Namespace+"/"+p.Name)
		}
		n.mu.Unlock()
		for _, p := range pods {
			mustPublish(n.t, n.c, apiv1.Scheme{Node: n.name}.Pod(p.Namespace, p.Name), true, nil)
		}
		return []fakeReply{{Phase: apiv1.Accepted}, {Phase: apiv1.Succeeded, Message: "deleted"}}
	case apiv1.VerbGet:
		if n.holdGet != nil {
			<-n.holdGet
		}
		if n.flood > 0 {
			out := make([]fakeReply, n.flood)
			for i := range out {
				out[i] = fakeReply{Phase: apiv1.InProgress, Message: strings.Repeat("x", 1024)}
			}
			return out
		}
		var req apiv1.GetRequest
		_ = json.Unmarshal(c.Payload, &req)
		res := apiv1.GetResult{Pods: []*v1.Pod{}, ConfigMaps: []*v1.ConfigMap{}, Secrets: []*v1.Secret{}}
		n.mu.Lock()
		for _, p := range n.pods {
			if req.Name == "" || (p.Name == req.Name && p.Namespace == req.Namespace) {
				res.Pods = append(res.Pods, p.DeepCopy())
			}
		}
		n.mu.Unlock()
		if req.Name != "" && len(res.Pods) == 0 {
			return []fakeReply{{Phase: apiv1.Failed, Message: fmt.Sprintf("%s %s/%s not found", req.Kind, req.Namespace, req.Name)}}
		}
		return []fakeReply{{Phase: apiv1.Succeeded, Result: res}}
	case apiv1.VerbLogs:
		return []fakeReply{{Phase: apiv1.Succeeded, Result: apiv1.LogsResult{Lines: []string{"hello from " + n.name}}}}
	}
	return []fakeReply{{Phase: apiv1.Succeeded, Message: c.Verb + " done"}}
}

func (n *fakeNode) publishPod(p *v1.Pod, ready bool) {
	st := p.DeepCopy()
	st.Status.ObservedGeneration = p.Generation
	cond := v1.ConditionFalse
	if ready {
		cond = v1.ConditionTrue
	}
	st.Status.Conditions = []v1.PodCondition{{Type: v1.PodReady, Status: cond}}
	b, _ := json.Marshal(st)
	mustPublish(n.t, n.c, apiv1.Scheme{Node: n.name}.Pod(p.Namespace, p.Name), true, b)
}

// image is the image of the pod name the node stores, "" for none.
func (n *fakeNode) image(name string) string {
	n.mu.Lock()
	defer n.mu.Unlock()
	if p := n.pods["default/"+name]; p != nil {
		return p.Spec.Containers[0].Image
	}
	return ""
}

func decodePods(payload []byte) ([]*v1.Pod, error) {
	var out []*v1.Pod
	for _, doc := range strings.Split(string(payload), "\n---\n") {
		var p v1.Pod
		if err := yaml.Unmarshal([]byte(doc), &p); err != nil {
			return nil, err
		}
		if p.Kind != "Pod" {
			continue
		}
		if p.Namespace == "" {
			p.Namespace = "default"
		}
		out = append(out, &p)
	}
	return out, nil
}

func fleetPod(name, image string) string {
	return fmt.Sprintf("apiVersion: v1\nkind: Pod\nmetadata:\n  name: %s\nspec:\n  containers:\n  - name: main\n    image: %s\n", name, image)
}

type fleet struct {
	url   string
	nodes map[string]*fakeNode
}

// startFleet: nodes a, b, c in group line-1 (c offline when offline is
// set), d outside it; a and b labelled site=x.
func startFleet(t *testing.T, offline bool) *fleet {
	t.Helper()
	b := mosquitto.Start(t)
	f := &fleet{url: b.URL(), nodes: map[string]*fakeNode{}}
	f.nodes["a"] = startFakeNode(t, f.url, "a", []string{"line-1"}, map[string]string{"site": "x"}, true)
	f.nodes["b"] = startFakeNode(t, f.url, "b", []string{"line-1", "other"}, map[string]string{"site": "x"}, true)
	f.nodes["c"] = startFakeNode(t, f.url, "c", []string{"line-1"}, map[string]string{"site": "y"}, !offline)
	f.nodes["d"] = startFakeNode(t, f.url, "d", nil, map[string]string{"site": "y"}, true)
	return f
}

func (f *fleet) run(t *testing.T, stdin string, args ...string) result {
	t.Helper()
	return runCLIEnv(t, map[string]string{envBroker: f.url}, stdin, append([]string{"--retained-wait", "500ms"}, args...)...)
}

var rowRE = func(node, phase string) *regexp.Regexp {
	return regexp.MustCompile(`(?m)^` + node + `\s+` + phase + `\s`)
}

// A group apply: one command on the group's topic, every member answers
// on its own reply topic, one row per member; the offline member is
// Pending (offline since ...), never failed, and the exit is 3; the node
// outside the group gets nothing. A failed member makes the exit 1.
func TestFleetGroupApplyRowsPerMember(t *testing.T) {
	f := startFleet(t, true)
	res := f.run(t, fleetPod("web", "busybox:1"), "apply", "-f", "-", "--group", "line-1", "--timeout", "10s")
	if res.code != exitQueued {
		t.Fatalf("want exit 3 (a member offline): %s", res)
	}
	for _, want := range []*regexp.Regexp{rowRE("NODE", "PHASE"), rowRE("a", "succeeded"), rowRE("b", "succeeded"), regexp.MustCompile(`(?m)^c\s+Pending\s+offline since 2026-03-01T11:58:00Z`)} {
		if !want.MatchString(res.stdout) {
			t.Errorf("output lacks %s:\n%s", want, res)
		}
	}
	if strings.Contains(res.stdout, "\nd ") || len(f.nodes["d"].received()) != 0 {
		t.Errorf("the node outside the group took part: %s", res)
	}
	for _, n := range []string{"a", "b", "c"} {
		cmds := f.nodes[n].received()
		if n == "c" {
			continue // offline: the broker keeps it for its session; the fake takes it live
		}
		if len(cmds) != 1 || cmds[0].Scope.Group != "line-1" {
			t.Errorf("%s got %+v, want one command on the group's topic", n, cmds)
		}
	}
	if !strings.Contains(res.stderr, "queued: 1 of 3 member(s) of group line-1 offline") {
		t.Errorf("stderr does not say what is queued: %s", res)
	}

	// A failed member: exit 1, its row says why.
	f.nodes["b"].badImage = "nope:1"
	res = f.run(t, fleetPod("web", "nope:1"), "apply", "-f", "-", "--group", "line-1", "--timeout", "10s", "--wait-offline=false")
	if res.code != exitFail || !regexp.MustCompile(`(?m)^b\s+failed\s+Pod default/web: ErrImageNeverPull`).MatchString(res.stdout) {
		t.Fatalf("want exit 1 and b's failure: %s", res)
	}
	// All online, all succeeded: exit 0.
	f.nodes["c"].setOnline(true)
	f.nodes["b"].badImage = ""
	res = f.run(t, "", "restart", "pod", "web", "--group", "line-1", "--timeout", "10s")
	if res.code != exitOK || !rowRE("c", "succeeded").MatchString(res.stdout) {
		t.Fatalf("want exit 0 with every member succeeded: %s", res)
	}
}

// -L sends one command per matching node on its own topic.
func TestFleetSelectorCommandsEachNode(t *testing.T) {
	f := startFleet(t, false)
	res := f.run(t, "", "delete", "pod", "web", "-L", "site=x", "--timeout", "10s")
	if res.code != exitOK {
		t.Fatalf("delete -L: %s", res)
	}
	for name, want := range map[string]int{"a": 1, "b": 1, "c": 0, "d": 0} {
		cmds := f.nodes[name].received()
		if len(cmds) != want {
			t.Fatalf("%s got %d commands, want %d: %+v", name, len(cmds), want, cmds)
		}
		if want == 1 && (cmds[0].Scope.Group != "" || cmds[0].Verb != "delete") {
			t.Errorf("%s: %+v, want a delete on its own topic", name, cmds[0])
		}
	}
	if !rowRE("a", "succeeded").MatchString(res.stdout) || !rowRE("b", "succeeded").MatchString(res.stdout) {
		t.Errorf("rows: %s", res)
	}
}

// get and logs with --group list every member's answer with its node;
// get nodes --group lists the members.
func TestFleetGetLogsAndNodes(t *testing.T) {
	f := startFleet(t, false)
	if res := f.run(t, fleetPod("web", "busybox:1"), "apply", "-f", "-", "--group", "line-1", "--timeout", "10s"); res.code != 0 {
		t.Fatalf("apply: %s", res)
	}
	res := f.run(t, "", "--group", "line-1", "get", "pods", "--timeout", "10s") // before the command, as the issue writes it
	if res.code != 0 {
		t.Fatalf("get pods --group: %s", res)
	}
	for _, n := range []string{"a", "b", "c"} {
		if !regexp.MustCompile(`(?m)^` + n + `\s+default\s+web\s`).MatchString(res.stdout) {
			t.Errorf("get pods --group lacks %s's web:\n%s", n, res)
		}
	}
	if strings.Contains(res.stdout, "\nd ") {
		t.Errorf("d listed: %s", res)
	}
	res = f.run(t, "", "logs", "web", "--group", "line-1", "--timeout", "10s")
	if res.code != 0 || !strings.Contains(res.stdout, "[a] hello from a") || !strings.Contains(res.stdout, "[c] hello from c") {
		t.Fatalf("logs --group: %s", res)
	}
	res = f.run(t, "apiVersion: v1\nkind: List\nitems: []\n", "sync", "-f", "-", "--group", "line-1", "--timeout", "10s")
	if res.code != 0 || !rowRE("b", "succeeded").MatchString(res.stdout) {
		t.Fatalf("sync --group: %s", res)
	}
	if cmds := f.nodes["b"].received(); cmds[len(cmds)-1].Verb != "sync" || cmds[len(cmds)-1].Scope.Group != "line-1" {
		t.Fatalf("b's last command %+v, want a sync on the group's topic", cmds[len(cmds)-1])
	}
	res = f.run(t, "", "get", "nodes", "--group", "other")
	if res.code != 0 || !regexp.MustCompile(`(?m)^b\s+online\s+\S+\s+test\s+1$`).MatchString(res.stdout) || strings.Contains(res.stdout, "\na ") {
		t.Fatalf("get nodes --group other: %s", res)
	}
}

// Bad input is refused clearly and sends nothing.
func TestFleetBadInput(t *testing.T) {
	f := startFleet(t, false)
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"apply", "-f", "-", "--group", "nope"}, exitFail, `unknown group "nope": no node under prefix mqlet/v1 names it`},
		{[]string{"apply", "-f", "-", "--group", "a/b"}, exitUsage, "group name"},
		{[]string{"apply", "-f", "-", "--group", "a+b"}, exitUsage, "group name"},
		{[]string{"get", "pods", "--group", "a#"}, exitUsage, "group name"},
		{[]string{"apply", "-f", "-", "-L", ""}, exitUsage, "-L is empty"},
		{[]string{"rollout", "start", "-f", "-", "-L", " ", "--batch", "1"}, exitUsage, "-L is empty"},
		{[]string{"apply", "-f", "-", "--group", "d"}, exitFail, `unknown group "d": d is a node under prefix mqlet/v1, not a group (use --node d)`},
		{[]string{"apply", "-f", "-", "-L", "site=nowhere"}, exitFail, `no node under prefix mqlet/v1 has labels matching -L "site=nowhere"`},
		{[]string{"apply", "-f", "-", "--group", "line-1", "--node", "a"}, exitUsage, "--node and --group/-L exclude each other"},
		{[]string{"apply", "-f", "-", "--group", "line-1", "-L", "site=x"}, exitUsage, "exclude each other"},
		{[]string{"rollout", "start", "-f", "-", "-L", "site=nowhere", "--batch", "1"}, exitFail, "no node under prefix"},
		{[]string{"rollout", "start", "-f", "-", "--group", "line-1"}, exitUsage, "--batch is required"},
		{[]string{"rollout", "start", "-f", "-", "--group", "line-1", "--batch", "0%"}, exitUsage, "1% to 100%"},
		{[]string{"rollout", "status", "nothing-here"}, exitFail, `no rollout "nothing-here"`},
		{[]string{"--group", "line-1", "status"}, exitUsage, "--group and -L apply to apply, sync"},
		{[]string{"rollout", "status", "x", "--group", "line-1"}, exitUsage, "are for rollout start"},
	} {
		res := f.run(t, fleetPod("web", "busybox:1"), tc.args...)
		if res.code != tc.code || !strings.Contains(res.stderr, tc.want) {
			t.Errorf("%v: want exit %d and %q: %s", tc.args, tc.code, tc.want, res)
		}
	}
	res := f.run(t, "apiVersion: v1\nkind: Secret\nmetadata:\n  name: s\nstringData:\n  a: b\n", "rollout", "start", "-f", "-", "--group", "line-1", "--batch", "1")
	if res.code != exitFail || !strings.Contains(res.stderr, "a rollout carries Pods and ConfigMaps only") {
		t.Errorf("rollout of a Secret: %s", res)
	}
	for _, n := range f.nodes {
		if c := n.received(); len(c) != 0 {
			t.Errorf("%s got commands from bad input: %+v", n.name, c)
		}
	}
}

// readDoc reads the retained rollout document id.
func (f *fleet) readDoc(t *testing.T, id string) *apiv1.Rollout {
	t.Helper()
	c := testClient(t, f.url, "doc-reader-"+randomToken(4))
	got := make(chan []byte, 1)
	tok := c.Subscribe(apiv1.RolloutTopic("", id), 1, func(_ paho.Client, m paho.Message) {
		select {
		case got <- append([]byte(nil), m.Payload()...):
		default:
		}
	})
	if !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatal(tok.Error())
	}
	select {
	case b := <-got:
		doc, err := decodeRollout(b, id)
		if err != nil {
			t.Fatal(err)
		}
		return doc
	case <-time.After(5 * time.Second):
		t.Fatalf("no retained document for rollout %s", id)
	}
	return nil
}

func phases(doc *apiv1.Rollout) string {
	var out []string
	for _, n := range doc.Nodes {
		out = append(out, n.Node+"="+n.Phase)
	}
	return strings.Join(out, " ")
}

// A rollout over a, b, c, d (selector) in waves of 2, where b's pod fails:
// after the first wave it aborts naming b and why, c and d get nothing,
// and --rollback gives a back what it ran before (and b too, which had
// stored the new manifest). The document's totals are the nodes' phases.
func TestRolloutAbortsAfterTheFirstWaveAndRollsBack(t *testing.T) {
	b := mosquitto.Start(t)
	f := &fleet{url: b.URL(), nodes: map[string]*fakeNode{}}
	for _, n := range []string{"a", "b", "c", "d"} {
		f.nodes[n] = startFakeNode(t, f.url, n, []string{"line-1"}, map[string]string{"tier": "edge"}, true)
	}
	// Before the rollout a and b run web v1; c and d hold nothing.
	if res := f.run(t, fleetPod("web", "busybox:v1"), "apply", "-f", "-", "-L", "tier=edge,site!=none", "--timeout", "10s"); res.code != 0 {
		t.Fatalf("v1: %s", res)
	}
	for _, n := range []string{"c", "d"} {
		if res := f.run(t, "", "delete", "pod", "web", "--node", n, "--timeout", "10s"); res.code != 0 {
			t.Fatalf("delete on %s: %s", n, res)
		}
	}
	f.nodes["b"].badImage = "busybox:v2"
	for _, n := range f.nodes {
		n.mu.Lock()
		n.commands = nil
		n.mu.Unlock()
	}
	res := f.run(t, fleetPod("web", "busybox:v2"), "rollout", "start", "-f", "-", "--group", "line-1", "--batch", "2", "--rollback", "--id", "web-v2", "--timeout", "20s")
	if res.code != exitFail {
		t.Fatalf("want exit 1 (aborted): %s", res)
	}
	if !strings.Contains(res.stdout, "Aborted: 1 node(s) failed (b: Pod default/web: ErrImageNeverPull: image busybox:v2 is not present with pull policy of Never), more than --max-failures 0") ||
		!regexp.MustCompile(`(?m)^b\s+1\s+RolledBack\s+previous manifests re-applied \(was: Pod default/web: ErrImageNeverPull`).MatchString(res.stdout) {
		t.Errorf("the status does not name b: %s", res)
	}
	doc := f.readDoc(t, "web-v2")
	// a is Cancelled instead when b failed before a's apply went out
	// (a slow machine): correct too, and a keeps v1 either way.
	if got := phases(doc); got != "a=RolledBack b=RolledBack c=Cancelled d=Cancelled" && got != "a=Cancelled b=RolledBack c=Cancelled d=Cancelled" {
		t.Fatalf("phases %s\n%s", got, res)
	}
	want := apiv1.RolloutTotals{Targeted: 4, Cancelled: 2, RolledBack: 2}
	if doc.Nodes[0].Phase == apiv1.NodeCancelled {
		want = apiv1.RolloutTotals{Targeted: 4, Cancelled: 3, RolledBack: 1}
	}
	if doc.Totals != want || doc.Phase != apiv1.RolloutAborted {
		t.Errorf("totals %+v phase %s, want %+v", doc.Totals, doc.Phase, want)
	}
	for _, n := range []string{"a", "b"} {
		if img := f.nodes[n].image("web"); img != "busybox:v1" {
			t.Errorf("%s runs %q after the rollback, want busybox:v1", n, img)
		}
	}
	if v := f.nodes["c"].verbs() + f.nodes["d"].verbs(); v != "" {
		t.Errorf("c and d got commands of an aborted rollout: %s", v)
	}
}

// A rollout whose runner stops mid-wave is resumed from the document by
// another process, and finishes; an offline member is pending (exit 3
// at --timeout) and the rollout finishes when it returns.
func TestRolloutResumeAndOfflineMember(t *testing.T) {
	f := startFleet(t, true) // c offline
	res := f.run(t, fleetPod("web", "busybox:v2"), "rollout", "start", "-f", "-", "--group", "line-1", "--batch", "1", "--id", "r2", "--timeout", "3s")
	if res.code != exitQueued {
		t.Fatalf("want exit 3 (c offline): %s", res)
	}
	if !regexp.MustCompile(`(?m)^c\s+\d+\s+Pending \(offline since 2026-03-01T11:58:00Z\)`).MatchString(res.stdout) {
		t.Errorf("c is not shown pending offline: %s", res)
	}
	doc := f.readDoc(t, "r2")
	if doc.Phase != apiv1.RolloutRunning || doc.Totals.Succeeded != 2 || doc.Totals.Pending != 1 || doc.Totals.Offline != 1 || doc.Totals.Failed != 0 {
		t.Fatalf("document: %s %+v", doc.Phase, doc.Totals)
	}
	// The lease of the stopped runner is fresh: resume says so.
	res = f.run(t, "", "rollout", "resume", "r2", "--timeout", "3s")
	if res.code != exitFail || !strings.Contains(res.stderr, "--force to take it over") {
		t.Fatalf("resume against a fresh lease: %s", res)
	}
	f.nodes["c"].setOnline(true)
	res = f.run(t, "", "rollout", "resume", "r2", "--force", "--timeout", "10s")
	if res.code != exitOK {
		t.Fatalf("resume: %s", res)
	}
	doc = f.readDoc(t, "r2")
	want := apiv1.RolloutTotals{Targeted: 3, Applied: 3, Succeeded: 3}
	if doc.Phase != apiv1.RolloutSucceeded || doc.Totals != want {
		t.Fatalf("document after resume: %s %+v", doc.Phase, doc.Totals)
	}
	if f.nodes["c"].image("web") != "busybox:v2" {
		t.Fatal("c does not run v2")
	}
	// a and b got exactly one apply each (and the get before it).
	for _, n := range []string{"a", "b"} {
		if v := f.nodes[n].verbs(); v != "get,apply" {
			t.Errorf("%s got %s, want get,apply", n, v)
		}
	}
	res = f.run(t, "", "rollout", "status", "r2")
	if res.code != 0 || !strings.Contains(res.stdout, "Rollout r2 (group line-1): Succeeded") {
		t.Fatalf("status: %s", res)
	}
	res = f.run(t, "", "rollout", "list")
	if res.code != 0 || !regexp.MustCompile(`(?m)^r2\s+group/line-1\s+Succeeded\s+3\s+3\s+0\s+0\s`).MatchString(res.stdout) {
		t.Fatalf("list: %s", res)
	}
}

// An operator's `rollout abort --rollback` from another process stops a
// rollout its runner is running: the runner sees the request, sends no new
// wave, and rolls back the node whose apply was under way (it held no web
// before: deleted); the abort follows the runner to the end.
func TestRolloutAbortFromAnotherProcess(t *testing.T) {
	f := startFleet(t, false)
	f.nodes["a"].hang = true
	done := make(chan result, 1)
	go func() {
		done <- f.run(t, fleetPod("web", "busybox:v2"), "rollout", "start", "-f", "-", "--group", "line-1", "--batch", "1", "--id", "r3", "--timeout", "20s")
	}()
	// Wait until a accepted the apply (the runner has published it).
	deadline := time.Now().Add(10 * time.Second)
	for f.nodes["a"].verbs() != "get,apply" {
		if time.Now().After(deadline) {
			t.Fatalf("a got %q", f.nodes["a"].verbs())
		}
		time.Sleep(20 * time.Millisecond)
	}
	res := f.run(t, "", "rollout", "abort", "r3", "--rollback", "--reason", "bad build", "--timeout", "10s")
	if res.code != exitFail || !strings.Contains(res.stdout, "Aborted: aborted by an operator: bad build") {
		t.Fatalf("abort: %s", res)
	}
	first := <-done
	if first.code != exitFail || !strings.Contains(first.stdout, "Aborted") {
		t.Fatalf("the runner: %s", first)
	}
	doc := f.readDoc(t, "r3")
	if got := phases(doc); got != "a=RolledBack b=Cancelled c=Cancelled" {
		t.Fatalf("phases %s", got)
	}
	if v := f.nodes["a"].verbs(); v != "get,apply,delete" {
		t.Errorf("a got %s, want get,apply,delete (the rollback deletes what it did not hold)", v)
	}
	if v := f.nodes["b"].verbs() + f.nodes["c"].verbs(); v != "" {
		t.Errorf("b, c got %s after the abort", v)
	}
}

// An abort while a node of the wave is still being read (its get before
// the apply) cancels that node: it is never sent the apply, and counts
// cancelled, not rolled back.
func TestRolloutAbortCancelsANodeNotYetSent(t *testing.T) {
	b := mosquitto.Start(t)
	f := &fleet{url: b.URL(), nodes: map[string]*fakeNode{}}
	for _, n := range []string{"a", "b"} {
		f.nodes[n] = startFakeNode(t, f.url, n, []string{"line-1"}, nil, true)
	}
	hold := make(chan struct{})
	f.nodes["a"].holdGet = hold
	t.Cleanup(func() { close(hold) })
	f.nodes["b"].badImage = "busybox:v2"
	res := f.run(t, fleetPod("web", "busybox:v2"), "rollout", "start", "-f", "-", "--group", "line-1", "--batch", "2", "--rollback", "--id", "r4", "--timeout", "20s")
	if res.code != exitFail {
		t.Fatalf("want exit 1: %s", res)
	}
	doc := f.readDoc(t, "r4")
	if got := phases(doc); got != "a=Cancelled b=RolledBack" {
		t.Fatalf("phases %s\n%s", got, res)
	}
	if v := f.nodes["a"].verbs(); v != "get" {
		t.Errorf("a got %s, want only the get (no apply after the abort)", v)
	}
}

// A member flooding its reply topic is failed once its replies pass the
// bound, and the others are listed.
func TestFleetReplyFloodIsBounded(t *testing.T) {
	old := maxMemberReplyBytes
	maxMemberReplyBytes = 32 << 10
	t.Cleanup(func() { maxMemberReplyBytes = old })
	f := startFleet(t, false)
	f.nodes["b"].flood = 100
	res := f.run(t, "", "get", "pods", "--group", "line-1", "--timeout", "20s")
	if res.code != exitFail || !regexp.MustCompile(`(?m)^b\s+failed\s+replies to request \S+ over 32768 bytes`).MatchString(res.stderr) {
		t.Fatalf("want b failed over the bound: %s", res)
	}
}

// With --sign-key the runner signs the document; a resume that signs
// commands refuses a document another key signed, or one changed after it
// was signed, and takes one its own key (or a --trust-key) signed.
func TestRolloutDocumentIsSignedAndChecked(t *testing.T) {
	f := startFleet(t, false)
	keyFile := func(name string) (string, ed25519.PrivateKey) {
		k, err := signing.GenerateKey()
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(t.TempDir(), name)
		if err := signing.WritePrivateKeyFile(p, k); err != nil {
			t.Fatal(err)
		}
		return p, k
	}
	a, aKey := keyFile("a.key")
	b, _ := keyFile("b.key")
	res := f.run(t, fleetPod("web", "busybox:v2"), "--sign-key", a, "rollout", "start", "-f", "-", "--group", "line-1", "--batch", "1", "--id", "r5", "--detach")
	if res.code != 0 {
		t.Fatalf("start --detach: %s", res)
	}
	doc := f.readDoc(t, "r5")
	if doc.Signature == nil || doc.Signature.KeyID != signing.KeyID(aKey.Public().(ed25519.PublicKey)) {
		t.Fatalf("document not signed by a: %+v", doc.Signature)
	}
	// Another key: refused, nothing sent.
	res = f.run(t, "", "--sign-key", b, "rollout", "resume", "r5", "--force", "--timeout", "5s")
	if res.code != exitFail || !strings.Contains(res.stderr, "not by a key trusted here") {
		t.Fatalf("resume with another key: %s", res)
	}
	// Changed after it was signed (its manifest): refused.
	tampered := *doc
	tampered.Manifest = fleetPod("web", "evil:1")
	body, _ := json.Marshal(&tampered)
	c := testClient(t, f.url, "tamperer")
	mustPublish(t, c, apiv1.RolloutTopic("", "r5"), true, body)
	res = f.run(t, "", "--sign-key", a, "rollout", "resume", "r5", "--force", "--timeout", "5s")
	if res.code != exitFail || !strings.Contains(res.stderr, "does not match its content") {
		t.Fatalf("resume of a changed document: %s", res)
	}
	for _, n := range f.nodes {
		if v := n.verbs(); v != "" {
			t.Fatalf("%s got %s from a refused resume", n.name, v)
		}
	}
	// The signed one, trusted through --trust-key by b's resume: it runs.
	body, _ = json.Marshal(doc)
	mustPublish(t, c, apiv1.RolloutTopic("", "r5"), true, body)
	res = f.run(t, "", "--sign-key", b, "rollout", "status", "r5", "--trust-key", signing.EncodePublicKey(aKey.Public().(ed25519.PublicKey)))
	if !strings.Contains(res.stderr, "document signed by "+doc.Signature.KeyID+" (verified)") {
		t.Fatalf("status: %s", res)
	}
	res = f.run(t, "", "--sign-key", b, "rollout", "resume", "r5", "--force", "--timeout", "5s", "--trust-key", signing.EncodePublicKey(aKey.Public().(ed25519.PublicKey)))
	if strings.Contains(res.stderr, "trusted") || f.nodes["a"].verbs() == "" {
		t.Fatalf("resume of a trusted document did not run: %s", res)
	}
}
