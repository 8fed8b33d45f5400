package intake

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/mqlet/mqlet/agent/pending"
	"github.com/mqlet/mqlet/agent/reply"
	"github.com/mqlet/mqlet/agent/store"
	apiv1 "github.com/mqlet/mqlet/api/v1"
)

// orderTracker records the requests added, in order.
type orderTracker struct {
	ids   []string
	wants []map[string]pending.Want
}

func (o *orderTracker) Add(id, _ string, want map[string]pending.Want, _ time.Time) {
	o.ids = append(o.ids, id)
	o.wants = append(o.wants, want)
}

func pendingEntry(t *testing.T, st *store.Store, id string) (store.PendingReply, bool) {
	t.Helper()
	entries, err := st.ListPending()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range entries {
		if p.RequestID == id {
			return p, true
		}
	}
	return store.PendingReply{}, false
}

// The tracker's final reply is kept with its pending entry in the store
// transaction that records it, queued under the entry's once-key, and the
// entry dropped by the next store transaction; a reply that is not final
// leaves the entry as it is.
func TestGroupQueuesFinalRepliesOnce(t *testing.T) {
	st, err := store.Open(filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	box := &recordingBox{}
	g := NewGroup(st, box, zerolog.Nop())
	topics := apiv1.Scheme{Prefix: "mqlet/v1", Node: "n1"}
	finals := g.Finals(reply.NewSender(topics, nil, nil, nil, zerolog.Nop()))
	if err := st.PutPending(store.PendingReply{RequestID: "r1", Verb: "apply", Want: map[string]store.PendingWant{"default/web": {Generation: 1}}}); err != nil {
		t.Fatal(err)
	}

	_ = finals.Send(apiv1.Reply{RequestID: "r1", Verb: "apply", Phase: apiv1.InProgress, Message: "waiting"})
	g.Flush()
	if p, ok := pendingEntry(t, st, "r1"); !ok || p.Decided() {
		t.Fatalf("after in_progress: entry %+v (found %v), want it undecided", p, ok)
	}

	_ = finals.Send(apiv1.Reply{RequestID: "r1", Verb: "apply", Phase: apiv1.Succeeded, Message: "default/web: running"})
	g.Flush()
	p, ok := pendingEntry(t, st, "r1")
	if !ok || !p.Decided() {
		t.Fatalf("after the final reply: entry %+v (found %v), want it decided until the next transaction", p, ok)
	}
	box.mu.Lock()
	last := box.msgs[len(box.msgs)-1]
	box.mu.Unlock()
	if last.Once != p.OnceKey() || string(last.Payload) != string(p.FinalPayload) || last.Topic != p.FinalTopic {
		t.Fatalf("queued %+v, want the entry's final reply under %s", last, p.OnceKey())
	}
	if rec, ok, _ := st.LookupReply("r1"); !ok || !containsPhase(rec, apiv1.Succeeded) {
		t.Fatalf("record %s, want the final reply", rec)
	}

	_ = finals.Send(apiv1.Reply{RequestID: "other", Verb: "apply", Phase: apiv1.Failed, Message: "no entry"})
	g.Flush()
	if _, ok := pendingEntry(t, st, "r1"); ok {
		t.Fatal("the entry of a queued final reply outlived the next store transaction")
	}
}

func containsPhase(rec []byte, phase string) bool {
	r, err := apiv1.DecodeReply(rec)
	return err == nil && r.Phase == phase
}

// At start a decided entry's reply is queued again under its once-key and
// the entry dropped; the others go to the tracker in acceptance order, and
// their pods are returned for the workers.
func TestRestorePending(t *testing.T) {
	st, err := store.Open(filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for _, p := range []store.PendingReply{
		{RequestID: "late", Verb: "apply", Want: map[string]store.PendingWant{"ns/b": {Generation: 3}}},
		{RequestID: "done", Verb: "apply", Want: map[string]store.PendingWant{"ns/c": {Generation: 1}}},
		{RequestID: "early", Verb: "delete", Want: map[string]store.PendingWant{"ns/a": {Gone: true}}},
	} {
		if err := st.PutPending(p); err != nil {
			t.Fatal(err)
		}
	}
	err = st.Batch(func(tx *store.Tx) error {
		_, _, err := tx.DecidePending("done", "mqlet/v1/n1/reply/done", []byte(`{"phase":"succeeded"}`))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	done, _ := pendingEntry(t, st, "done")
	box := &recordingBox{}
	g := NewGroup(st, box, zerolog.Nop())
	tr := &orderTracker{}
	keys, err := g.RestorePending(st, tr)
	if err != nil {
		t.Fatal(err)
	}
	if len(tr.ids) != 2 || tr.ids[0] != "late" || tr.ids[1] != "early" || tr.wants[1]["ns/a"] != (pending.Want{Gone: true}) {
		t.Fatalf("tracker got %v %v, want late then early", tr.ids, tr.wants)
	}
	if len(keys) != 2 || keys[0] != "ns/a" || keys[1] != "ns/b" {
		t.Fatalf("keys %v", keys)
	}
	if len(box.msgs) != 1 || box.msgs[0].Once != done.OnceKey() || box.msgs[0].Topic != "mqlet/v1/n1/reply/done" || !box.msgs[0].Final {
		t.Fatalf("queued %+v, want the decided reply under its once-key, marked final", box.msgs)
	}
	if _, ok := pendingEntry(t, st, "done"); ok {
		t.Fatal("the decided entry was kept after its reply was queued")
	}
	if _, ok := pendingEntry(t, st, "late"); !ok {
		t.Fatal("an undecided entry was dropped at restore")
	}
}

// A deadline the tracker moves (a delete waiting out a grace period) is
// written to the pending entry with the next flush, so a restart follows
// the request until then.
func TestGroupKeepsAMovedDeadline(t *testing.T) {
	st, err := store.Open(filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	g := NewGroup(st, &recordingBox{}, zerolog.Nop())
	finals := g.Finals(reply.NewSender(apiv1.Scheme{Prefix: "mqlet/v1", Node: "n1"}, nil, nil, nil, zerolog.Nop()))
	first := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	if err := st.PutPending(store.PendingReply{RequestID: "d1", Verb: "delete", Deadline: first, Want: map[string]store.PendingWant{"ns/slow": {Gone: true}}}); err != nil {
		t.Fatal(err)
	}
	moved := first.Add(2 * time.Minute)
	finals.KeepDeadline("d1", moved)
	finals.KeepDeadline("nobody", moved) // no entry: nothing written
	_ = finals.Send(apiv1.Reply{RequestID: "d1", Verb: "delete", Phase: apiv1.InProgress, Message: "terminating"})
	g.Flush()
	p, ok := pendingEntry(t, st, "d1")
	if !ok || !p.Deadline.Equal(moved) || p.Want["ns/slow"] != (store.PendingWant{Gone: true}) || p.Decided() {
		t.Fatalf("entry %+v (found %v), want the moved deadline %v and the rest as it was", p, ok, moved)
	}
	if _, ok := pendingEntry(t, st, "nobody"); ok {
		t.Fatal("a moved deadline created an entry")
	}
}
