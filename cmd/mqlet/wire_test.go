package main

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/mqlet/mqlet/agent/store"
	"github.com/mqlet/mqlet/config"
)

// requests.maxRecords and requests.ttl bound the reply records the store
// keeps: the oldest go beyond maxRecords, and a record older than ttl no
// longer answers a redelivery.
func TestRequestsSettingsBoundTheReplyRecords(t *testing.T) {
	cfg := config.Default()
	cfg.Requests.MaxRecords = 3
	cfg.Requests.TTL = config.Duration{Duration: 10 * time.Minute}
	now := time.Unix(1_000_000, 0)
	opts := storeOptions(&cfg)
	opts.Now = func() time.Time { return now }
	st, err := store.OpenWith(filepath.Join(t.TempDir(), "state.db"), opts)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for i := 0; i < 5; i++ {
		if err := st.RecordReply(fmt.Sprintf("r%d", i), []byte(`{}`), now.Add(time.Duration(i)*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := st.ReplyCount(); err != nil || n != 3 {
		t.Fatalf("%d records kept (%v), want maxRecords = 3", n, err)
	}
	if _, ok, _ := st.LookupReply("r0"); ok {
		t.Fatal("the oldest record was kept beyond maxRecords")
	}
	if _, ok, _ := st.LookupReply("r4"); !ok {
		t.Fatal("the newest record is missing")
	}
	now = now.Add(11 * time.Minute)
	if _, ok, _ := st.LookupReply("r4"); ok {
		t.Fatal("a record older than ttl still answers")
	}
}
