package store

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"
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
