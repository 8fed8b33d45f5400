// Command oldstore turns mqlet's state store into a synthetic store of
// schema 1 (as mqlets before schema versioning left it: no version key, no
// quarantine bucket), for the upgrade test; with -print it prints the
// store's recorded schema version ("none" when absent); with -set N it
// records version N (e.g. one from the future, to see it refused); with
// -current it prints the schema this tree's mqlet writes.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/mqlet/mqlet/agent/store"
)

func main() {
	print := flag.Bool("print", false, "print the schema version instead of changing the store")
	set := flag.String("set", "", "record this schema version instead of making the store schema 1")
	current := flag.Bool("current", false, "print the schema version this mqlet writes and exit")
	flag.Parse()
	if *current {
		fmt.Println(store.SchemaVersion)
		return
	}
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: oldstore [-print] STATE.db")
		os.Exit(2)
	}
	if err := run(flag.Arg(0), *print, *set); err != nil {
		fmt.Fprintln(os.Stderr, "oldstore:", err)
		os.Exit(1)
	}
}

func run(path string, print bool, set string) error {
	if _, err := os.Stat(path); err != nil {
		return err
	}
	// mqlet holds the store's lock while it runs: fail, do not wait.
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: print, Timeout: 3 * time.Second})
	if err != nil {
		return fmt.Errorf("opening %s: %w", path, err)
	}
	defer db.Close()
	if print {
		return db.View(func(tx *bolt.Tx) error {
			v := "none"
			if m := tx.Bucket([]byte("meta")); m != nil && m.Get([]byte("store.schemaVersion")) != nil {
				v = string(m.Get([]byte("store.schemaVersion")))
			}
			fmt.Println(v)
			return nil
		})
	}
	return db.Update(func(tx *bolt.Tx) error {
		m := tx.Bucket([]byte("meta"))
		if m == nil {
			return errors.New("no meta bucket: not an mqlet state store")
		}
		if set != "" {
			return m.Put([]byte("store.schemaVersion"), []byte(set))
		}
		if err := m.Delete([]byte("store.schemaVersion")); err != nil {
			return err
		}
		// The buckets later schemas added (quarantines; pending replies).
		for _, b := range []string{"quarantine", "pending-replies", "pending-finals"} {
			if err := tx.DeleteBucket([]byte(b)); err != nil && !errors.Is(err, bolt.ErrBucketNotFound) {
				return err
			}
		}
		return nil
	})
}
