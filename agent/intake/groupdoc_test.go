package intake

import (
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mqlet/mqlet/agent/store"
	apiv1 "github.com/mqlet/mqlet/api/v1"
	"github.com/mqlet/mqlet/signing"
	"github.com/mqlet/mqlet/signing/noncestore"
)

const docTopic = "mqlet/v1/group/line-1/desired"

// groupDoc is a document of line-1 at gen holding a ConfigMap per name
// (its value v) and, with pod, a pod named web.
func groupDoc(gen uint64, v string, names ...string) []byte {
	var items []string
	for _, n := range names {
		items = append(items, fmt.Sprintf(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":%q,"namespace":"a"},"data":{"k":%q}}`, n, v))
	}
	return fmt.Appendf(nil, `{"apiVersion":"mqlet.io/v1","kind":"GroupDocument","group":"line-1","generation":%d,"objects":{"apiVersion":"v1","kind":"List","items":[%s]}}`,
		gen, strings.Join(items, ","))
}

func memberRig(t *testing.T) *rig {
	r := newRig(t)
	r.in.opts.Groups = func() []string { return []string{"line-1"} }
	return r
}

func (r *rig) configMaps(t *testing.T) map[string]string {
	t.Helper()
	cms, err := r.st.ListConfigMaps()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, c := range cms {
		out[c.Name] = c.Data["k"] + "@" + c.Annotations[apiv1.AnnotationSource]
	}
	return out
}

func (r *rig) countReason(reason string) int {
	n := 0
	for _, x := range r.events.reasons {
		if x == reason {
			n++
		}
	}
	return n
}

// The generation rule: a newer generation is applied as the group's sync
// (replacing only the group's objects), the same one again (every
// reconnect delivers the retained document) changes nothing, an older one
// is not applied and said so, and the same generation with other content
// is refused.
func TestGroupDocumentGenerationRule(t *testing.T) {
	r := memberRig(t)
	var told []string
	r.in.opts.OnGroupApplied = func(g string, gen uint64) { told = append(told, fmt.Sprintf("%s@%d", g, gen)) }
	// The node's own object stays whatever the group's document says.
	r.in.Handle(Command{Topic: "mqlet/v1/n1/cmd/apply/own", Payload: []byte(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"own","namespace":"a"},"data":{"k":"mine"}}`)})

	r.in.Handle(Command{Topic: docTopic, Payload: groupDoc(2, "v2", "x", "y"), Retained: true})
	id2 := apiv1.GroupDocumentRequestID("line-1", 2)
	if rep := r.sender.reply(id2, apiv1.Accepted); rep.Verb != apiv1.VerbDesired || !strings.Contains(rep.Message, "ConfigMap a/x created") {
		t.Fatalf("accepted reply of generation 2: %+v (replies %v)", rep, r.sender.phases(id2))
	}
	want := map[string]string{"own": "mine@node", "x": "v2@group/line-1", "y": "v2@group/line-1"}
	if got := r.configMaps(t); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("after generation 2: %v, want %v", got, want)
	}
	if g, found, _ := r.st.GroupApplied("line-1"); !found || g.Generation != 2 {
		t.Fatalf("applied generation %+v %v", g, found)
	}

	// Delivered again (a reconnect): nothing happens, no reply.
	before := len(r.sender.replies)
	r.in.Handle(Command{Topic: docTopic, Payload: groupDoc(2, "v2", "x", "y"), Retained: true})
	if len(r.sender.replies) != before || r.countReason(ReasonStaleGroupDocument) != 0 {
		t.Fatalf("the same document again answered %d replies, %d stale events", len(r.sender.replies)-before, r.countReason(ReasonStaleGroupDocument))
	}

	// Generation 5 drops y and changes x.
	r.in.Handle(Command{Topic: docTopic, Payload: groupDoc(5, "v5", "x"), Retained: true})
	want = map[string]string{"own": "mine@node", "x": "v5@group/line-1"}
	if got := r.configMaps(t); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("after generation 5: %v, want %v", got, want)
	}

	// An older generation published later is not applied, and said so.
	r.in.Handle(Command{Topic: docTopic, Payload: groupDoc(3, "v3", "x", "z"), Retained: true})
	if got := r.configMaps(t); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("generation 3 after 5 changed the objects: %v", got)
	}
	if r.countReason(ReasonStaleGroupDocument) != 1 || len(r.sender.phases(apiv1.GroupDocumentRequestID("line-1", 3))) != 0 {
		t.Fatalf("generation 3 after 5: %d stale events, replies %v", r.countReason(ReasonStaleGroupDocument), r.sender.phases(apiv1.GroupDocumentRequestID("line-1", 3)))
	}
	// Generation 5 again with other content: refused, said so.
	r.in.Handle(Command{Topic: docTopic, Payload: groupDoc(5, "other", "x"), Retained: true})
	if got := r.configMaps(t); fmt.Sprint(got) != fmt.Sprint(want) || r.countReason(ReasonStaleGroupDocument) != 2 {
		t.Fatalf("generation 5 with other content: %v, %d stale events", got, r.countReason(ReasonStaleGroupDocument))
	}
	if fmt.Sprint(told) != "[line-1@2 line-1@5]" || r.countReason(ReasonAppliedGroupDocument) != 2 {
		t.Fatalf("told %v, %d applied events", told, r.countReason(ReasonAppliedGroupDocument))
	}

	// Persisted: a new intake on the reopened store still refuses 3 and skips 5.
	path := r.st.Path()
	_ = r.st.Close()
	st, err := store.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	r2 := memberRig(t)
	r2.st, r2.sender.st = st, st
	r2.in.store = st
	r2.in.Handle(Command{Topic: docTopic, Payload: groupDoc(3, "v3", "x", "z"), Retained: true})
	r2.in.Handle(Command{Topic: docTopic, Payload: groupDoc(5, "v5", "x"), Retained: true})
	if got := r2.configMaps(t); fmt.Sprint(got) != fmt.Sprint(want) || r2.countReason(ReasonStaleGroupDocument) != 1 || len(r2.sender.replies) != 0 {
		t.Fatalf("after a restart: %v, %d stale events, %d replies", got, r2.countReason(ReasonStaleGroupDocument), len(r2.sender.replies))
	}
}

// Bad documents are refused with a Warning event and change nothing.
func TestGroupDocumentBadInputChangesNothing(t *testing.T) {
	r := memberRig(t)
	r.in.Handle(Command{Topic: docTopic, Payload: groupDoc(1, "v1", "x"), Retained: true})
	want := fmt.Sprint(r.configMaps(t))
	big := groupDoc(2, strings.Repeat("v", 5000), "x") // over MaxPayloadBytes 4096
	for name, c := range map[string]Command{
		"unknown field":    {Topic: docTopic, Payload: []byte(strings.Replace(string(groupDoc(2, "v", "x")), `"generation"`, `"extra":1,"generation"`, 1))},
		"too big":          {Topic: docTopic, Payload: big},
		"envelope too big": {Topic: docTopic, Payload: []byte(strings.Repeat(" ", 16<<10))},
		"other group's":    {Topic: docTopic, Payload: []byte(strings.Replace(string(groupDoc(2, "v", "x")), `"group":"line-1"`, `"group":"line-2"`, 1))},
		"not a member":     {Topic: "mqlet/v1/group/line-2/desired", Payload: []byte(strings.Replace(string(groupDoc(2, "v", "x")), `"group":"line-1"`, `"group":"line-2"`, 1))},
		"group with +":     {Topic: "mqlet/v1/group/a+b/desired", Payload: groupDoc(2, "v", "x")},
		"group with #":     {Topic: "mqlet/v1/group/a#/desired", Payload: groupDoc(2, "v", "x")},
		"signed, no check": {Topic: docTopic, Payload: []byte("eyJhbGciOiJFZERTQSJ9.e30.c2ln")},
		"invalid pod":      {Topic: docTopic, Payload: []byte(strings.Replace(string(groupDoc(2, "v", "x")), `"items":[`, `"items":[{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"},"spec":{"containers":[{"name":"c","image":"busybox:1","securityContext":{"privileged":true}}]}},`, 1))},
	} {
		events := len(r.events.reasons)
		r.in.Handle(c)
		if got := fmt.Sprint(r.configMaps(t)); got != want {
			t.Errorf("%s: objects %s, want %s", name, got, want)
		}
		if g, _, _ := r.st.GroupApplied("line-1"); g.Generation != 1 {
			t.Errorf("%s: applied generation %d", name, g.Generation)
		}
		if len(r.events.reasons) == events {
			t.Errorf("%s: refused without an event", name)
		}
	}
	// The invalid generation 2 is answered failed once, and not tried
	// again at every delivery; generation 3 fixes it.
	id2 := apiv1.GroupDocumentRequestID("line-1", 2)
	if r.sender.last(id2).Phase != apiv1.Failed {
		t.Fatalf("generation 2 with an invalid pod: %+v", r.sender.last(id2))
	}
	n := len(r.sender.replies)
	r.in.Handle(Command{Topic: docTopic, Payload: []byte(strings.Replace(string(groupDoc(2, "v", "x")), `"items":[`, `"items":[{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"},"spec":{"containers":[{"name":"c","image":"busybox:1","securityContext":{"privileged":true}}]}},`, 1))})
	if len(r.sender.replies) != n {
		t.Fatal("a failed generation was tried again")
	}
	r.in.Handle(Command{Topic: docTopic, Payload: groupDoc(3, "v3", "x")})
	if got := r.configMaps(t)["x"]; got != "v3@group/line-1" {
		t.Fatalf("generation 3: x is %q", got)
	}
	// A cleared retained document (empty) changes nothing.
	r.in.Handle(Command{Topic: docTopic, Payload: nil, Retained: true})
	if got := r.configMaps(t)["x"]; got != "v3@group/line-1" {
		t.Fatalf("after clearing: x is %q", got)
	}
}

// In signed-only mode a document must be signed, for the group, by a key
// that may sign sync; the retained signed document applies days later.
func TestGroupDocumentSignedOnly(t *testing.T) {
	r := memberRig(t)
	priv, _ := signing.GenerateKey()
	signer, _ := signing.NewSigner("ops", priv)
	nonces, err := noncestore.Open(filepath.Join(t.TempDir(), "nonces.db"), 100)
	if err != nil {
		t.Fatal(err)
	}
	defer nonces.Close()
	v, err := signing.NewVerifier(signing.Policy{Required: true, Targets: []string{"n1"}, Groups: r.in.opts.Groups,
		Keys:      []signing.Key{{ID: "ops", Public: signer.Public(), Verbs: []string{"sync"}}},
		ClockSkew: time.Second, MaxLifetime: time.Hour, MaxEnvelopeBytes: 1 << 20}, nonces, nil)
	if err != nil {
		t.Fatal(err)
	}
	r.in.opts.Opener, r.in.opts.DocumentOpener = v, v
	r.in.Handle(Command{Topic: docTopic, Payload: groupDoc(1, "v1", "x"), Retained: true})
	if len(r.configMaps(t)) != 0 || r.countReason(ReasonFailedGroupDocument) != 1 {
		t.Fatalf("unsigned document in signed-only: %v, events %v", r.configMaps(t), r.events.reasons)
	}
	env, err := signer.SignDocument("line-1", time.Now().Add(-72*time.Hour), groupDoc(1, "v1", "x"))
	if err != nil {
		t.Fatal(err)
	}
	r.in.Handle(Command{Topic: docTopic, Payload: env, Retained: true})
	if got := r.configMaps(t)["x"]; got != "v1@group/line-1" {
		t.Fatalf("signed document: %v (events %v)", r.configMaps(t), r.events.reasons)
	}
}

// Through the pipeline, the node hears of a document applied only once
// its batch is durable.
func TestGroupDocumentToldAfterCommit(t *testing.T) {
	r := newPipeRig(t, PipelineOptions{})
	r.in.opts.Groups = func() []string { return []string{"line-1"} }
	var mu sync.Mutex
	var stored []uint64
	done := make(chan struct{})
	r.in.opts.OnGroupApplied = func(g string, gen uint64) {
		g2, _, err := r.st.GroupApplied(g) // outside the batch: committed
		mu.Lock()
		stored = append(stored, g2.Generation)
		mu.Unlock()
		if err != nil {
			t.Error(err)
		}
		close(done)
	}
	r.run(t)
	r.pipe.Submit(Command{Topic: docTopic, Payload: groupDoc(4, "v", "x"), Retained: true})
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("not told of the document applied")
	}
	mu.Lock()
	defer mu.Unlock()
	if fmt.Sprint(stored) != "[4]" {
		t.Fatalf("when told, the store had generation %v", stored)
	}
}
