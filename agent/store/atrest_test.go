package store

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

const atRestValue = "hunter2-at-rest-7d1f0c"

func atRestSecret(name string) *v1.Secret {
	return &v1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "edge"},
		Data:       map[string][]byte{"pw": []byte(atRestValue)},
		StringData: map[string]string{"token": atRestValue + "-token"},
	}
}

// fileHolds reports whether the file holds the value plain or in base64
// (the encoding JSON gives a Secret's data).
func fileHolds(t *testing.T, path, value string) bool {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.Contains(raw, []byte(value)) || bytes.Contains(raw, []byte(base64.StdEncoding.EncodeToString([]byte(value))))
}

func TestSecretsAreEncryptedAtRest(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state.db")
	s := openTest(t, path, Options{})
	if _, err := s.Apply([]runtime.Object{atRestSecret("creds")}); err != nil {
		t.Fatal(err)
	}
	if ch, err := s.Apply([]runtime.Object{atRestSecret("creds")}); err != nil || ch[0].Action != Unchanged {
		t.Fatalf("re-apply of the same secret: %+v %v", ch, err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{atRestValue, atRestValue + "-token", `"creds"`} {
		if fileHolds(t, path, v) {
			t.Errorf("state.db holds %q in clear", v)
		}
	}
	fi, err := os.Stat(filepath.Join(dir, KeyFileName))
	if err != nil || fi.Mode().Perm() != 0o600 || fi.Size() != storeKeyBytes {
		t.Fatalf("key file: %v %v", fi, err)
	}
	s = openTest(t, path, Options{})
	got, err := s.Secret("edge", "creds")
	if err != nil || string(got.Data["pw"]) != atRestValue || string(got.Data["token"]) != atRestValue+"-token" {
		t.Fatalf("secret after reopen: %v %v", got, err)
	}
	list, err := s.ListSecrets()
	if err != nil || len(list) != 1 {
		t.Fatalf("ListSecrets: %v %v", list, err)
	}
	if _, err := s.Replace(nil, Scope{}); err != nil {
		t.Fatalf("replace (deleting the encrypted secret): %v", err)
	}
}

// writeSchema3StoreWithSecret writes a store as mqlet schema 3 left it: a
// Secret in clear.
func writeSchema3StoreWithSecret(t *testing.T, path string) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		for _, name := range allBuckets {
			if _, err := tx.CreateBucket(name); err != nil {
				return err
			}
		}
		sec := atRestSecret("old")
		sec.UID = "0b7e3a52-6c1d-4f7e-9a2b-3c4d5e6f7a8b"
		sec.Data["token"] = []byte(sec.StringData["token"])
		sec.StringData = nil
		raw, _ := json.Marshal(sec)
		if err := tx.Bucket(bucketSecrets).Put([]byte("edge/old"), raw); err != nil {
			return err
		}
		return tx.Bucket(bucketMeta).Put(schemaKey, []byte("3"))
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestPlainSecretsAreEncryptedByTheMigration(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	writeSchema3StoreWithSecret(t, path)
	if !fileHolds(t, path, atRestValue) {
		t.Fatal("the schema-3 store was not written in clear: the test proves nothing")
	}
	s := openTest(t, path, Options{})
	if m := s.Schema(); m.From != 3 || !m.Migrated() {
		t.Fatalf("Schema() = %+v", m)
	}
	got, err := s.Secret("edge", "old")
	if err != nil || string(got.Data["pw"]) != atRestValue || got.UID != "0b7e3a52-6c1d-4f7e-9a2b-3c4d5e6f7a8b" {
		t.Fatalf("migrated secret: %v %v", got, err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// Neither in the records nor in the free pages the plain ones left.
	if fileHolds(t, path, atRestValue) {
		t.Fatal("state.db still holds the migrated secret's value in clear")
	}
	if v, _ := schemaOf(t, path); v != strconv.Itoa(SchemaVersion) {
		t.Fatalf("schema %q after migration", v)
	}
	if again := openTest(t, path, Options{}).Schema(); again.Migrated() {
		t.Fatalf("second open migrated again: %+v", again)
	}
}

func TestStoreKeyFileProblemsAreErrors(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state.db")
	keyFile := filepath.Join(dir, KeyFileName)
	s := openTest(t, path, Options{})
	if _, err := s.Apply([]runtime.Object{atRestSecret("creds")}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	key, err := os.ReadFile(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	check := func(what, want string) {
		t.Helper()
		st, err := Open(path)
		if err == nil {
			st.Close()
			t.Fatalf("%s: the store opened", what)
		}
		if !strings.Contains(err.Error(), want) {
			t.Fatalf("%s: %v, want it to say %q", what, err, want)
		}
	}
	if err := os.Chmod(keyFile, 0o644); err != nil {
		t.Fatal(err)
	}
	check("key file readable by others", "others may read it")
	if err := os.Remove(keyFile); err != nil {
		t.Fatal(err)
	}
	check("key file missing", "key file "+keyFile+" is missing")
	if _, err := os.Stat(keyFile); err == nil {
		t.Fatal("a new key file was made for a store with encrypted secrets")
	}
	other := bytes.Repeat([]byte{7}, storeKeyBytes)
	if err := os.WriteFile(keyFile, other, 0o600); err != nil {
		t.Fatal(err)
	}
	check("another store's key", "does not decrypt with the key in "+keyFile)
	if err := os.WriteFile(keyFile, key[:16], 0o600); err != nil {
		t.Fatal(err)
	}
	check("short key file", "holds 16 bytes")
	if err := os.WriteFile(keyFile, key, 0o600); err != nil {
		t.Fatal(err)
	}
	openTest(t, path, Options{})
}

// A sealed record opens only under its own key: moved to another
// secret's key (by someone who can write the file) it is refused.
func TestSealedRecordIsBoundToItsKey(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s := openTest(t, path, Options{})
	if _, err := s.Apply([]runtime.Object{atRestSecret("a"), atRestSecret("b")}); err != nil {
		t.Fatal(err)
	}
	err := s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketSecrets)
		return b.Put([]byte("edge/b"), append([]byte(nil), b.Get([]byte("edge/a"))...))
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Secret("edge", "b"); err == nil || !strings.Contains(err.Error(), "does not decrypt") {
		t.Fatalf("moved record: %v", err)
	}
}

// BenchmarkAtRestSecret: encrypting and decrypting one stored Secret of
// about 1 KiB of JSON, the cost each write and read of a Secret adds.
func BenchmarkAtRestSecret(b *testing.B) {
	dir := b.TempDir()
	s, err := Open(filepath.Join(dir, "state.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	sec := atRestSecret("bench")
	sec.Data["blob"] = bytes.Repeat([]byte("x"), 700)
	raw, _ := json.Marshal(sec)
	key := []byte("edge/bench")
	b.Run("seal", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := s.atRest.seal(KindSecret, key, raw); err != nil {
				b.Fatal(err)
			}
		}
	})
	sealed, _ := s.atRest.seal(KindSecret, key, raw)
	b.Run("open", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := s.atRest.open(KindSecret, key, sealed); err != nil {
				b.Fatal(err)
			}
		}
	})
}
