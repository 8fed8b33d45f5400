package intake

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	apiruntime "k8s.io/apimachinery/pkg/runtime"

	"github.com/mqlet/mqlet/agent/inflight"
	"github.com/mqlet/mqlet/agent/store"
	"github.com/mqlet/mqlet/agent/validate"
	apiv1 "github.com/mqlet/mqlet/api/v1"
)

// hookStore calls onApply before storing, to look at the world mid-command
// or to blow up in it.
type hookStore struct {
	*store.Store
	onApply func()
}

func (h *hookStore) Apply(objs []apiruntime.Object) ([]store.Change, error) {
	if h.onApply != nil {
		h.onApply()
	}
	return h.Store.Apply(objs)
}

// newGuardedRig is newRig with a mark file, a hooked store and maxPods.
func newGuardedRig(t testing.TB, marksPath string, maxPods int) (*rig, *hookStore, *inflight.File) {
	r := newRig(t)
	marks, err := inflight.Open(marksPath, 1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { marks.Close() })
	hs := &hookStore{Store: r.st}
	r.in = New(Options{Topics: apiv1.Scheme{Prefix: "mqlet/v1", Node: "n1"}, MaxPayloadBytes: 1 << 20, Policy: validate.Policy{},
		ApplyDeadline: time.Minute, MaxPods: maxPods, Marks: marks},
		hs, r.sender, r.track, r.sched, r.events, noStatus{}, zerolog.Nop())
	return r, hs, marks
}

func decodeReply(t *testing.T, payload []byte) apiv1.Reply {
	t.Helper()
	var r apiv1.Reply
	if err := json.Unmarshal(payload, &r); err != nil {
		t.Fatalf("reply %s: %v", payload, err)
	}
	return r
}

func cmd(verb, id, payload string) Command {
	return Command{Topic: "mqlet/v1/n1/cmd/" + verb + "/" + id, Payload: []byte(payload)}
}

func TestRetainedCommandRefusedAndNotRecorded(t *testing.T) {
	r := newRig(t)
	c := cmd("apply", "ret1", webPod)
	c.Retained = true
	r.in.Handle(c)
	if len(r.sender.replies) != 0 || len(r.sender.resent) != 1 || r.sender.resent[0] != "ret1" {
		t.Fatalf("retained: recorded %+v, published %v; want one unrecorded failed reply", r.sender.replies, r.sender.resent)
	}
	if pods, _ := r.st.ListPods(); len(pods) != 0 {
		t.Fatal("a retained command was executed")
	}
	if _, ok, _ := r.st.LookupReply("ret1"); ok {
		t.Fatal("a retained command's id was recorded as handled")
	}
	// The same id without the retain flag runs.
	c.Retained = false
	r.in.Handle(c)
	if got := r.sender.phases("ret1"); strings.Join(got, ",") != "accepted,in_progress" {
		t.Fatalf("non-retained publish after a refused retained one: %v", got)
	}
	// Its retained replay now gets the recorded answer, not a refusal
	// that would contradict it, and runs nothing.
	c.Retained = true
	r.in.Handle(c)
	if len(r.sender.replies) != 2 || len(r.sender.resent) != 2 || len(r.sched.keys) != 1 {
		t.Fatalf("replay of a handled retained command: replies %d resent %v scheduled %v", len(r.sender.replies), r.sender.resent, r.sched.keys)
	}
	if n := strings.Count(strings.Join(r.events.reasons, ","), ReasonRetainedCommand); n != 2 {
		t.Fatalf("%d RetainedCommand events, want one per retained delivery", n)
	}
}

// TestEmptyMessageDoesNotUseTheRequestID: clearing a retained command
// publishes an empty message on its topic, which arrives as a live message.
func TestEmptyMessageDoesNotUseTheRequestID(t *testing.T) {
	r := newRig(t)
	r.in.Handle(cmd("apply", "e1", ""))
	if len(r.sender.replies) != 0 || len(r.sender.resent) != 1 {
		t.Fatalf("empty apply: recorded %+v, published %v", r.sender.replies, r.sender.resent)
	}
	r.in.Handle(cmd("apply", "e1", webPod))
	if got := r.sender.phases("e1"); strings.Join(got, ",") != "accepted,in_progress" {
		t.Fatalf("apply after the empty message: %v", got)
	}
	// get takes an empty payload.
	r.in.Handle(cmd("get", "g1", ""))
	if r.sender.last("g1").Phase != apiv1.Succeeded {
		t.Fatalf("empty get: %+v", r.sender.last("g1"))
	}
}

func TestRetainedRefusalMessage(t *testing.T) {
	var got apiv1.Reply
	r := newRig(t)
	r.sender.onResend = func(p []byte) { got = decodeReply(t, p) }
	r.in.Handle(Command{Topic: "mqlet/v1/n1/cmd/get/g1", Payload: []byte(`{}`), Retained: true})
	if got.Phase != apiv1.Failed || got.Message != MsgRetainedRefused || got.TS.IsZero() {
		t.Fatalf("refusal %+v", got)
	}
}

// TestCommandIsMarkedInFlightWhileHandled reads the mark file, as the next
// process would, from inside the command's store write.
func TestCommandIsMarkedInFlightWhileHandled(t *testing.T) {
	path := filepath.Join(t.TempDir(), "marks")
	r, hs, _ := newGuardedRig(t, path, 0)
	var during []string
	hs.onApply = func() {
		f, err := inflight.Open(path, 1)
		if err != nil {
			t.Error(err)
			return
		}
		during = f.Left()
		_ = f.Close()
	}
	r.in.Handle(cmd("apply", "m1", webPod))
	after, err := inflight.Open(path, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer after.Close()
	if !slices.Equal(during, []string{"apply m1"}) || len(after.Left()) != 0 {
		t.Fatalf("mark during the command %q, after %q", during, after.Left())
	}
}

// TestCommandThatStoppedTheAgentIsNotRunAgain simulates the crash: the mark
// is written, the process "dies" (the file is reopened without clearing),
// the next intake recovers, and the broker's redelivery is answered from
// the record without running.
func TestCommandThatStoppedTheAgentIsNotRunAgain(t *testing.T) {
	path := filepath.Join(t.TempDir(), "marks")
	crashed, err := inflight.Open(path, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := crashed.Set(0, "apply poison-1"); err != nil {
		t.Fatal(err)
	}
	_ = crashed.Close()

	r, hs, marks := newGuardedRig(t, path, 0)
	ran := false
	hs.onApply = func() { ran = true }
	r.in.Recover(marks.Left())
	last := r.sender.last("poison-1")
	if last.Phase != apiv1.Failed || last.Message != MsgStoppedAgent {
		t.Fatalf("recovered command answered %+v", last)
	}
	if !slices.Contains(r.events.reasons, ReasonCommandStoppedAgent) {
		t.Fatalf("events %v", r.events.reasons)
	}
	r.in.Handle(cmd("apply", "poison-1", webPod)) // the redelivery
	if ran || len(r.sender.resent) != 1 {
		t.Fatalf("redelivered poison: ran=%v resent=%v", ran, r.sender.resent)
	}
	// A command that had been answered keeps its reply.
	r.in.Handle(cmd("apply", "fine-1", webPod))
	before := len(r.sender.replies)
	r.in.Recover([]string{"apply fine-1", "garbage"})
	if len(r.sender.replies) != before || r.sender.last("fine-1").Phase != apiv1.InProgress {
		t.Fatalf("an answered command was re-answered: %+v", r.sender.last("fine-1"))
	}
}

func TestPanicInAHandlerIsAnsweredAndSurvived(t *testing.T) {
	path := filepath.Join(t.TempDir(), "marks")
	r, hs, _ := newGuardedRig(t, path, 0)
	hs.onApply = func() { panic("boom") }
	r.in.Handle(cmd("apply", "p1", webPod))
	if last := r.sender.last("p1"); last.Phase != apiv1.Failed || last.Message != MsgInternalError {
		t.Fatalf("panicking command answered %+v", last)
	}
	if !slices.Contains(r.events.reasons, ReasonCommandPanicked) {
		t.Fatalf("events %v", r.events.reasons)
	}
	f, err := inflight.Open(path, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if len(f.Left()) != 0 {
		t.Fatalf("mark left after a recovered panic: %q", f.Left())
	}
	hs.onApply = nil
	r.in.Handle(cmd("apply", "p2", webPod))
	if got := r.sender.phases("p2"); strings.Join(got, ",") != "accepted,in_progress" {
		t.Fatalf("next command after a panic: %v", got)
	}
}

func TestAliasBombAnsweredFailed(t *testing.T) {
	r, _, _ := newGuardedRig(t, filepath.Join(t.TempDir(), "marks"), 0)
	var b strings.Builder
	b.WriteString("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: bomb}\ndata:\n  a: &a \"" + strings.Repeat("x", 256<<10) + "\"\n  b: [")
	for b.Len() < 700_000 {
		b.WriteString("*a, ")
	}
	b.WriteString("*a]\n")
	r.in.Handle(cmd("apply", "bomb", b.String()))
	if last := r.sender.last("bomb"); last.Phase != apiv1.Failed || !strings.Contains(last.Message, "expands to more than 4194304 bytes") {
		t.Fatalf("bomb answered %+v", last)
	}
	r.in.Handle(cmd("sync", "bomb-sync", b.String()))
	if last := r.sender.last("bomb-sync"); last.Phase != apiv1.Failed || !strings.Contains(last.Message, "expands") {
		t.Fatalf("bomb as sync answered %+v", last)
	}
}

func invalidPodList(n int) string {
	var b strings.Builder
	b.WriteString(`{"apiVersion":"v1","kind":"List","items":[`)
	for i := range n {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"Bad%d"},"spec":{"containers":[{"name":"c","image":"i"}]}}`, i)
	}
	b.WriteString("]}")
	return b.String()
}

func TestOneEventPerRejectedCommand(t *testing.T) {
	r, _, _ := newGuardedRig(t, filepath.Join(t.TempDir(), "marks"), 0)
	r.in.Handle(cmd("apply", "many", invalidPodList(200)))
	last := r.sender.last("many")
	if last.Phase != apiv1.Failed || len(last.Errors) != 200 || !strings.Contains(last.Message, "200 object(s) rejected") || !strings.Contains(last.Message, "and 195 more") {
		t.Fatalf("reply: %s (%d errors)", last.Message, len(last.Errors))
	}
	if len(r.events.reasons) != 1 || r.events.reasons[0] != ReasonFailedValidation {
		t.Fatalf("%d events for one rejected command: %v", len(r.events.reasons), r.events.reasons[:min(5, len(r.events.reasons))])
	}
}

func podNamed(name string) string {
	return strings.Replace(webPod, "name: web}", "name: "+name+"}", 1)
}

// TestMaxPodsFullNode is the default capacity: 110 pods stored, the 111th
// refused with the kubelet's wording, updates and a sync that stays within
// the capacity accepted.
func TestMaxPodsFullNode(t *testing.T) {
	r, _, _ := newGuardedRig(t, filepath.Join(t.TempDir(), "marks"), 110)
	var list strings.Builder
	list.WriteString(`{"apiVersion":"v1","kind":"List","items":[`)
	for i := range 110 {
		if i > 0 {
			list.WriteString(",")
		}
		fmt.Fprintf(&list, `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p%d"},"spec":{"containers":[{"name":"c","image":"i"}]}}`, i)
	}
	list.WriteString("]}")
	r.in.Handle(cmd("apply", "fill", list.String()))
	if got := r.sender.last("fill").Phase; got != apiv1.InProgress {
		t.Fatalf("110 pods: %+v", r.sender.last("fill"))
	}
	r.in.Handle(cmd("apply", "one-more", podNamed("p110")))
	last := r.sender.last("one-more")
	want := "OutOfpods: Node didn't have enough resource: pods, requested: 1, used: 110, capacity: 110"
	if last.Phase != apiv1.Failed || !strings.HasPrefix(last.Message, want) {
		t.Fatalf("111th pod: %q, want prefix %q", last.Message, want)
	}
	if !slices.Contains(r.events.reasons, ReasonOutOfPods) {
		t.Fatalf("events %v", r.events.reasons)
	}
	if pods, _ := r.st.ListPods(); len(pods) != 110 {
		t.Fatalf("%d pods stored", len(pods))
	}
	// Updating a stored pod needs no room.
	r.in.Handle(cmd("apply", "update", strings.Replace(podNamed("p5"), "busybox:1", "busybox:2", 1)))
	if got := r.sender.last("update").Phase; got != apiv1.InProgress {
		t.Fatalf("update at capacity: %+v", r.sender.last("update"))
	}
	// A sync replacing everything by 110 other pods fits; 111 does not.
	r.in.Handle(cmd("sync", "sync-110", strings.ReplaceAll(list.String(), `"name":"p`, `"name":"q`)))
	if got := r.sender.last("sync-110").Phase; got != apiv1.InProgress {
		t.Fatalf("sync of 110 new pods: %+v", r.sender.last("sync-110"))
	}
}

func TestClientUIDRefusedNamingTheField(t *testing.T) {
	r := newRig(t)
	r.in.Handle(cmd("apply", "u1", strings.Replace(webPod, "{name: web}", "{name: web, uid: ../../x}", 1)))
	last := r.sender.last("u1")
	if last.Phase != apiv1.Failed || !strings.Contains(last.Message, "metadata.uid") || !strings.Contains(last.Message, "not a UUID") {
		t.Fatalf("uid ../../x answered %+v", last)
	}
	if pods, _ := r.st.ListPods(); len(pods) != 0 {
		t.Fatal("stored a pod with a bad uid")
	}
}

// BenchmarkHandleWithMarks measures a get command (which records its reply
// in bbolt) with and without the in-flight mark, to show the mark's share.
func BenchmarkHandleWithMarks(b *testing.B) {
	for _, marked := range []bool{false, true} {
		b.Run(fmt.Sprintf("marked=%v", marked), func(b *testing.B) {
			r, _, marks := newGuardedRig(b, filepath.Join(b.TempDir(), "marks"), 0)
			if !marked {
				r.in.opts.Marks = nil
			} else if marks == nil {
				b.Fatal("no marks")
			}
			i := 0
			for b.Loop() {
				i++
				r.in.Handle(cmd("get", fmt.Sprintf("g%d", i), `{"kind":"Pod"}`))
			}
		})
	}
}

// A command without a request id that stopped the agent is not run again
// when it is sent again without the DUP flag: a repeat of other commands
// runs, but this one would crash the agent a second time.
func TestPoisonWithoutARequestIDIsNotRunOnARepeat(t *testing.T) {
	path := filepath.Join(t.TempDir(), "marks")
	topic := "mqlet/v1/n1/cmd/apply"
	id := DeriveRequestID(topic, []byte(webPod))
	crashed, err := inflight.Open(path, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := crashed.Set(0, "apply "+id); err != nil {
		t.Fatal(err)
	}
	_ = crashed.Close()
	r, hs, marks := newGuardedRig(t, path, 0)
	ran := false
	hs.onApply = func() { ran = true }
	r.in.Recover(marks.Left())
	r.in.Handle(Command{Topic: topic, Payload: []byte(webPod)})
	if ran || len(r.sender.resent) != 1 || r.sender.last(id).Message != MsgStoppedAgent {
		t.Fatalf("repeat of a poison command: ran=%v resent=%v last=%+v", ran, r.sender.resent, r.sender.last(id))
	}
}
