package outbox

import (
	"fmt"
	"path/filepath"
	"testing"

	bolt "go.etcd.io/bbolt"
)

// A message put under a Once name is stored once: put again before or
// after it was sent, nothing is added.
func TestOncePutsAtMostOnce(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ob.db")
	o := openTest(t, path, 0)
	final := Message{Topic: "n/reply/r1", Payload: []byte("succeeded"), QoS: 1, Once: "final/1/r1"}
	mustPut(t, o, final)
	if err := o.PutBatch([]Message{event(1), final}); err != nil {
		t.Fatal(err)
	}
	if d := o.Stats().Depth; d != 2 {
		t.Fatalf("depth %d after putting the final twice and an event, want 2", d)
	}
	pub := newFakePublisher(true)
	runOutbox(t, o, pub)
	pub.connect()
	waitUntil(t, "outbox drained", func() bool { return o.Stats().Depth == 0 })
	mustPut(t, o, final) // after it was sent
	if d := o.Stats().Depth; d != 0 {
		t.Fatalf("the final was stored again after it was sent (depth %d)", d)
	}
	if got := pub.sentTopicsPayloads(); fmt.Sprint(got) != fmt.Sprint([]string{"n/reply/r1=succeeded", "n/events=e1"}) {
		t.Fatalf("sent %v", got)
	}
}

// The names outlive a reopen (a kill); the oldest are forgotten beyond the
// bound.
func TestOnceNamesAreBounded(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ob.db")
	o := openTest(t, path, 0)
	mustPut(t, o, Message{Topic: "n/reply", Payload: []byte("x"), QoS: 1, Once: "kept"})
	o.Close()
	o = openTest(t, path, 0)
	defer o.Close()
	mustPut(t, o, Message{Topic: "n/reply", Payload: []byte("x"), QoS: 1, Once: "kept"})
	if d := o.Stats().Depth; d != 1 {
		t.Fatalf("depth %d: a name was forgotten across a reopen", d)
	}
	o.maxOnce = 3
	named := func(i int) Message {
		return Message{Topic: "n/reply", Payload: []byte{byte(i)}, QoS: 1, Once: fmt.Sprint("final/", i)}
	}
	for i := 1; i <= 5; i++ {
		mustPut(t, o, named(i))
	}
	for i := 1; i <= 5; i++ {
		mustPut(t, o, named(i))
	}
	// 1 and 2 were forgotten when 4 and 5 came: they are stored again
	// (and then push 3 and 4 out, which are stored again too, and so on).
	if d := o.Stats().Depth; d <= 6 {
		t.Fatalf("depth %d: forgotten names were not stored again", d)
	}
	var names int
	_ = o.db.View(func(tx *bolt.Tx) error {
		names = tx.Bucket(bucketOnce).Stats().KeyN
		if n := tx.Bucket(bucketOnceAge).Stats().KeyN; n != names {
			t.Errorf("%d names, %d in the age index", names, n)
		}
		return nil
	})
	if names != 3 {
		t.Fatalf("%d names remembered, want 3", names)
	}
}
