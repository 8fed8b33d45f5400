package intake

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	apiruntime "k8s.io/apimachinery/pkg/runtime"

	"github.com/mqlet/mqlet/agent/streams"
	apiv1 "github.com/mqlet/mqlet/api/v1"
	"github.com/mqlet/mqlet/cri"
	"github.com/mqlet/mqlet/signing"
	"github.com/mqlet/mqlet/signing/noncestore"
)

const (
	secretA = `{"apiVersion":"v1","kind":"Secret","metadata":{"name":"pw","namespace":"a"},"stringData":{"pw":"hunter22"}}`
	podInA  = `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"web","namespace":"a"},"spec":{"containers":[{"name":"c","image":"busybox:1"}]}}`
	podNoNS = `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"web"},"spec":{"containers":[{"name":"c","image":"busybox:1"}]}}`
)

// scopeVerbs wires every operator verb to parts that fail the test when a
// refused command reaches them.
type scopeVerbs struct{ t *testing.T }

func (f scopeVerbs) ContainerLogs(context.Context, cri.LogRequest, io.Writer) error {
	f.t.Error("logs reached the runtime")
	return nil
}
func (f scopeVerbs) ExecInPod(context.Context, cri.PodKey, string, []string, time.Duration) (*cri.ExecResult, error) {
	f.t.Error("exec reached the runtime")
	return &cri.ExecResult{}, nil
}
func (f scopeVerbs) GetPodStatus(context.Context, string, string, string) (*cri.PodStatus, error) {
	f.t.Error("restart reached the runtime")
	return &cri.PodStatus{}, nil
}
func (f scopeVerbs) RequestRestart(string, string, string, string, time.Time, func(error)) error {
	f.t.Error("restart reached the workers")
	return nil
}
func (f scopeVerbs) Start(string, streams.Kind, func(context.Context)) error {
	f.t.Error("a stream started")
	return nil
}
func (f scopeVerbs) Cancel(string) bool                            { return false }
func (f scopeVerbs) CancelIf(string, func(streams.Kind) bool) bool { return false }
func (f scopeVerbs) Patch([]byte) ([]string, error) {
	f.t.Error("settings changed")
	return nil, nil
}
func (f scopeVerbs) View() (apiv1.ConfigView, error)       { return apiv1.ConfigView{}, nil }
func (f scopeVerbs) List(func(*v1.Event) bool) []*v1.Event { return nil }

func TestNamespaceTopicTouchesOnlyItsNamespace(t *testing.T) {
	r := newRig(t)
	fake := scopeVerbs{t}
	r.in.opts.Verbs = VerbOptions{Runtime: fake, Restarts: fake, Streams: fake, Config: fake, Events: fake,
		Exec: ExecLimits{Enabled: true, DefaultTimeout: time.Second, MaxTimeout: time.Minute, MaxOutputBytes: 1024}}
	// The node-wide operator stores a secret and a pod in namespace a.
	r.in.Handle(Command{Topic: "mqlet/v1/n1/cmd/apply/s1", Payload: []byte(secretA)})
	r.in.Handle(Command{Topic: "mqlet/v1/n1/cmd/apply/p1", Payload: []byte(podInA)})
	if got := r.sender.last("p1").Phase; got != apiv1.InProgress {
		t.Fatalf("node-wide apply: %s %s", got, r.sender.last("p1").Message)
	}

	refused := func(id, topic, payload string) {
		t.Helper()
		r.in.Handle(Command{Topic: topic, Payload: []byte(payload)})
		rep := r.sender.last(id)
		if rep.Phase != apiv1.Failed || !strings.Contains(rep.Message, "scope") {
			t.Errorf("%s on %s: %s %q, want failed naming the scope", payload, topic, rep.Phase, rep.Message)
		}
	}
	// Namespace b may not read, change or use anything of namespace a.
	refused("g1", "mqlet/v1/n1/ns/b/cmd/get/g1", `{"kind":"Secret","namespace":"a","name":"pw"}`)
	refused("a1", "mqlet/v1/n1/ns/b/cmd/apply/a1", secretA)
	refused("a2", "mqlet/v1/n1/ns/b/cmd/apply/a2", `{"apiVersion":"v1","kind":"List","items":[`+podNoNS+`,`+secretA+`]}`)
	refused("d1", "mqlet/v1/n1/ns/b/cmd/delete/d1", `{"kind":"Secret","namespace":"a","name":"pw"}`)
	refused("l1", "mqlet/v1/n1/ns/b/cmd/logs/l1", `{"namespace":"a","name":"web"}`)
	refused("e1", "mqlet/v1/n1/ns/b/cmd/exec/e1", `{"namespace":"a","name":"web","command":["cat","/s/pw"]}`)
	refused("r1", "mqlet/v1/n1/ns/b/cmd/restart/r1", `{"namespace":"a","name":"web"}`)
	refused("c1", "mqlet/v1/n1/ns/b/cmd/config/c1", `{"logLevel":"debug"}`)
	refused("n1", "mqlet/v1/n1/ns/b/cmd/get/n1", `{"kind":"Node"}`)
	refused("k1", "mqlet/v1/n1/ns/b/cmd/get/k1", `{"kind":"Config"}`)
	refused("v1", "mqlet/v1/n1/ns/b/cmd/get/v1", `{"kind":"Event","involvedObject":{"kind":"Node","name":"n1"}}`)
	if _, err := r.st.Secret("a", "pw"); err != nil {
		t.Fatalf("namespace a's secret was touched: %v", err)
	}

	// A get without a namespace lists the scope's namespace only.
	r.in.Handle(Command{Topic: "mqlet/v1/n1/ns/b/cmd/get/g2", Payload: []byte(`{}`)})
	if rep := r.sender.last("g2"); rep.Phase != apiv1.Succeeded || rep.Message != "0 pods, 0 configmaps, 0 secrets" {
		t.Fatalf("namespace b listing: %s %q", rep.Phase, rep.Message)
	}
	// An object without a namespace goes into the scope's.
	r.in.Handle(Command{Topic: "mqlet/v1/n1/ns/b/cmd/apply/a3", Payload: []byte(podNoNS)})
	if _, err := r.st.Pod("b", "web"); err != nil {
		t.Fatalf("pod without a namespace not stored in b: %v (%s)", err, r.sender.last("a3").Message)
	}
	// A sync of namespace b replaces b's objects only.
	r.in.Handle(Command{Topic: "mqlet/v1/n1/ns/b/cmd/sync/y1", Payload: []byte(`{"apiVersion":"v1","kind":"List","items":[]}`)})
	if _, err := r.st.Pod("b", "web"); err == nil {
		t.Fatal("sync of namespace b kept b/web")
	}
	if _, err := r.st.Pod("a", "web"); err != nil {
		t.Fatalf("sync of namespace b removed a/web: %v", err)
	}
	if _, err := r.st.Secret("a", "pw"); err != nil {
		t.Fatalf("sync of namespace b removed a/pw: %v", err)
	}
	// Namespace a's own topic reaches its objects.
	r.in.Handle(Command{Topic: "mqlet/v1/n1/ns/a/cmd/get/g3", Payload: []byte(`{"kind":"Secret","name":"pw"}`)})
	if rep := r.sender.last("g3"); rep.Phase != apiv1.Succeeded {
		t.Fatalf("namespace a get: %s %q", rep.Phase, rep.Message)
	}
}

func TestGroupTopicOfAnotherGroupIsRefusedUnrecorded(t *testing.T) {
	r := newRig(t)
	r.in.opts.Groups = func() []string { return []string{"line-1"} }
	r.in.Handle(Command{Topic: "mqlet/v1/group/line-2/cmd/apply/x1", Payload: []byte(podNoNS)})
	rep := r.sender.last("x1")
	if rep.Phase != apiv1.Failed || !strings.Contains(rep.Message, "not a member of group line-2") {
		t.Fatalf("reply %+v", rep)
	}
	if _, handled, _ := r.st.LookupReply("x1"); handled {
		t.Fatal("the refusal used up the request id")
	}
}

func TestSigningKeyNamespaces(t *testing.T) {
	r := newRig(t)
	nonces, err := noncestore.Open(filepath.Join(t.TempDir(), "nonces.db"), 1000)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nonces.Close() })
	k, err := signing.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	team, err := signing.NewSigner("team-a", k)
	if err != nil {
		t.Fatal(err)
	}
	v, err := signing.NewVerifier(signing.Policy{Required: true, Targets: []string{"n1", "line-1"}, ClockSkew: time.Second, MaxLifetime: time.Hour, MaxEnvelopeBytes: 16 << 10,
		Keys: []signing.Key{{ID: "team-a", Public: team.Public(), Verbs: []string{"*"}, Namespaces: []string{"a"}}}}, nonces, nil)
	if err != nil {
		t.Fatal(err)
	}
	r.in.opts.Opener = v
	r.in.opts.Groups = func() []string { return []string{"line-1"} }
	sign := func(target, verb, id, body string) []byte {
		now := time.Now()
		env, err := team.Sign(signing.Claims{Node: target, Verb: verb, RequestID: id, IssuedAt: now, Expires: now.Add(time.Minute)}, []byte(body))
		if err != nil {
			t.Fatal(err)
		}
		return env
	}
	// On the node-wide topic the key's one namespace is the default, and
	// another namespace is refused.
	r.in.Handle(Command{Topic: "mqlet/v1/n1/cmd/apply/k1", Payload: sign("n1", "apply", "k1", podNoNS)})
	if _, err := r.st.Pod("a", "web"); err != nil {
		t.Fatalf("key-scoped apply without a namespace: %v (%s)", err, r.sender.last("k1").Message)
	}
	r.in.Handle(Command{Topic: "mqlet/v1/n1/cmd/get/k2", Payload: sign("n1", "get", "k2", `{"kind":"Secret","namespace":"b"}`)})
	if rep := r.sender.last("k2"); rep.Phase != apiv1.Failed || !strings.Contains(rep.Message, "signing key limited to namespaces a") {
		t.Fatalf("key-scoped get of b: %s %q", rep.Phase, rep.Message)
	}
	// A namespace topic of b does not widen the key.
	r.in.Handle(Command{Topic: "mqlet/v1/n1/ns/b/cmd/apply/k3", Payload: sign("n1", "apply", "k3", podNoNS)})
	if rep := r.sender.last("k3"); rep.Phase != apiv1.Failed {
		t.Fatalf("key of a on the topic of b: %s %q", rep.Phase, rep.Message)
	}
	// Signed for the node, sent to the group (or the other way round): refused.
	r.in.Handle(Command{Topic: "mqlet/v1/group/line-1/cmd/get/k4", Payload: sign("n1", "get", "k4", `{}`)})
	if rep := r.sender.last("k4"); rep.Phase != apiv1.Failed || !strings.Contains(rep.Message, `signed for "n1", but sent on the topic of "line-1"`) {
		t.Fatalf("node envelope on the group topic: %s %q", rep.Phase, rep.Message)
	}
	r.in.Handle(Command{Topic: "mqlet/v1/n1/cmd/get/k5", Payload: sign("line-1", "get", "k5", `{}`)})
	if rep := r.sender.last("k5"); rep.Phase != apiv1.Failed {
		t.Fatalf("group envelope on the node topic: %s %q", rep.Phase, rep.Message)
	}
}

func TestScopeSees(t *testing.T) {
	meta := func(ns, source string) *metav1.ObjectMeta {
		m := &metav1.ObjectMeta{Namespace: ns}
		if source != "" {
			m.Annotations = map[string]string{apiv1.AnnotationSource: source}
		}
		return m
	}
	group := cmdScope{Scope: apiv1.Scope{Group: "l1"}}
	if group.namespaced() || !group.sees(meta("x", "group/l1")) || group.sees(meta("x", "")) || group.sees(meta("x", "group/l2")) {
		t.Fatal("a group-wide scope sees its group's objects in every namespace, and nothing else")
	}
	node := cmdScope{}
	if !node.sees(meta("x", "")) || !node.sees(meta("x", "group/l1")) {
		t.Fatal("a node-wide scope sees every object")
	}
	ns := cmdScope{Scope: apiv1.Scope{Namespace: "a"}, keyNamespaces: []string{"a", "b"}}
	if ns.allows("b") || !ns.allows("a") || ns.defaultNamespace() != "a" {
		t.Fatal("the topic's namespace narrows the key's")
	}
}

// BenchmarkNamespaceScope is what a namespace scope costs a command: the
// topic parsed into its scope and the objects of a 20-object apply checked.
func BenchmarkNamespaceScope(b *testing.B) {
	topics := apiv1.Scheme{Prefix: "mqlet/v1", Node: "n1"}
	objs := make([]apiruntime.Object, 20)
	for i := range objs {
		objs[i] = &v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("c%d", i), Namespace: "team-a"}}
	}
	b.ReportAllocs()
	for b.Loop() {
		ct, err := topics.ParseCommand("mqlet/v1/n1/ns/team-a/cmd/apply/r-123")
		if err != nil {
			b.Fatal(err)
		}
		if p := (cmdScope{Scope: ct.Scope}).scopeObjects(objs); len(p) != 0 {
			b.Fatal(p)
		}
	}
}

func TestGroupSourceKeepsItsObjectsApart(t *testing.T) {
	r := newRig(t)
	r.in.opts.Groups = func() []string { return []string{"line-1"} }
	handle := func(id, topic, payload string) apiv1.Reply {
		t.Helper()
		r.in.Handle(Command{Topic: topic, Payload: []byte(payload)})
		return r.sender.last(id)
	}
	if rep := handle("g1", "mqlet/v1/group/line-1/cmd/apply/g1", podInA); rep.Phase == apiv1.Failed {
		t.Fatalf("group apply: %q", rep.Message)
	}
	pod, err := r.st.Pod("a", "web")
	if err != nil || pod.Annotations[apiv1.AnnotationSource] != "group/line-1" {
		t.Fatalf("group pod stored %v with source %q", err, pod.Annotations[apiv1.AnnotationSource])
	}
	// The node's commands cannot change or delete the group's pod.
	rep := handle("n1", "mqlet/v1/n1/cmd/apply/n1", podInA)
	if rep.Phase != apiv1.Failed || !strings.Contains(rep.Message, "stored from source group/line-1; this command's source is node") {
		t.Fatalf("node apply over a group pod: %s %q", rep.Phase, rep.Message)
	}
	rep = handle("n2", "mqlet/v1/n1/cmd/delete/n2", `{"kind":"Pod","namespace":"a","name":"web"}`)
	if rep.Phase != apiv1.Failed || !strings.Contains(rep.Message, "group/line-1") {
		t.Fatalf("node delete of a group pod: %s %q", rep.Phase, rep.Message)
	}
	// A node sync keeps the group's objects; a group sync the node's.
	handle("n3", "mqlet/v1/n1/cmd/apply/n3", `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"own","namespace":"a"},"data":{"k":"v"}}`)
	if rep := handle("n4", "mqlet/v1/n1/cmd/sync/n4", `{"apiVersion":"v1","kind":"List","items":[]}`); rep.Phase == apiv1.Failed {
		t.Fatalf("node sync: %q", rep.Message)
	}
	// ... and says so in its accepted reply.
	if acc := r.sender.reply("n4", apiv1.Accepted); !strings.Contains(acc.Message, "kept 1 object(s) of other sources, which a node sync does not replace (group/line-1: 1)") {
		t.Fatalf("node sync's accepted reply does not name what it kept: %q", acc.Message)
	}
	if _, err := r.st.Pod("a", "web"); err != nil {
		t.Fatalf("node sync removed the group's pod: %v", err)
	}
	if _, err := r.st.ConfigMap("a", "own"); err == nil {
		t.Fatal("node sync kept the node's own configmap")
	}
	handle("n5", "mqlet/v1/n1/cmd/apply/n5", `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"own","namespace":"a"},"data":{"k":"v"}}`)
	if rep := handle("g2", "mqlet/v1/group/line-1/cmd/sync/g2", `{"apiVersion":"v1","kind":"List","items":[]}`); rep.Phase == apiv1.Failed {
		t.Fatalf("group sync: %q", rep.Message)
	}
	if _, err := r.st.ConfigMap("a", "own"); err != nil {
		t.Fatalf("group sync removed the node's configmap: %v", err)
	}
	if acc := r.sender.reply("g2", apiv1.Accepted); strings.Contains(acc.Message, "kept") || strings.Contains(acc.Message, "node") {
		t.Fatalf("a group sync's reply tells of objects the group may not read: %q", acc.Message)
	}
	if _, err := r.st.Pod("a", "web"); err == nil {
		t.Fatal("group sync kept the group's pod")
	}
	// A group's command sees only its own objects; a client cannot claim
	// another source.
	if rep := handle("g3", "mqlet/v1/group/line-1/cmd/get/g3", `{"kind":"ConfigMap"}`); rep.Phase != apiv1.Succeeded || !strings.HasPrefix(rep.Message, "0 pods, 0 configmaps") {
		t.Fatalf("group get: %s %q", rep.Phase, rep.Message)
	}
	claim := `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"c","annotations":{"mqlet.io/source":"group/line-1"}},"data":{}}`
	if rep := handle("n6", "mqlet/v1/n1/cmd/apply/n6", claim); rep.Phase != apiv1.Failed || !strings.Contains(rep.Message, "mqlet.io/source") {
		t.Fatalf("claimed source: %s %q", rep.Phase, rep.Message)
	}
}
