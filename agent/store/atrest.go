package store

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	bolt "go.etcd.io/bbolt"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/mqlet/mqlet/internal/keyfile"
)

// Secrets are encrypted at rest, as the API server's encryption at rest
// does it: each stored Secret (its whole JSON, data and metadata) is sealed
// with AES-256-GCM under a node key kept in a file beside the store, so a
// copy of state.db (a backup, a disk image, a debug bundle) holds no secret
// value. The other kinds stay plain JSON. A sealed record is
//
//	"mqlet:aesgcm:v1:" | 12-byte nonce | ciphertext and tag
//
// with the record's bucket and key as additional data, so a record moved
// to another key does not open.

// sealedPrefix starts every encrypted record; a plain record is JSON and
// starts with '{'.
var sealedPrefix = []byte("mqlet:aesgcm:v1:")

// KeyFileName is the key file's name in the store's directory, the default
// of Options.KeyFile.
const KeyFileName = "store.key"

const storeKeyBytes = 32

// atRest seals and opens the records of the secrets bucket.
type atRest struct {
	aead    cipher.AEAD
	keyFile string
}

// isSealed reports whether a stored record is encrypted.
func isSealed(raw []byte) bool { return bytes.HasPrefix(raw, sealedPrefix) }

func additionalData(bucket, key []byte) []byte {
	ad := make([]byte, 0, len(bucket)+1+len(key))
	ad = append(append(append(ad, bucket...), '/'), key...)
	return ad
}

// encrypted reports whether kind's records are sealed.
func encrypted(kind string) bool { return kind == KindSecret }

// seal encrypts a record of kind stored under key; other kinds pass as they are.
func (c *atRest) seal(kind string, key, plain []byte) ([]byte, error) {
	if !encrypted(kind) {
		return plain, nil
	}
	nonce := make([]byte, c.aead.NonceSize(), len(sealedPrefix)+c.aead.NonceSize()+len(plain)+c.aead.Overhead())
	if _, err := rand.Read(nonce); err != nil {
		return nil, fmt.Errorf("making a nonce: %w", err)
	}
	out := append(append([]byte(nil), sealedPrefix...), nonce...)
	return c.aead.Seal(out, nonce, plain, additionalData(kindBuckets[kind], key)), nil
}

// encode is a record of obj (of kind, under key) as stored: JSON, sealed
// when kind is encrypted.
func (c *atRest) encode(kind string, key []byte, obj any) ([]byte, error) {
	raw, err := json.Marshal(obj)
	if err != nil {
		return nil, fmt.Errorf("encode %s %s: %w", kind, key, err)
	}
	if raw, err = c.seal(kind, key, raw); err != nil {
		return nil, fmt.Errorf("encode %s %s: %w", kind, key, err)
	}
	return raw, nil
}

// open returns the plain record; a plain record of an encrypted kind (a
// store not yet migrated) is returned as it is.
func (c *atRest) open(kind string, key, raw []byte) ([]byte, error) {
	if !encrypted(kind) || !isSealed(raw) {
		return raw, nil
	}
	body := raw[len(sealedPrefix):]
	n := c.aead.NonceSize()
	if len(body) < n+c.aead.Overhead() {
		return nil, fmt.Errorf("encrypted %s %s is truncated (%d bytes)", kind, key, len(raw))
	}
	plain, err := c.aead.Open(nil, body[:n], body[n:], additionalData(kindBuckets[kind], key))
	if err != nil {
		return nil, fmt.Errorf("encrypted %s %s does not decrypt with the key in %s (a key file of another store?): %w", kind, key, c.keyFile, err)
	}
	return plain, nil
}

// decode opens and decodes one stored record.
func (c *atRest) decode(kind string, key, raw []byte) (runtime.Object, error) {
	plain, err := c.open(kind, key, raw)
	if err != nil {
		return nil, err
	}
	return decodeObject(kind, plain)
}

// loadAtRest reads the key file, or creates it (0600, random) when it does
// not exist and no record in db needs it. A key file that others may read,
// or of the wrong size, is refused; a missing key file while records are
// sealed is an error, never a new key (the records would be lost).
func loadAtRest(db *bolt.DB, keyFile string) (*atRest, error) {
	key, err := readKeyFile(keyFile)
	if errors.Is(err, fs.ErrNotExist) {
		var sealed bool
		if err := db.View(func(tx *bolt.Tx) error { sealed = hasSealed(tx); return nil }); err != nil {
			return nil, err
		}
		if sealed {
			return nil, fmt.Errorf("the store holds encrypted secrets but their key file %s is missing; restore it (a new key cannot read them)", keyFile)
		}
		key, err = createKeyFile(keyFile)
	}
	if err != nil {
		return nil, err
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, fmt.Errorf("key file %s: %w", keyFile, err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, fmt.Errorf("key file %s: %w", keyFile, err)
	}
	return &atRest{aead: aead, keyFile: keyFile}, nil
}

func hasSealed(tx *bolt.Tx) bool {
	b := tx.Bucket(bucketSecrets)
	if b == nil {
		return false
	}
	found := false
	_ = b.ForEach(func(_, v []byte) error {
		if isSealed(v) {
			found = true
		}
		return nil
	})
	return found
}

func readKeyFile(path string) ([]byte, error) {
	// One byte more than a key, so a longer file is told apart from a key.
	key, err := keyfile.Read(path, "the store's key file", storeKeyBytes+1)
	if err != nil {
		return nil, err
	}
	if len(key) != storeKeyBytes {
		return nil, fmt.Errorf("the store's key file %s holds %d bytes, want %d", path, len(key), storeKeyBytes)
	}
	return key, nil
}

// createKeyFile writes a new random key durably; it never replaces a file.
func createKeyFile(path string) ([]byte, error) {
	key := make([]byte, storeKeyBytes)
	if _, err := rand.Read(key); err != nil {
		return nil, fmt.Errorf("making the store's key: %w", err)
	}
	if err := keyfile.Create(path, "the store's key file", key); err != nil {
		return nil, err
	}
	return key, nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// sealPlainSecrets encrypts every plain record of the secrets bucket (a
// store written before schema 4) and returns how many it encrypted.
func sealPlainSecrets(tx *bolt.Tx, c *atRest) (int, error) {
	b := tx.Bucket(bucketSecrets)
	plain := map[string][]byte{}
	err := b.ForEach(func(k, v []byte) error {
		if !isSealed(v) {
			plain[string(k)] = append([]byte(nil), v...)
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	for k, v := range plain {
		sealed, err := c.seal(KindSecret, []byte(k), v)
		if err != nil {
			return 0, fmt.Errorf("encrypt Secret %s: %w", k, err)
		}
		if err := b.Put([]byte(k), sealed); err != nil {
			return 0, fmt.Errorf("write encrypted Secret %s: %w", k, err)
		}
	}
	return len(plain), nil
}

// compact rewrites the file at path without its free pages, so the plain
// records a migration replaced are not left in them. db is closed; the
// returned handle is the compacted file.
func compact(db *bolt.DB, path string, lockTimeout time.Duration) (*bolt.DB, error) {
	tmp := path + ".compact"
	_ = os.Remove(tmp)
	dst, err := bolt.Open(tmp, 0o600, &bolt.Options{Timeout: lockTimeout})
	if err != nil {
		return db, fmt.Errorf("compacting the store: %w", err)
	}
	if err := bolt.Compact(dst, db, 0); err != nil {
		_ = dst.Close()
		_ = os.Remove(tmp)
		return db, fmt.Errorf("compacting the store: %w", err)
	}
	if err := dst.Close(); err != nil {
		_ = os.Remove(tmp)
		return db, fmt.Errorf("compacting the store: %w", err)
	}
	if err := db.Close(); err != nil {
		_ = os.Remove(tmp)
		return nil, fmt.Errorf("compacting the store: closing the old file: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return nil, fmt.Errorf("compacting the store: %w", err)
	}
	if err := syncDir(filepath.Dir(path)); err != nil {
		return nil, fmt.Errorf("compacting the store: %w", err)
	}
	return openBolt(path, lockTimeout)
}

// retiredKey is where the scrubber's retired secret values are kept (in
// the meta bucket), sealed as a secret is: they are secret values.
const retiredKey = "retired-secrets"

// RetiredSecrets returns what SetRetiredSecrets kept (nil: nothing).
func (s *Store) RetiredSecrets() ([]byte, error) {
	var plain []byte
	err := s.db.View(func(tx *bolt.Tx) error {
		raw := tx.Bucket(bucketMeta).Get([]byte(retiredKey))
		if raw == nil {
			return nil
		}
		var err error
		plain, err = s.atRest.open(KindSecret, []byte(retiredKey), raw)
		if err == nil && !isSealed(raw) {
			plain = nil // never written in clear; ignore what is
		}
		plain = append([]byte(nil), plain...)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("reading retired secret values in state store: %w", err)
	}
	return plain, nil
}

// SetRetiredSecrets keeps plain (the scrubber's retired secret values),
// encrypted with the store's key.
func (s *Store) SetRetiredSecrets(plain []byte) error {
	sealed, err := s.atRest.seal(KindSecret, []byte(retiredKey), plain)
	if err != nil {
		return fmt.Errorf("sealing retired secret values: %w", err)
	}
	err = s.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucketMeta).Put([]byte(retiredKey), sealed) })
	if err != nil {
		return fmt.Errorf("keeping retired secret values in state store: %w", err)
	}
	return nil
}
