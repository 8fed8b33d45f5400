package store

import (
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

func TestRepliesBoundedOldestFirst(t *testing.T) {
	c := &clock{now: time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC)}
	s := openTest(t, filepath.Join(t.TempDir(), "s.db"), Options{MaxReplies: 3, Now: c.Now})
	for i := 1; i <= 5; i++ {
		if err := s.RecordReply(fmt.Sprintf("r%d", i), []byte(fmt.Sprint(i)), c.Now().Add(time.Duration(i)*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	// Re-recording an existing id does not grow the count and refreshes it.
	if err := s.RecordReply("r3", []byte("3b"), c.Now().Add(10*time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := s.RecordReply("r6", []byte("6"), c.Now().Add(11*time.Second)); err != nil {
		t.Fatal(err)
	}
	if n, _ := s.ReplyCount(); n != 3 {
		t.Fatalf("count %d, want 3", n)
	}
	for id, want := range map[string]string{"r1": "", "r2": "", "r4": "", "r5": "5", "r3": "3b", "r6": "6"} {
		got, ok, err := s.LookupReply(id)
		if err != nil {
			t.Fatal(err)
		}
		if ok != (want != "") || string(got) != want {
			t.Errorf("%s: %q %v, want %q", id, got, ok, want)
		}
	}
}

func TestRepliesExpire(t *testing.T) {
	c := &clock{now: time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC)}
	s := openTest(t, filepath.Join(t.TempDir(), "s.db"), Options{Now: c.Now})
	start := c.Now()
	if err := s.RecordReply("old", []byte("o"), start); err != nil {
		t.Fatal(err)
	}
	if err := s.RecordReply("new", []byte("n"), start.Add(23*time.Hour)); err != nil {
		t.Fatal(err)
	}
	c.Advance(24*time.Hour + time.Second)
	if _, ok, _ := s.LookupReply("old"); ok {
		t.Fatal("a reply older than 24h was returned")
	}
	if _, ok, _ := s.LookupReply("new"); !ok {
		t.Fatal("a fresh reply was not returned")
	}
	n, err := s.PruneReplies(c.Now())
	if err != nil || n != 1 {
		t.Fatalf("PruneReplies = %d, %v", n, err)
	}
	if cnt, _ := s.ReplyCount(); cnt != 1 {
		t.Fatalf("count after prune %d", cnt)
	}
	if n, _ := s.PruneReplies(c.Now().Add(24 * time.Hour)); n != 1 {
		t.Fatalf("second prune dropped %d", n)
	}
	if err := s.RecordReply("", nil, c.Now()); err == nil {
		t.Fatal("empty request id accepted")
	}
}

func TestMetaAndSeq(t *testing.T) {
	s, _ := newStore(t)
	if _, ok, _ := s.Meta("x"); ok {
		t.Fatal("missing meta found")
	}
	if err := s.SetMeta("x", []byte("1")); err != nil {
		t.Fatal(err)
	}
	if v, ok, _ := s.Meta("x"); !ok || string(v) != "1" {
		t.Fatalf("meta %q %v", v, ok)
	}
	if err := s.SetMeta("x", nil); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := s.Meta("x"); ok {
		t.Fatal("deleted meta found")
	}
	for want := uint64(1); want <= 3; want++ {
		if n, err := s.NextSeq(); err != nil || n != want {
			t.Fatalf("NextSeq = %d, %v, want %d", n, err, want)
		}
	}
}

func TestRepliesBoundedByBytes(t *testing.T) {
	c := &clock{now: time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC)}
	const bound = 10_000
	s := openTest(t, filepath.Join(t.TempDir(), "s.db"), Options{MaxReplyBytes: bound, Now: c.Now})
	big := make([]byte, 3000)
	for i := 1; i <= 10; i++ {
		if err := s.RecordReply(fmt.Sprintf("r%d", i), big, c.Now().Add(time.Duration(i)*time.Second)); err != nil {
			t.Fatal(err)
		}
		if n, err := s.ReplyBytes(); err != nil || n > bound {
			t.Fatalf("after %d records: %d bytes (%v), bound %d", i, n, err, bound)
		}
	}
	// Three records of ~3 KB fit in 10 KB: the newest three are kept.
	if n, _ := s.ReplyCount(); n != 3 {
		t.Fatalf("count %d, want 3", n)
	}
	for i := 1; i <= 10; i++ {
		_, ok, _ := s.LookupReply(fmt.Sprintf("r%d", i))
		if ok != (i >= 8) {
			t.Errorf("r%d kept=%v", i, ok)
		}
	}
	// One reply larger than the whole bound is refused and evicts nothing.
	if err := s.RecordReply("huge", make([]byte, bound), c.Now()); !errors.Is(err, ErrRecordTooLarge) {
		t.Fatalf("huge record: %v, want ErrRecordTooLarge", err)
	}
	if n, _ := s.ReplyCount(); n != 3 {
		t.Fatalf("count after refused record %d, want 3", n)
	}
	// Pruning keeps the byte total right.
	c.Advance(48 * time.Hour)
	if _, err := s.PruneReplies(c.Now()); err != nil {
		t.Fatal(err)
	}
	if n, _ := s.ReplyBytes(); n != 0 {
		t.Fatalf("bytes after pruning everything: %d", n)
	}
}

func TestBatchSeesItsOwnWritesAndRollsBack(t *testing.T) {
	s := openTest(t, filepath.Join(t.TempDir(), "s.db"), Options{})
	cm := func(name string) []runtime.Object {
		return []runtime.Object{&v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: map[string]string{"k": "v"}}}
	}
	err := s.Batch(func(tx *Tx) error {
		if _, err := tx.Apply(cm("a")); err != nil {
			return err
		}
		if err := tx.RecordReply("r1", []byte("one"), time.Now()); err != nil {
			return err
		}
		got, ok, err := tx.LookupReply("r1")
		if err != nil || !ok || string(got) != "one" {
			t.Errorf("in-batch lookup: %q %v %v", got, ok, err)
		}
		cms, err := tx.ListConfigMaps()
		if err != nil || len(cms) != 1 {
			t.Errorf("in-batch list: %d %v", len(cms), err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.ConfigMap("default", "a"); err != nil {
		t.Fatalf("committed configmap: %v", err)
	}
	// A failed write marks the transaction; returning an error undoes all of it.
	err = s.Batch(func(tx *Tx) error {
		if _, err := tx.Apply(cm("b")); err != nil {
			return err
		}
		dup := append(cm("c"), cm("c")...)
		if _, err := tx.Apply(dup); err == nil {
			t.Error("a duplicated object was accepted")
		}
		if tx.Failed() == nil {
			t.Error("the failed write did not mark the transaction")
		}
		return tx.Failed()
	})
	if err == nil {
		t.Fatal("batch with a failed write committed")
	}
	for _, name := range []string{"b", "c"} {
		if _, err := s.ConfigMap("default", name); !errors.Is(err, ErrNotFound) {
			t.Errorf("configmap %s after rollback: %v", name, err)
		}
	}
}

// A secret written or removed in a batch moves SecretsVersion once the batch
// is committed (the scrubber of secret values rebuilds on it); a batch that
// touches no secret, or is undone, leaves it.
func TestBatchMovesSecretsVersion(t *testing.T) {
	s := openTest(t, filepath.Join(t.TempDir(), "s.db"), Options{})
	secret := []runtime.Object{&v1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "pw"}, StringData: map[string]string{"p": "value-1"}}}
	cm := []runtime.Object{&v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "c"}, Data: map[string]string{"k": "v"}}}
	v0 := s.SecretsVersion()
	if err := s.Batch(func(tx *Tx) error { _, err := tx.Apply(cm); return err }); err != nil {
		t.Fatal(err)
	}
	if s.SecretsVersion() != v0 {
		t.Fatal("a batch without secrets moved SecretsVersion")
	}
	if err := s.Batch(func(tx *Tx) error { _, err := tx.Apply(secret); return err }); err != nil {
		t.Fatal(err)
	}
	v1 := s.SecretsVersion()
	if v1 == v0 {
		t.Fatal("storing a secret in a batch did not move SecretsVersion")
	}
	if err := s.Batch(func(tx *Tx) error { _, err := tx.Delete(KindSecret, "default", "pw"); return err }); err != nil {
		t.Fatal(err)
	}
	if s.SecretsVersion() == v1 {
		t.Fatal("deleting a secret in a batch did not move SecretsVersion")
	}
}
