package store

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	"k8s.io/apimachinery/pkg/runtime"

	apiv1 "github.com/mqlet/mqlet/api/v1"
)

// writeSchema4Store writes a store as the mqlet before sources left it:
// n objects (pods, ConfigMaps and Secrets, the Secrets encrypted at rest)
// without a source annotation, schema 4.
func writeSchema4Store(t testing.TB, path string, n int) {
	t.Helper()
	s, err := OpenWith(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	var objs []runtime.Object
	for i := range n {
		name := "o" + strconv.Itoa(i)
		switch i % 10 {
		case 8:
			objs = append(objs, configMap(name, "v"))
		case 9:
			objs = append(objs, secret(name, "s3cret-"+name))
		default:
			objs = append(objs, pod("edge", name, "busybox:1"))
		}
	}
	if _, err := s.Apply(objs); err != nil {
		t.Fatal(err)
	}
	err = s.db.Update(func(tx *bolt.Tx) error {
		if err := tx.DeleteBucket(bucketGroupDocs); err != nil {
			return err
		}
		return tx.Bucket(bucketMeta).Put(schemaKey, []byte("4"))
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

func sourcesOf(t *testing.T, s *Store) (with, without int) {
	t.Helper()
	pods, err1 := s.ListPods()
	cms, err2 := s.ListConfigMaps()
	secrets, err3 := s.ListSecrets()
	if err1 != nil || err2 != nil || err3 != nil {
		t.Fatal(err1, err2, err3)
	}
	count := func(a map[string]string) {
		switch a[apiv1.AnnotationSource] {
		case apiv1.SourceNode:
			with++
		case "":
			without++
		default:
			t.Fatalf("source %q", a[apiv1.AnnotationSource])
		}
	}
	for _, p := range pods {
		count(p.Annotations)
	}
	for _, c := range cms {
		count(c.Annotations)
	}
	for _, s := range secrets {
		count(s.Annotations)
	}
	return with, without
}

// Objects of a schema-4 store (no source) get the node's source, after
// the old store was copied aside; uids, generations and Secret values
// stay. The time the migration of 1,000 objects takes is logged.
func TestMigrationGivesOldObjectsTheNodeSource(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	const n = 1000
	writeSchema4Store(t, path, n)
	before := openReadOnly(t, path)
	oldPod, _ := before.Pod("edge", "o0")
	if w, wo := sourcesOf(t, before); w != 0 || wo != n {
		t.Fatalf("the schema-4 store has %d objects with a source, %d without: the test proves nothing", w, wo)
	}
	_ = before.Close()

	start := time.Now()
	s, err := OpenWith(path, Options{})
	took := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	t.Logf("opening a schema-4 store of %d objects (backup and migration to schema %d): %s", n, SchemaVersion, took)
	m := s.Schema()
	if m.From != 4 || !m.Migrated() || m.Sourced != n || m.Backup != path+".schema-4.bak" {
		t.Fatalf("Schema() = %+v", m)
	}
	if w, wo := sourcesOf(t, s); w != n || wo != 0 {
		t.Fatalf("after the migration %d objects have the node's source, %d none", w, wo)
	}
	p, err := s.Pod("edge", "o0")
	if err != nil || p.UID != oldPod.UID || p.Generation != oldPod.Generation {
		t.Fatalf("migrated pod %v (uid %s gen %d; was %s %d)", err, p.UID, p.Generation, oldPod.UID, oldPod.Generation)
	}
	sec, err := s.Secret("default", "o9")
	if err != nil || string(sec.Data["password"]) != "s3cret-o9" {
		t.Fatalf("migrated secret: %v %v", sec, err)
	}
	if fileHolds(t, path, "s3cret-o9") {
		t.Fatal("the migration wrote a Secret in clear")
	}
	// The backup is the old store as it was.
	bak := openReadOnly(t, m.Backup)
	defer bak.Close()
	if w, wo := sourcesOf(t, bak); w != 0 || wo != n {
		t.Fatalf("backup: %d objects with a source, %d without; want the old store", w, wo)
	}
	// Opened again: nothing to migrate.
	_ = s.Close()
	again := openTest(t, path, Options{})
	if m := again.Schema(); m.Migrated() || m.Sourced != 0 {
		t.Fatalf("second open: %+v", m)
	}
}

// openReadOnly opens a store file for reading only (the at-rest key is
// the one beside the store under test).
func openReadOnly(t *testing.T, path string) *Store {
	t.Helper()
	dir := t.TempDir()
	cp := filepath.Join(dir, "copy.db")
	copyFile(t, path, cp)
	copyFile(t, filepath.Join(filepath.Dir(path), KeyFileName), filepath.Join(dir, KeyFileName))
	db, err := bolt.Open(cp, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	codec, err := loadAtRest(db, filepath.Join(dir, KeyFileName))
	if err != nil {
		t.Fatal(err)
	}
	return &Store{db: db, path: cp, opts: Options{}.withDefaults(), atRest: codec}
}

func copyFile(t testing.TB, from, to string) {
	t.Helper()
	in, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}

// BenchmarkMigrateSources1000 opens a schema-4 store of 1,000 objects
// (800 pods, 100 ConfigMaps, 100 Secrets): backup, migration and fsync,
// as an upgraded mqlet does at its first start.
func BenchmarkMigrateSources1000(b *testing.B) {
	dir := b.TempDir()
	golden := filepath.Join(dir, "golden.db")
	writeSchema4Store(b, golden, 1000)
	for i := 0; b.Loop(); i++ {
		b.StopTimer()
		run := filepath.Join(dir, fmt.Sprintf("run%d", i))
		if err := os.Mkdir(run, 0o700); err != nil {
			b.Fatal(err)
		}
		copyFile(b, golden, filepath.Join(run, "state.db"))
		copyFile(b, filepath.Join(dir, KeyFileName), filepath.Join(run, KeyFileName))
		b.StartTimer()
		s, err := OpenWith(filepath.Join(run, "state.db"), Options{})
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		if s.Schema().Sourced != 1000 {
			b.Fatalf("migrated %d objects", s.Schema().Sourced)
		}
		_ = s.Close()
		_ = os.RemoveAll(run)
		b.StartTimer()
	}
}

// The applied generation of a group's document is kept in the
// transaction that applies it, read back after a reopen, and forgotten.
func TestGroupAppliedIsPersisted(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s := openTest(t, path, Options{})
	if _, found, err := s.GroupApplied("line-1"); found || err != nil {
		t.Fatalf("new store: found %v, %v", found, err)
	}
	at := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	err := s.Batch(func(tx *Tx) error {
		if _, err := tx.Replace([]runtime.Object{pod("edge", "web", "busybox:1")}, Scope{Source: "group/line-1"}); err != nil {
			return err
		}
		if err := tx.SetGroupApplied("line-1", &GroupApplied{Generation: 7, AppliedAt: at}); err != nil {
			return err
		}
		g, found, err := tx.GroupApplied("line-1")
		if err != nil || !found || g.Generation != 7 {
			t.Errorf("inside the transaction: %+v %v %v", g, found, err)
		}
		return tx.SetGroupApplied("line-2", &GroupApplied{Generation: 3, AppliedAt: at})
	})
	if err != nil {
		t.Fatal(err)
	}
	// A batch that fails keeps nothing of it.
	_ = s.Batch(func(tx *Tx) error {
		_ = tx.SetGroupApplied("line-1", &GroupApplied{Generation: 9, AppliedAt: at})
		return fmt.Errorf("undone")
	})
	_ = s.Close()
	s = openTest(t, path, Options{})
	g, found, err := s.GroupApplied("line-1")
	if err != nil || !found || g.Generation != 7 || !g.AppliedAt.Equal(at) {
		t.Fatalf("after reopen: %+v %v %v", g, found, err)
	}
	gens, err := s.GroupGenerations()
	if err != nil || len(gens) != 2 || gens["line-1"] != 7 || gens["line-2"] != 3 {
		t.Fatalf("GroupGenerations = %v, %v", gens, err)
	}
	if err := s.Batch(func(tx *Tx) error { return tx.SetGroupApplied("line-1", nil) }); err != nil {
		t.Fatal(err)
	}
	if _, found, _ := s.GroupApplied("line-1"); found {
		t.Fatal("forgotten generation still found")
	}
}
