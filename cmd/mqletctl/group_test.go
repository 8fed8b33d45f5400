package main

import (
	"crypto/ed25519"
	"encoding/json"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	v1 "k8s.io/api/core/v1"

	apiv1 "github.com/mqlet/mqlet/api/v1"
	"github.com/mqlet/mqlet/internal/testutil/mosquitto"
	"github.com/mqlet/mqlet/signing"
)

// docMember is a fake member on a real mosquitto for group documents: it
// retains its state (groups and the generations applied), takes its
// groups' documents as the agent does (newer generations only) and
// answers on its own reply topic, or, with refuse set, refuses with a
// FailedGroupDocument event as the agent does.
type docMember struct {
	t      *testing.T
	name   string
	groups []string
	c      paho.Client

	mu      sync.Mutex
	online  bool
	refuse  string
	gens    map[string]uint64
	got     [][]byte
	replied int
}

func startDocMember(t *testing.T, url, name string, groups []string, gens map[string]uint64, online bool) *docMember {
	t.Helper()
	m := &docMember{t: t, name: name, groups: groups, online: online, gens: gens}
	if m.gens == nil {
		m.gens = map[string]uint64{}
	}
	m.c = testClient(t, url, "docmember-"+name)
	s := apiv1.Scheme{Node: name}
	var answering sync.WaitGroup
	t.Cleanup(answering.Wait)
	filters := map[string]byte{}
	for _, g := range groups {
		filters[s.GroupDesired(g)] = 1
	}
	tok := m.c.SubscribeMultiple(filters, func(cl paho.Client, msg paho.Message) {
		group, _, _ := s.ParseGroupDesired(msg.Topic())
		payload := append([]byte(nil), msg.Payload()...)
		m.mu.Lock()
		m.got = append(m.got, payload)
		online, refuse := m.online, m.refuse
		m.mu.Unlock()
		if !online || len(payload) == 0 {
			return
		}
		answering.Add(1)
		go func() {
			defer answering.Done()
			m.take(cl, msg.Topic(), group, payload, refuse)
		}()
	})
	if !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatalf("doc member %s subscribing: %v", name, tok.Error())
	}
	m.publishState()
	return m
}

func (m *docMember) take(cl paho.Client, topic, group string, payload []byte, refuse string) {
	s := apiv1.Scheme{Node: m.name}
	if refuse != "" {
		ev := v1.Event{Reason: apiv1.ReasonFailedGroupDocument, Type: v1.EventTypeWarning, Message: "group document on " + topic + " not applied: " + refuse}
		b, _ := json.Marshal(ev)
		mustPublish(m.t, cl, s.Events(), false, b)
		return
	}
	body := payload
	if signing.LooksSigned(payload) {
		_, _, _, b, err := signing.PeekDocument(payload)
		if err != nil {
			m.t.Errorf("doc member %s: %v", m.name, err)
			return
		}
		body = b
	}
	doc, err := apiv1.DecodeGroupDocument(group, body)
	if err != nil {
		m.t.Errorf("doc member %s: %v", m.name, err)
		return
	}
	m.mu.Lock()
	stale := doc.Generation <= m.gens[group]
	m.mu.Unlock()
	if stale {
		return
	}
	id := apiv1.GroupDocumentRequestID(group, doc.Generation)
	for _, phase := range []string{apiv1.Accepted, apiv1.Succeeded} {
		b, _ := json.Marshal(apiv1.Reply{RequestID: id, Verb: apiv1.VerbDesired, Node: m.name, Phase: phase, TS: testNow.Add(-time.Second)})
		mustPublish(m.t, cl, s.Reply(id), false, b)
	}
	m.mu.Lock()
	m.gens[group] = doc.Generation
	m.replied++
	m.mu.Unlock()
	m.publishState()
}

func (m *docMember) publishState() {
	m.mu.Lock()
	st := apiv1.NodeState{State: apiv1.StateOnline, BootID: "b", Version: "test", Groups: m.groups, GroupGenerations: map[string]uint64{}, TS: time.Now().UTC()}
	for g, n := range m.gens {
		st.GroupGenerations[g] = n
	}
	if !m.online {
		st.State, st.TS, st.GroupGenerations = apiv1.StateOffline, offlineSince, nil
	}
	m.mu.Unlock()
	b, _ := json.Marshal(st)
	mustPublish(m.t, m.c, apiv1.Scheme{Node: m.name}.State(), true, b)
}

func (m *docMember) received() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.got)
}

// retainedDoc reads what is retained on group's document topic ("" when
// nothing).
func retainedDoc(t *testing.T, url, group string) []byte {
	t.Helper()
	c := testClient(t, url, "reader-"+group+"-"+time.Now().Format("150405.000000000"))
	defer c.Disconnect(100)
	got := make(chan []byte, 1)
	tok := c.Subscribe(apiv1.Scheme{}.GroupDesired(group), 1, func(_ paho.Client, m paho.Message) {
		select {
		case got <- append([]byte(nil), m.Payload()...):
		default:
		}
	})
	if !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatalf("subscribing: %v", tok.Error())
	}
	select {
	case b := <-got:
		return b
	case <-time.After(500 * time.Millisecond):
		return nil
	}
}

const groupManifest = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\nspec:\n  containers:\n  - name: main\n    image: busybox:1\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cfg\ndata:\n  k: v\n"

// group publish: the generation is one above the newest retained or
// applied (a lower one is refused, nothing published); the document is
// retained with the manifests as a List; one row per member, an offline
// one Pending (exit 3), one that refuses it (its FailedGroupDocument
// event) failed with why (exit 1). group status: which member applied
// which generation, offline ones Pending.
func TestGroupPublishAndStatus(t *testing.T) {
	b := mosquitto.Start(t)
	run := func(stdin string, args ...string) result {
		t.Helper()
		return runCLIEnv(t, map[string]string{envBroker: b.URL()}, stdin, append([]string{"--retained-wait", "500ms", "--timeout", "10s"}, args...)...)
	}
	a := startDocMember(t, b.URL(), "a", []string{"line-1"}, map[string]uint64{"line-1": 3}, true)
	bm := startDocMember(t, b.URL(), "b", []string{"line-1", "other"}, nil, true)
	c := startDocMember(t, b.URL(), "c", []string{"line-1"}, nil, false)
	d := startDocMember(t, b.URL(), "d", []string{"other"}, nil, true)

	// Nothing retained yet: status says so (exit 1) and lists the members.
	res := run("", "group", "status", "line-1")
	if res.code != exitFail || !strings.Contains(res.stdout, "group line-1: no document retained") || !regexp.MustCompile(`(?m)^a\s+online\s+3\s+-\s`).MatchString(res.stdout) {
		t.Fatalf("status before any document: %s", res)
	}
	// A generation not above what member a applied is refused, nothing sent.
	res = run(groupManifest, "group", "publish", "line-1", "-f", "-", "--generation", "3")
	if res.code != exitFail || !strings.Contains(res.stderr, "--generation 3 is not newer than generation 3 (member a)") {
		t.Fatalf("publish of an old generation: %s", res)
	}
	if got := retainedDoc(t, b.URL(), "line-1"); got != nil || a.received() != 0 {
		t.Fatalf("a refused publish left %q retained", got)
	}

	// Published: generation 4, answered by a and b, c pending.
	res = run(groupManifest, "group", "publish", "line-1", "-f", "-")
	if res.code != exitQueued || !strings.Contains(res.stderr, "group line-1: generation 4 published, retained on mqlet/v1/group/line-1/desired") {
		t.Fatalf("publish: want exit 3 (c offline): %s", res)
	}
	for _, want := range []*regexp.Regexp{rowRE("a", "succeeded"), rowRE("b", "succeeded"), regexp.MustCompile(`(?m)^c\s+Pending\s+offline since 2026-03-01T11:58:00Z: the document is retained`)} {
		if !want.MatchString(res.stdout) {
			t.Errorf("publish output lacks %s: %s", want, res)
		}
	}
	if strings.Contains(res.stdout, "\nd ") || d.received() != 0 {
		t.Errorf("d, outside the group, took part: %s", res)
	}
	doc, err := apiv1.DecodeGroupDocument("line-1", retainedDoc(t, b.URL(), "line-1"))
	if err != nil || doc.Generation != 4 {
		t.Fatalf("retained document: %+v, %v", doc, err)
	}
	var list struct {
		Kind  string `json:"kind"`
		Items []struct {
			Kind string `json:"kind"`
		} `json:"items"`
	}
	if err := json.Unmarshal(doc.Objects, &list); err != nil || list.Kind != "List" || len(list.Items) != 2 || list.Items[0].Kind != "Pod" || list.Items[1].Kind != "ConfigMap" {
		t.Fatalf("the document's objects: %s (%v)", doc.Objects, err)
	}

	// Status: a and b applied 4, c pending; exit 3.
	res = run("", "group", "status", "line-1")
	if res.code != exitQueued || !strings.Contains(res.stdout, "group line-1: generation 4 retained, 2 object(s), unsigned") {
		t.Fatalf("status: want exit 3: %s", res)
	}
	for _, want := range []*regexp.Regexp{regexp.MustCompile(`(?m)^a\s+online\s+4\s+Applied\s`), regexp.MustCompile(`(?m)^b\s+online\s+4\s+Applied\s`), regexp.MustCompile(`(?m)^c\s+offline\s+-\s+Pending\s+offline since`)} {
		if !want.MatchString(res.stdout) {
			t.Errorf("status lacks %s: %s", want, res)
		}
	}
	res = run("", "group", "status", "line-1", "-o", "json")
	var st groupStatus
	if err := json.Unmarshal([]byte(res.stdout), &st); err != nil || st.Generation != 4 || len(st.Members) != 3 || st.Members[2].Phase != phasePending {
		t.Fatalf("status -o json: %+v, %v: %s", st, err, res)
	}

	// b refuses the next one (its event is its answer): exit 1, b behind.
	bm.mu.Lock()
	bm.refuse = "signature required"
	bm.mu.Unlock()
	res = run(groupManifest, "group", "publish", "line-1", "-f", "-", "--wait-offline=false")
	if res.code != exitFail || !regexp.MustCompile(`(?m)^b\s+failed\s+FailedGroupDocument: group document on mqlet/v1/group/line-1/desired not applied: signature required`).MatchString(res.stdout) || !rowRE("a", "succeeded").MatchString(res.stdout) {
		t.Fatalf("publish refused by b: want exit 1 and b's reason: %s", res)
	}
	res = run("", "group", "status", "line-1")
	if res.code != exitFail || !regexp.MustCompile(`(?m)^b\s+online\s+4\s+Behind\s+it applied generation 4, not the retained 5`).MatchString(res.stdout) {
		t.Fatalf("status with b behind: want exit 1: %s", res)
	}

	// c comes back and applies it; b takes the next: exit 0.
	c.mu.Lock()
	c.online = true
	c.mu.Unlock()
	c.publishState()
	bm.mu.Lock()
	bm.refuse = ""
	bm.mu.Unlock()
	res = run(groupManifest, "group", "publish", "line-1", "-f", "-", "--generation", "9")
	if res.code != exitOK || !rowRE("c", "succeeded").MatchString(res.stdout) {
		t.Fatalf("publish to every member online: %s", res)
	}
	if res = run("", "group", "status", "line-1"); res.code != exitOK || !regexp.MustCompile(`(?m)^c\s+online\s+9\s+Applied`).MatchString(res.stdout) {
		t.Fatalf("status with every member applied: %s", res)
	}

	// Bad input: refused, nothing published.
	for _, tc := range []struct {
		stdin string
		args  []string
		code  int
		want  string
	}{
		{groupManifest, []string{"group", "publish", "a/b", "-f", "-"}, exitUsage, "group name"},
		{groupManifest, []string{"group", "publish", "line+1", "-f", "-"}, exitUsage, "group name"},
		{groupManifest, []string{"group", "publish", "-f", "-"}, exitUsage, "want one GROUP"},
		{"", []string{"group", "publish", "line-1"}, exitUsage, "-f FILE"},
		{groupManifest, []string{"group", "publish", "line-1", "-f", "-", "--generation", "9007199254740992"}, exitUsage, "want 1 to 9007199254740991"},
		{"apiVersion: v1\nkind: Secret\nmetadata:\n  name: s\nstringData:\n  a: b\n", []string{"group", "publish", "line-1", "-f", "-"}, exitFail, `Secret "s": a group document carries Pods and ConfigMaps only`},
		{"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: s\n", []string{"group", "publish", "line-1", "-f", "-"}, exitFail, `kind "Namespace"`},
		{groupManifest, []string{"group", "publish", "line-1", "-f", "-", "--group", "line-1"}, exitUsage, "unknown flag: --group"},
		{groupManifest, []string{"--group", "line-1", "group", "publish", "line-1", "-f", "-"}, exitUsage, "--group and -L apply to apply"},
		{"", []string{"group", "status", "nobody"}, exitFail, `unknown group "nobody"`},
		{"", []string{"group", "frob", "line-1"}, exitUsage, "unknown subcommand"},
	} {
		res := run(tc.stdin, tc.args...)
		if res.code != tc.code || !strings.Contains(res.stderr, tc.want) {
			t.Errorf("%v: want exit %d and %q: %s", tc.args, tc.code, tc.want, res)
		}
	}
	if doc, _ := apiv1.DecodeGroupDocument("line-1", retainedDoc(t, b.URL(), "line-1")); doc.Generation != 9 {
		t.Fatalf("bad input changed the retained document: generation %d", doc.Generation)
	}
}

// With --sign-key the document is the signed envelope a member opens with
// the key, for the group; a group nobody is in yet takes it (retained for
// its first member); status names the key.
func TestGroupPublishSigned(t *testing.T) {
	b := mosquitto.Start(t)
	key, err := signing.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "op.key")
	if err := signing.WritePrivateKeyFile(file, key); err != nil {
		t.Fatal(err)
	}
	vars := map[string]string{envBroker: b.URL()}
	res := runCLIEnv(t, vars, groupManifest, "--retained-wait", "300ms", "--sign-key", file, "group", "publish", "future", "-f", "-")
	kid := signing.KeyID(key.Public().(ed25519.PublicKey))
	if res.code != exitOK || !strings.Contains(res.stderr, "generation 1 published") || !strings.Contains(res.stderr, "signed by key "+kid) || !strings.Contains(res.stderr, "waits, retained, for its first member") {
		t.Fatalf("signed publish to a group with no member yet: %s", res)
	}
	env := retainedDoc(t, b.URL(), "future")
	v, err := signing.NewVerifier(signing.Policy{Targets: []string{"future"}, Keys: []signing.Key{{ID: kid, Public: key.Public().(ed25519.PublicKey), Verbs: []string{apiv1.VerbSync}}}, ClockSkew: time.Minute, MaxLifetime: time.Hour, MaxEnvelopeBytes: 1 << 20}, noNonces{}, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	opened, err := v.OpenDocument("future", env)
	if err != nil || !opened.Signed {
		t.Fatalf("the member cannot open the signed document: %v", err)
	}
	if doc, err := apiv1.DecodeGroupDocument("future", opened.Body); err != nil || doc.Generation != 1 {
		t.Fatalf("signed body: %+v, %v", doc, err)
	}
	res = runCLIEnv(t, vars, "", "--retained-wait", "300ms", "group", "status", "future")
	if !strings.Contains(res.stdout, "generation 1 retained, 2 object(s), signed by key "+kid) {
		t.Fatalf("status of a signed document: %s", res)
	}
}

// noNonces: a document carries no nonce; the verifier wants a store.
type noNonces struct{}

func (noNonces) Use(string, string, time.Time, time.Time) error { return nil }
