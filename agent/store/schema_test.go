package store

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"
)

// writeSchema1Store writes a store as mqlets before schema versioning left
// it: no version key, no quarantine bucket, a client-chosen uid.
func writeSchema1Store(t *testing.T, path string) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		for _, name := range [][]byte{bucketPods, bucketConfigMaps, bucketSecrets, bucketReplies, bucketReplyIndex, bucketMeta, bucketSeq} {
			if _, err := tx.CreateBucket(name); err != nil {
				return err
			}
		}
		p := pod("edge", "old", "x:1")
		p.UID = "client-uid"
		raw, _ := json.Marshal(p)
		return tx.Bucket(bucketPods).Put([]byte("edge/old"), raw)
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
}

func schemaOf(t *testing.T, path string) (version string, hasQuarantine bool) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	_ = db.View(func(tx *bolt.Tx) error {
		if m := tx.Bucket(bucketMeta); m != nil {
			version = string(m.Get(schemaKey))
		}
		hasQuarantine = tx.Bucket(bucketQuarantine) != nil
		return nil
	})
	return version, hasQuarantine
}

func TestOlderSchemaIsBackedUpThenMigrated(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	writeSchema1Store(t, path)
	s := openTest(t, path, Options{})
	m := s.Schema()
	if m.From != 1 || m.To != SchemaVersion || !m.Migrated() || m.Backup != path+".schema-1.bak" {
		t.Fatalf("Schema() = %+v", m)
	}
	p, err := s.Pod("edge", "old")
	if err != nil || !IsUID(string(p.UID)) {
		t.Fatalf("migrated pod: %v %v", p, err)
	}
	// The backup is the old store as it was: readable by the old mqlet.
	if v, q := schemaOf(t, m.Backup); v != "" || q {
		t.Fatalf("backup has schema %q, quarantine bucket %v: not the old store", v, q)
	}
	bak, err := bolt.Open(m.Backup, 0o600, &bolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	_ = bak.View(func(tx *bolt.Tx) error {
		if raw := tx.Bucket(bucketPods).Get([]byte("edge/old")); !bytes.Contains(raw, []byte(`"client-uid"`)) {
			t.Errorf("backup lost the old pod: %s", raw)
		}
		return nil
	})
	bak.Close()
	if fi, err := os.Stat(m.Backup); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("backup: %v %v", fi, err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if v, q := schemaOf(t, path); v != strconv.Itoa(SchemaVersion) || !q {
		t.Fatalf("migrated store has schema %q, quarantine %v", v, q)
	}
	// Opening the migrated store again migrates nothing.
	if again := openTest(t, path, Options{}).Schema(); again.From != SchemaVersion || again.Migrated() {
		t.Fatalf("second open: %+v", again)
	}
}

func TestNewerSchemaIsRefusedUntouched(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucket(bucketMeta)
		if err != nil {
			return err
		}
		return b.Put(schemaKey, []byte(strconv.Itoa(SchemaVersion+1)))
	}); err != nil {
		t.Fatal(err)
	}
	db.Close()
	before, _ := os.ReadFile(path)
	_, err = Open(path)
	if !errors.Is(err, ErrNewerSchema) || !strings.Contains(err.Error(), fmt.Sprintf("schema version %d", SchemaVersion+1)) || !strings.Contains(err.Error(), path) {
		t.Fatalf("Open of a newer store: %v", err)
	}
	after, _ := os.ReadFile(path)
	if !bytes.Equal(before, after) {
		t.Fatal("a refused newer store was changed")
	}
	if _, q := schemaOf(t, path); q {
		t.Fatal("buckets were created in a refused store")
	}
}

func TestNewStoreHasTheCurrentSchema(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s := openTest(t, path, Options{})
	if m := s.Schema(); m.From != 0 || m.Migrated() {
		t.Fatalf("new store: %+v", m)
	}
	s.Close()
	if v, _ := schemaOf(t, path); v != strconv.Itoa(SchemaVersion) {
		t.Fatalf("schema %q", v)
	}
	if matches, _ := filepath.Glob(path + ".schema-*"); len(matches) > 0 {
		t.Fatalf("a new store was backed up: %v", matches)
	}
}
