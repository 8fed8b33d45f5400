package intake

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	v1 "k8s.io/api/core/v1"

	"github.com/mqlet/mqlet/agent/pending"
	"github.com/mqlet/mqlet/agent/store"
	"github.com/mqlet/mqlet/agent/validate"
	apiv1 "github.com/mqlet/mqlet/api/v1"
)

type fakeSender struct {
	mu      sync.Mutex
	replies []apiv1.Reply
	resent  []string
	// unrecorded are the replies published by Resend (recorded ones
	// answered again, and refusals that keep their id free).
	unrecorded []apiv1.Reply
	st         *store.Store
	// onResend, when set, sees every payload published unrecorded.
	onResend func(payload []byte)
}

func (f *fakeSender) Send(r apiv1.Reply) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.replies = append(f.replies, r)
	b, _ := json.Marshal(r)
	return f.st.RecordReply(r.RequestID, b, time.Now())
}

func (f *fakeSender) Resend(id string, payload []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.resent = append(f.resent, id)
	var r apiv1.Reply
	if json.Unmarshal(payload, &r) == nil && r.RequestID == id {
		f.unrecorded = append(f.unrecorded, r)
	}
	if f.onResend != nil {
		f.onResend(payload)
	}
	return nil
}

func (f *fakeSender) phases(id string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, r := range f.replies {
		if r.RequestID == id {
			out = append(out, r.Phase)
		}
	}
	return out
}

// reply is the first reply of request id in phase (zero when none).
func (f *fakeSender) reply(id, phase string) apiv1.Reply {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, r := range f.replies {
		if r.RequestID == id && r.Phase == phase {
			return r
		}
	}
	return apiv1.Reply{}
}

func (f *fakeSender) last(id string) apiv1.Reply {
	f.mu.Lock()
	defer f.mu.Unlock()
	var last apiv1.Reply
	for _, r := range append(f.replies[:len(f.replies):len(f.replies)], f.unrecorded...) {
		if r.RequestID == id {
			last = r
		}
	}
	return last
}

type fakeTracker struct {
	added map[string]map[string]pending.Want
}

func (f *fakeTracker) Add(id, _ string, want map[string]pending.Want, _ time.Time) {
	f.added[id] = want
}

type fakeScheduler struct {
	keys    []string
	deletes map[string]*int64
}

func (f *fakeScheduler) Enqueue(key string) { f.keys = append(f.keys, key) }
func (f *fakeScheduler) EnqueueDelete(key string, grace *int64) {
	f.keys = append(f.keys, key)
	f.deletes[key] = grace
}

type fakeEvents struct{ reasons []string }

func (f *fakeEvents) Event(_ *v1.Pod, _, reason, _ string) { f.reasons = append(f.reasons, reason) }
func (f *fakeEvents) ObjectEvent(_ v1.ObjectReference, _, reason, _ string) {
	f.reasons = append(f.reasons, reason)
}

type noStatus struct{}

func (noStatus) Get(string, string) (*v1.Pod, bool) { return nil, false }
func (noStatus) Terminating() []*v1.Pod             { return nil }

type rig struct {
	in     *Intake
	st     *store.Store
	sender *fakeSender
	track  *fakeTracker
	sched  *fakeScheduler
	events *fakeEvents
}

func newRig(t testing.TB) *rig {
	st, err := store.Open(filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	r := &rig{st: st, sender: &fakeSender{st: st}, track: &fakeTracker{added: map[string]map[string]pending.Want{}},
		sched: &fakeScheduler{deletes: map[string]*int64{}}, events: &fakeEvents{}}
	r.in = New(Options{Topics: apiv1.Scheme{Prefix: "mqlet/v1", Node: "n1"}, MaxPayloadBytes: 4096, Policy: validate.Policy{}, ApplyDeadline: time.Minute},
		st, r.sender, r.track, r.sched, r.events, noStatus{}, zerolog.Nop())
	return r
}

const webPod = `apiVersion: v1
kind: Pod
metadata: {name: web}
spec:
  containers:
  - {name: c, image: busybox:1}
`

func TestApplyStoresAcceptsAndSchedules(t *testing.T) {
	r := newRig(t)
	r.in.Handle(Command{Topic: "mqlet/v1/n1/cmd/apply/a1", Payload: []byte(webPod)})
	if got := r.sender.phases("a1"); strings.Join(got, ",") != "accepted,in_progress" {
		t.Fatalf("phases %v", got)
	}
	pod, err := r.st.Pod("default", "web")
	if err != nil {
		t.Fatalf("pod not stored before accepted: %v", err)
	}
	if pod.Spec.RestartPolicy != v1.RestartPolicyAlways || pod.Generation != 1 {
		t.Fatalf("stored pod not defaulted: %+v", pod.Spec.RestartPolicy)
	}
	if len(r.sched.keys) != 1 || r.sched.keys[0] != "default/web" {
		t.Fatalf("scheduled %v", r.sched.keys)
	}
	if w := r.track.added["a1"]["default/web"]; w.Generation != 1 || w.Gone {
		t.Fatalf("tracker want %+v", w)
	}
	if len(r.events.reasons) != 1 || r.events.reasons[0] != "Scheduled" {
		t.Fatalf("events %v", r.events.reasons)
	}
}

func TestRedeliveryIsAnsweredNotExecuted(t *testing.T) {
	r := newRig(t)
	r.in.Handle(Command{Topic: "mqlet/v1/n1/cmd/apply/a1", Payload: []byte(webPod)})
	r.in.Handle(Command{Topic: "mqlet/v1/n1/cmd/apply/a1", Payload: []byte(webPod)})
	if len(r.sender.resent) != 1 || len(r.sched.keys) != 1 {
		t.Fatalf("redelivery re-executed: resent=%v scheduled=%v", r.sender.resent, r.sched.keys)
	}
	// Without an id the same topic+payload derives the same id, and the
	// broker's redelivery (DUP) of it is answered from the record.
	r.in.Handle(Command{Topic: "mqlet/v1/n1/cmd/get", Payload: []byte(`{}`)})
	r.in.Handle(Command{Topic: "mqlet/v1/n1/cmd/get", Payload: []byte(`{}`), Duplicate: true})
	if len(r.sender.resent) != 2 {
		t.Fatalf("derived id not stable: resent=%v", r.sender.resent)
	}
}

// A request id is bound to the command that first used it: someone who
// publishes the operator's id first cannot have the operator's command
// answered from their record; it is refused loudly, the id's record stays,
// and the first command's redelivery is still answered from it.
func TestRequestIDBoundToItsCommand(t *testing.T) {
	r := newRig(t)
	r.in.Handle(Command{Topic: "mqlet/v1/n1/cmd/get/r7", Payload: []byte(`{}`)})
	if r.sender.last("r7").Phase != apiv1.Succeeded {
		t.Fatalf("first command: %+v", r.sender.last("r7"))
	}
	r.in.Handle(Command{Topic: "mqlet/v1/n1/cmd/apply/r7", Payload: []byte(webPod)})
	last := r.sender.last("r7")
	if last.Phase != apiv1.Failed || last.Message != MsgRequestIDReused || last.Verb != "apply" {
		t.Fatalf("another command under the id: %+v", last)
	}
	if len(r.sched.keys) != 0 {
		t.Fatalf("the refused command ran: %v", r.sched.keys)
	}
	if rec, ok, _ := r.st.LookupReply("r7"); !ok || !strings.Contains(string(rec), `"verb":"get"`) {
		t.Fatalf("the refusal replaced the record: %s", rec)
	}
	resent := len(r.sender.resent)
	r.in.Handle(Command{Topic: "mqlet/v1/n1/cmd/get/r7", Payload: []byte(`{}`), Duplicate: true})
	if len(r.sender.resent) != resent+1 {
		t.Fatal("the first command's redelivery was not answered from its record")
	}
	// The same payload on another verb's topic is another command too.
	r.in.Handle(Command{Topic: "mqlet/v1/n1/cmd/apply/r8", Payload: []byte(webPod)})
	r.in.Handle(Command{Topic: "mqlet/v1/n1/cmd/delete/r8", Payload: []byte(webPod)})
	if last := r.sender.last("r8"); last.Phase != apiv1.Failed || last.Message != MsgRequestIDReused {
		t.Fatalf("a delete under an apply's id: %+v", last)
	}
}

// A deliberate repeat of a command without a request id (no DUP flag) runs
// again: the same delete sent after the pod was applied again deletes it
// again, instead of being answered from the first delete's record.
func TestDeliberateRepeatWithoutARequestIDRuns(t *testing.T) {
	r := newRig(t)
	del := Command{Topic: "mqlet/v1/n1/cmd/delete", Payload: []byte(`{"kind":"Pod","name":"web"}`)}
	id := DeriveRequestID(del.Topic, del.Payload)
	r.in.Handle(Command{Topic: "mqlet/v1/n1/cmd/apply/a1", Payload: []byte(webPod)})
	r.in.Handle(del)
	if r.sender.last(id).Phase != apiv1.Accepted {
		t.Fatalf("first delete: %+v", r.sender.last(id))
	}
	r.in.Handle(Command{Topic: "mqlet/v1/n1/cmd/apply/a2", Payload: []byte(webPod)})
	r.in.Handle(del)
	if len(r.sender.resent) != 0 {
		t.Fatalf("the repeat was answered from the record: %v", r.sender.resent)
	}
	if _, err := r.st.Pod("default", "web"); err == nil {
		t.Fatal("the repeated delete did not run: the pod is still desired")
	}
	if got := r.sender.phases(id); strings.Join(got, ",") != "accepted,accepted" {
		t.Fatalf("phases of %s: %v", id, got)
	}
	// The broker's redelivery of the repeat is answered, not run.
	r.in.Handle(Command{Topic: "mqlet/v1/n1/cmd/apply/a3", Payload: []byte(webPod)})
	r.in.Handle(Command{Topic: del.Topic, Payload: del.Payload, Duplicate: true})
	if len(r.sender.resent) != 1 {
		t.Fatalf("the redelivery ran: resent %v", r.sender.resent)
	}
	if _, err := r.st.Pod("default", "web"); err != nil {
		t.Fatalf("the redelivery deleted the pod again: %v", err)
	}
}

func TestBadCommandsFailAndStoreNothing(t *testing.T) {
	cases := map[string]struct {
		topic, payload, want string
	}{
		"malformed":    {"apply/b1", "kind: Pod\nmetadata: [", "decoding manifest"},
		"invalid name": {"apply/b2", strings.Replace(webPod, "name: web", "name: Web", 1), "metadata.name"},
		"privileged":   {"apply/b3", "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  containers:\n  - name: c\n    image: i\n    securityContext: {privileged: true}\n", "privileged"},
		"oversized":    {"apply/b4", strings.Repeat("x", 5000), "exceeds the limit of 4096 bytes"},
		"bad id":       {"apply/a+b", webPod, "bad command topic"},
		"unsupported":  {"logs/b5", `{}`, "not supported by this mqlet"},
		"unknown verb": {"dance/b6", `{}`, "unknown verb"},
		"missing":      {"delete/b7", `{"kind":"Pod","name":"nope"}`, "not found"},
		"bad get":      {"get/b8", `{"kind":"Deployment"}`, "unknown kind"},
		"get selector": {"get/b9", `{"kind":"Pod","labelSelector":"app in (web"}`, `labelSelector "app in (web"`},
		"get involved": {"get/b10", `{"involvedObject":{"kind":"Pod","name":"web"}}`, `"involvedObject" is not supported yet`},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			r := newRig(t)
			r.in.Handle(Command{Topic: "mqlet/v1/n1/cmd/" + c.topic, Payload: []byte(c.payload)})
			var last apiv1.Reply
			for _, rep := range r.sender.replies {
				last = rep
			}
			if last.Phase != apiv1.Failed || !strings.Contains(last.Message, c.want) {
				t.Fatalf("want failed naming %q, got %+v", c.want, last)
			}
			if pods, _ := r.st.ListPods(); len(pods) != 0 {
				t.Fatal("a failed command stored a pod")
			}
		})
	}
}

func TestOneInvalidObjectRejectsTheWholeApply(t *testing.T) {
	r := newRig(t)
	list := `{"apiVersion":"v1","kind":"List","items":[
	 {"apiVersion":"v1","kind":"Pod","metadata":{"name":"ok"},"spec":{"containers":[{"name":"c","image":"i"}]}},
	 {"apiVersion":"v1","kind":"Pod","metadata":{"name":"bad"},"spec":{"hostNetwork":true,"containers":[{"name":"c","image":"i"}]}}]}`
	r.in.Handle(Command{Topic: "mqlet/v1/n1/cmd/apply/l1", Payload: []byte(list)})
	last := r.sender.last("l1")
	if last.Phase != apiv1.Failed || !strings.Contains(last.Message, "hostNetwork") || len(last.Errors) != 1 {
		t.Fatalf("reply %+v", last)
	}
	if pods, _ := r.st.ListPods(); len(pods) != 0 {
		t.Fatal("partial apply stored")
	}
}

func TestDeleteAndSyncSchedulePods(t *testing.T) {
	r := newRig(t)
	r.in.Handle(Command{Topic: "mqlet/v1/n1/cmd/apply/a1", Payload: []byte(webPod)})
	r.in.Handle(Command{Topic: "mqlet/v1/n1/cmd/delete/d1", Payload: []byte(`{"kind":"Pod","name":"web","gracePeriodSeconds":3}`)})
	if r.sender.last("d1").Phase != apiv1.Accepted {
		t.Fatalf("delete reply %+v", r.sender.last("d1"))
	}
	if g := r.sched.deletes["default/web"]; g == nil || *g != 3 {
		t.Fatalf("grace period not passed: %v", g)
	}
	if !r.track.added["d1"]["default/web"].Gone {
		t.Fatal("delete must wait for the pod to be gone")
	}
	r.in.Handle(Command{Topic: "mqlet/v1/n1/cmd/apply/a2", Payload: []byte(webPod)})
	r.in.Handle(Command{Topic: "mqlet/v1/n1/cmd/sync/s1", Payload: []byte(`{"apiVersion":"v1","kind":"List","items":[]}`)})
	if r.sender.last("s1").Phase != apiv1.InProgress || !r.track.added["s1"]["default/web"].Gone {
		t.Fatalf("sync to empty: %+v %+v", r.sender.last("s1"), r.track.added["s1"])
	}
	if pods, _ := r.st.ListPods(); len(pods) != 0 {
		t.Fatal("sync left pods")
	}
}

func TestGetNeverShowsSecretValues(t *testing.T) {
	r := newRig(t)
	r.in.Handle(Command{Topic: "mqlet/v1/n1/cmd/apply/s1", Payload: []byte(`{"apiVersion":"v1","kind":"Secret","metadata":{"name":"db"},"stringData":{"password":"sekrit-value"}}`)})
	r.in.Handle(Command{Topic: "mqlet/v1/n1/cmd/get/g1", Payload: []byte(`{"kind":"Secret"}`)})
	for _, rep := range r.sender.replies {
		b, _ := json.Marshal(rep)
		if strings.Contains(string(b), "sekrit") || strings.Contains(string(b), "c2Vrcml0") {
			t.Fatalf("secret value in reply %s", b)
		}
	}
	res, ok := r.sender.last("g1").Result.(apiv1.GetResult)
	if !ok || len(res.Secrets) != 1 {
		t.Fatalf("get result %+v", r.sender.last("g1"))
	}
}

func TestStatsAreSafeWhileCommandsArrive(t *testing.T) {
	r := newRig(t)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 50 {
			r.in.Stats()
		}
	}()
	for i := range 20 {
		r.in.Handle(Command{Topic: fmt.Sprintf("mqlet/v1/n1/cmd/get/s%d", i), Payload: []byte(`{}`)})
	}
	<-done
	if received, _ := r.in.Stats(); received != 20 {
		t.Fatalf("received %d, want 20", received)
	}
}
