package store

import (
	"errors"
	"fmt"
	"strconv"

	bolt "go.etcd.io/bbolt"
)

// SchemaVersion is the layout of the state store this mqlet writes.
//
//	1  stores written before the version was recorded: any uid a client
//	   sent, and no quarantine bucket
//	2  uids are UUIDs owned by mqlet (migrateUIDs), every bucket exists
//	3  the pending-replies and pending-finals buckets: commands accepted
//	   and not yet given their final reply (created empty by the migration)
//	4  Secrets encrypted at rest
//	5  every object records its source (apiv1.AnnotationSource; objects
//	   stored before get the node's, migrateSources) and the
//	   group-documents bucket: the group documents applied
//
// A newer mqlet migrates an older store after copying it aside; an older
// mqlet refuses a newer store rather than misread it.
const SchemaVersion = 5

// SchemaSecretsEncrypted is the first schema whose Secrets are encrypted at
// rest: the backup of an older store holds them in clear.
const SchemaSecretsEncrypted = 4

// SchemaSources is the first schema in which every stored object names
// its source.
const SchemaSources = 5

// schemaKey holds the version in the meta bucket as a decimal string.
var schemaKey = []byte("store.schemaVersion")

// ErrNewerSchema is returned by Open for a store written by a newer mqlet.
var ErrNewerSchema = errors.New("state store was written by a newer mqlet")

// SchemaMigration says what Open did to the store's schema: From is the
// version found (0 for a new store), Backup the copy made before migrating
// ("" when nothing was migrated).
type SchemaMigration struct {
	From, To int
	Backup   string
	// Sourced is how many objects the migration to SchemaSources gave the
	// node's source.
	Sourced int
}

// Migrated reports whether Open changed an existing store's schema.
func (m SchemaMigration) Migrated() bool { return m.Backup != "" }

// readSchema returns the store's schema version: 0 when the file is new
// (no bucket at all), 1 when it predates versioning.
func readSchema(tx *bolt.Tx) (int, error) {
	meta := tx.Bucket(bucketMeta)
	if meta == nil || meta.Get(schemaKey) == nil {
		empty := true
		_ = tx.ForEach(func([]byte, *bolt.Bucket) error { empty = false; return nil })
		if empty {
			return 0, nil
		}
		return 1, nil
	}
	v, err := strconv.Atoi(string(meta.Get(schemaKey)))
	if err != nil || v < 1 {
		return 0, fmt.Errorf("schema version %q is not a positive number", meta.Get(schemaKey))
	}
	return v, nil
}

// prepareSchema checks the store's version before anything is written: a
// newer store is refused; an older one is first copied to
// <path>.schema-<from>.bak (a consistent snapshot, under the store's lock)
// so that a failed start after an upgrade leaves the old store readable.
func prepareSchema(db *bolt.DB, path string) (SchemaMigration, error) {
	m := SchemaMigration{To: SchemaVersion}
	err := db.View(func(tx *bolt.Tx) error {
		var err error
		if m.From, err = readSchema(tx); err != nil {
			return err
		}
		if m.From > SchemaVersion {
			return fmt.Errorf("%w: schema version %d, this mqlet reads up to %d; run the newer mqlet again, or restore the backup %s.schema-*.bak it made when it migrated (nothing was changed)",
				ErrNewerSchema, m.From, SchemaVersion, path)
		}
		if m.From == 0 || m.From == SchemaVersion {
			return nil
		}
		m.Backup = fmt.Sprintf("%s.schema-%d.bak", path, m.From)
		if err := tx.CopyFile(m.Backup, 0o600); err != nil {
			return fmt.Errorf("backing up the store before migrating it from schema %d: %w", m.From, err)
		}
		return nil
	})
	return m, err
}

// writeSchema records the current version; called in the transaction that
// migrated the store.
func writeSchema(tx *bolt.Tx) error {
	return tx.Bucket(bucketMeta).Put(schemaKey, []byte(strconv.Itoa(SchemaVersion)))
}

// Schema says what Open did to the store's schema.
func (s *Store) Schema() SchemaMigration { return s.schema }
