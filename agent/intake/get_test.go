package intake

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/mqlet/mqlet/agent/pending"
	"github.com/mqlet/mqlet/agent/reply"
	"github.com/mqlet/mqlet/agent/store"
	apiv1 "github.com/mqlet/mqlet/api/v1"
)

// Ten ConfigMaps of ~900 KiB and ten "{}" gets: every reply message stays
// within the bound, the listing carries no data, each ConfigMap is still
// readable by name (in parts), and the store grows by the records' bound at
// most, not by the results.
func TestGetAmplificationIsBounded(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state.db")
	const maxRecord = 1 << 20
	st, err := store.OpenWith(path, store.Options{MaxReplyBytes: maxRecord})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	box := &recordingBox{}
	topics := apiv1.Scheme{Prefix: "mqlet/v1", Node: "n1"}
	const maxReply = 256 << 10
	sender := reply.NewSender(topics, box, st, nil, zerolog.Nop(), reply.WithMaxReplyBytes(maxReply))
	in := New(Options{Topics: topics, MaxPayloadBytes: 1 << 20, ApplyDeadline: time.Minute},
		st, sender, &fakeTracker{added: map[string]map[string]pending.Want{}}, &fakeScheduler{deletes: map[string]*int64{}}, &fakeEvents{}, noStatus{}, zerolog.Nop())
	value := strings.Repeat("0123456789abcdef", 900<<10/16)
	for i := 0; i < 10; i++ {
		payload := fmt.Appendf(nil, `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"big-%d"},"data":{"v":%q}}`, i, value)
		in.Handle(Command{Topic: fmt.Sprintf("mqlet/v1/n1/cmd/apply/a%d", i), Payload: payload})
		if reps := box.replies(t, fmt.Sprintf("a%d", i)); len(reps) != 1 || reps[0].Phase != apiv1.Accepted {
			t.Fatalf("apply %d: %+v", i, reps)
		}
	}
	size := func() int64 {
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		return fi.Size()
	}
	before := size()
	for i := 0; i < 10; i++ {
		in.Handle(Command{Topic: fmt.Sprintf("mqlet/v1/n1/cmd/get/g%d", i), Payload: []byte(`{}`)})
	}
	after := size()
	box.mu.Lock()
	for _, m := range box.msgs {
		if len(m.Payload) > maxReply {
			t.Errorf("reply on %s: %d bytes, bound %d", m.Topic, len(m.Payload), maxReply)
		}
		if strings.HasSuffix(m.Topic, "/reply/g0") && (strings.Contains(string(m.Payload), value[:64]) || !strings.Contains(string(m.Payload), "omitted: 921600 bytes")) {
			t.Errorf("the listing shows data: %.300s", m.Payload)
		}
	}
	box.mu.Unlock()
	for i := 0; i < 10; i++ {
		reps := box.replies(t, fmt.Sprintf("g%d", i))
		if len(reps) != 1 || reps[0].Phase != apiv1.Succeeded || !strings.Contains(reps[0].Message, "10 configmaps") {
			t.Fatalf("get %d: %d replies, first %+v", i, len(reps), reps[0].Message)
		}
	}
	// Each ConfigMap by name: the whole data, assembled from parts.
	for i := 0; i < 10; i++ {
		id := fmt.Sprintf("n%d", i)
		in.Handle(Command{Topic: "mqlet/v1/n1/cmd/get/" + id, Payload: fmt.Appendf(nil, `{"kind":"ConfigMap","name":"big-%d"}`, i)})
		var payloads [][]byte
		box.mu.Lock()
		for _, m := range box.msgs {
			if strings.HasSuffix(m.Topic, "/reply/"+id) {
				payloads = append(payloads, m.Payload)
			}
		}
		box.mu.Unlock()
		if len(payloads) < 4 {
			t.Fatalf("get by name %d: %d messages, want the ~900 KiB result in parts", i, len(payloads))
		}
		result, _, err := apiv1.Assemble(payloads)
		if err != nil {
			t.Fatalf("get by name %d: %v", i, err)
		}
		var res struct {
			ConfigMaps []struct {
				Data map[string]string `json:"data"`
			} `json:"configMaps"`
		}
		if err := json.Unmarshal(result, &res); err != nil || len(res.ConfigMaps) != 1 || res.ConfigMaps[0].Data["v"] != value {
			t.Fatalf("get by name %d: data not whole (%v)", i, err)
		}
	}
	t.Logf("state.db %d → %d bytes over ten gets of 10 × 900 KiB", before, after)
	if grew := after - before; grew > 2*maxRecord {
		t.Fatalf("state.db grew %d bytes over ten gets, want at most ~%d (the record bound)", grew, maxRecord)
	}
	if n, _ := st.ReplyBytes(); n > maxRecord {
		t.Fatalf("records take %d bytes, bound %d", n, maxRecord)
	}
}

// A labelSelector picks objects by their labels, in kubectl's syntax.
func TestGetLabelSelector(t *testing.T) {
	st, err := store.OpenWith(filepath.Join(t.TempDir(), "state.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	box := &recordingBox{}
	topics := apiv1.Scheme{Prefix: "mqlet/v1", Node: "n1"}
	sender := reply.NewSender(topics, box, st, nil, zerolog.Nop())
	in := New(Options{Topics: topics, MaxPayloadBytes: 1 << 20, ApplyDeadline: time.Minute},
		st, sender, &fakeTracker{added: map[string]map[string]pending.Want{}}, &fakeScheduler{deletes: map[string]*int64{}}, &fakeEvents{}, noStatus{}, zerolog.Nop())
	for i, app := range []string{"web", "db", "web"} {
		payload := fmt.Appendf(nil, `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"c%d","labels":{"app":%q}},"data":{"k":"v"}}`, i, app)
		in.Handle(Command{Topic: fmt.Sprintf("mqlet/v1/n1/cmd/apply/a%d", i), Payload: payload})
	}
	for i, c := range []struct{ sel, want string }{{"app=web", "c0,c2"}, {"app!=web", "c1"}, {"app in (db)", "c1"}, {"", "c0,c1,c2"}, {"tier=x", ""}} {
		sel, want := c.sel, c.want
		id := fmt.Sprintf("g%d", i)
		payload, _ := json.Marshal(apiv1.GetRequest{Kind: "ConfigMap", LabelSelector: sel})
		in.Handle(Command{Topic: "mqlet/v1/n1/cmd/get/" + id, Payload: payload})
		reps := box.replies(t, id)
		var res apiv1.GetResult
		if len(reps) != 1 {
			t.Fatalf("%q: %+v", sel, reps)
		}
		b, _ := json.Marshal(reps[0].Result)
		if err := json.Unmarshal(b, &res); err != nil {
			t.Fatalf("%q: %v", sel, err)
		}
		var names []string
		for _, c := range res.ConfigMaps {
			names = append(names, c.Name)
		}
		if got := strings.Join(names, ","); got != want {
			t.Errorf("selector %q: %s, want %s", sel, got, want)
		}
	}
}

type fixedNode struct{ node *v1.Node }

func (f *fixedNode) Node() *v1.Node {
	if f.node == nil {
		return nil
	}
	return f.node.DeepCopy()
}

// get {"kind":"Node"} answers the node last published on the node topic.
func TestGetNode(t *testing.T) {
	st, err := store.OpenWith(filepath.Join(t.TempDir(), "state.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	box := &recordingBox{}
	topics := apiv1.Scheme{Prefix: "mqlet/v1", Node: "n1"}
	sender := reply.NewSender(topics, box, st, nil, zerolog.Nop())
	src := &fixedNode{}
	in := New(Options{Topics: topics, MaxPayloadBytes: 1 << 20, ApplyDeadline: time.Minute, Verbs: VerbOptions{Node: src}},
		st, sender, &fakeTracker{added: map[string]map[string]pending.Want{}}, &fakeScheduler{deletes: map[string]*int64{}}, &fakeEvents{}, noStatus{}, zerolog.Nop())
	get := func(id, payload string) apiv1.Reply {
		t.Helper()
		in.Handle(Command{Topic: "mqlet/v1/n1/cmd/get/" + id, Payload: []byte(payload)})
		reps := box.replies(t, id)
		if len(reps) != 1 {
			t.Fatalf("%s: %+v", payload, reps)
		}
		return reps[0]
	}
	if r := get("early", `{"kind":"Node"}`); r.Phase != apiv1.Failed || !strings.Contains(r.Message, "not published yet") {
		t.Fatalf("before the first node status: %+v", r)
	}
	src.node = &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{"kubernetes.io/arch": "arm64"}},
		Status: v1.NodeStatus{Conditions: []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionTrue}}}}
	for i, c := range []struct {
		payload string
		want    int // nodes; -1: failed
		msg     string
	}{
		{`{"kind":"Node"}`, 1, ""},
		{`{"kind":"nodes","name":"n1"}`, 1, ""},
		{`{"kind":"Node","labelSelector":"kubernetes.io/arch=arm64"}`, 1, ""},
		{`{"kind":"Node","labelSelector":"kubernetes.io/arch=amd64"}`, 0, ""},
		{`{"kind":"Node","name":"other"}`, -1, "not found: Node other (this is node n1)"},
		{`{"kind":"Node","namespace":"default"}`, -1, "not namespaced"},
		{`{"kind":"Node","labelSelector":"a=(("}`, -1, "labelSelector"},
	} {
		r := get(fmt.Sprintf("n%d", i), c.payload)
		if c.want < 0 {
			if r.Phase != apiv1.Failed || !strings.Contains(r.Message, c.msg) {
				t.Errorf("%s: %s %q, want failed %q", c.payload, r.Phase, r.Message, c.msg)
			}
			continue
		}
		var res apiv1.NodeList
		b, _ := json.Marshal(r.Result)
		if err := json.Unmarshal(b, &res); err != nil || r.Phase != apiv1.Succeeded {
			t.Fatalf("%s: %s %q %v", c.payload, r.Phase, r.Message, err)
		}
		if len(res.Nodes) != c.want {
			t.Errorf("%s: %d nodes, want %d", c.payload, len(res.Nodes), c.want)
			continue
		}
		if c.want == 1 {
			n := res.Nodes[0]
			if n.Name != "n1" || n.Kind != "Node" || n.APIVersion != "v1" || len(n.Status.Conditions) != 1 {
				t.Errorf("%s: node %+v", c.payload, n)
			}
		}
	}
}

type historyOf []*v1.Event

func (h historyOf) List(match func(*v1.Event) bool) []*v1.Event {
	var out []*v1.Event
	for _, ev := range h {
		if match(ev) {
			out = append(out, ev)
		}
	}
	return out
}

// The events of a pod that exists are those of its current uid, not of an
// earlier, deleted pod of the same name (issue 22); of a pod that is gone,
// every one of that name.
func TestGetEventsOfAPodAreThoseOfItsUID(t *testing.T) {
	r := newRig(t)
	r.in.Handle(Command{Topic: "mqlet/v1/n1/cmd/apply/a1", Payload: []byte(webPod)})
	pod, err := r.st.Pod("default", "web")
	if err != nil {
		t.Fatal(err)
	}
	ref := func(uid string) v1.ObjectReference {
		return v1.ObjectReference{Kind: "Pod", Namespace: "default", Name: "web", UID: types.UID(uid)}
	}
	r.in.opts.Verbs.Events = historyOf{
		{Reason: "Killing", InvolvedObject: ref("0b7c2f4e-1111-4e5f-9a6b-7c8d9e0f1a2b")},
		{Reason: "Scheduled", InvolvedObject: ref(string(pod.UID))},
	}
	ask := func(id, payload string) []string {
		t.Helper()
		r.in.Handle(Command{Topic: "mqlet/v1/n1/cmd/get/" + id, Payload: []byte(payload)})
		last := r.sender.last(id)
		list, ok := last.Result.(apiv1.EventList)
		if last.Phase != apiv1.Succeeded || !ok {
			t.Fatalf("get %s: %+v", payload, last)
		}
		var reasons []string
		for _, ev := range list.Events {
			reasons = append(reasons, ev.Reason)
		}
		return reasons
	}
	if got := ask("g1", `{"kind":"Event","involvedObject":{"kind":"Pod","namespace":"default","name":"web"}}`); !slices.Equal(got, []string{"Scheduled"}) {
		t.Errorf("events of pod web: %v, want only its own uid's Scheduled", got)
	}
	if got := ask("g2", `{"kind":"Event"}`); len(got) != 2 {
		t.Errorf("every event: %v", got)
	}
	r.in.Handle(Command{Topic: "mqlet/v1/n1/cmd/delete/d1", Payload: []byte(`{"kind":"Pod","namespace":"default","name":"web"}`)})
	if got := ask("g3", `{"kind":"Event","involvedObject":{"kind":"Pod","name":"web"}}`); len(got) != 2 {
		t.Errorf("events of a deleted pod web: %v, want every one of that name", got)
	}
}
