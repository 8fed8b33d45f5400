package store

import (
	"path/filepath"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

func pendingIDs(t *testing.T, s *Store) []string {
	t.Helper()
	entries, err := s.ListPending()
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, p := range entries {
		ids = append(ids, p.RequestID)
	}
	return ids
}

// A pending reply is written in the batch that stores its command, listed
// in the order of acceptance, decided in a later transaction, and dropped
// only under the sequence it was decided with.
func TestPendingRepliesLifecycle(t *testing.T) {
	s := openTest(t, filepath.Join(t.TempDir(), "state.db"), Options{})
	deadline := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	err := s.Batch(func(tx *Tx) error {
		for _, id := range []string{"z", "a", "m"} {
			if err := tx.PutPending(PendingReply{RequestID: id, Verb: "apply", Deadline: deadline,
				Want: map[string]PendingWant{"ns/" + id: {Generation: 2}}}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := pendingIDs(t, s); len(got) != 3 || got[0] != "z" || got[1] != "a" || got[2] != "m" {
		t.Fatalf("pending %v, want z a m (acceptance order)", got)
	}
	entries, _ := s.ListPending()
	if p := entries[1]; p.Verb != "apply" || !p.Deadline.Equal(deadline) || p.Want["ns/a"] != (PendingWant{Generation: 2}) || p.Decided() {
		t.Fatalf("entry a read back as %+v", p)
	}

	var decided PendingReply
	err = s.Batch(func(tx *Tx) error {
		var found bool
		var err error
		decided, found, err = tx.DecidePending("a", "t/reply/a", []byte(`{"phase":"succeeded"}`))
		if err != nil || !found {
			t.Fatalf("DecidePending: %v %v", found, err)
		}
		_, found, err = tx.DecidePending("nobody", "t", nil)
		if err != nil || found {
			t.Fatalf("DecidePending of a request without entry: %v %v", found, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	entries, _ = s.ListPending()
	if p := entries[1]; !p.Decided() || p.FinalTopic != "t/reply/a" || string(p.FinalPayload) != `{"phase":"succeeded"}` || p.OnceKey() != decided.OnceKey() {
		t.Fatalf("decided entry %+v (once %s)", p, decided.OnceKey())
	}

	// The same id accepted again (a command without an id, repeated) is a
	// new entry: dropping the old one's sequence keeps it.
	if err := s.PutPending(PendingReply{RequestID: "a", Verb: "apply", Deadline: deadline}); err != nil {
		t.Fatal(err)
	}
	if err := s.DropPending(map[string]uint64{"a": decided.Seq, "z": entries[0].Seq}); err != nil {
		t.Fatal(err)
	}
	if got := pendingIDs(t, s); len(got) != 2 || got[0] != "m" || got[1] != "a" {
		t.Fatalf("pending %v after the drop, want m and the new a", got)
	}
}

// A store of schema 2 (no pending-replies bucket) opens: it is backed up
// and given the bucket.
func TestSchema2StoreGetsPendingReplies(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		for _, name := range [][]byte{bucketPods, bucketConfigMaps, bucketSecrets, bucketReplies, bucketReplyIndex, bucketMeta, bucketSeq, bucketQuarantine} {
			if _, err := tx.CreateBucket(name); err != nil {
				return err
			}
		}
		return tx.Bucket(bucketMeta).Put(schemaKey, []byte("2"))
	})
	if err != nil {
		t.Fatal(err)
	}
	db.Close()
	s := openTest(t, path, Options{})
	if m := s.Schema(); m.From != 2 || m.To != SchemaVersion || m.Backup != path+".schema-2.bak" {
		t.Fatalf("Schema() = %+v", m)
	}
	if err := s.PutPending(PendingReply{RequestID: "r", Verb: "delete"}); err != nil {
		t.Fatalf("pending reply in a migrated store: %v", err)
	}
	if got := pendingIDs(t, s); len(got) != 1 {
		t.Fatalf("pending %v", got)
	}
}
