package store

import (
	"errors"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// Batch runs fn in one bbolt write transaction: everything fn writes
// through tx is committed together with one fsync, or, when fn returns an
// error, not at all. It is how a burst of commands is persisted at the cost
// of one. tx must not be used after fn returns.
func (s *Store) Batch(fn func(tx *Tx) error) error {
	var secretsChanged bool
	err := s.db.Update(func(btx *bolt.Tx) error {
		t := &Tx{s: s, tx: btx}
		defer func() { t.tx, secretsChanged = nil, t.secretsChanged }()
		return fn(t)
	})
	if err != nil {
		return fmt.Errorf("batch write to state store %s: %w", s.path, err)
	}
	if secretsChanged {
		// Before any reply or event of the batch is published, so the
		// scrubber of secret values already knows the new ones.
		s.secretsVersion.Add(1)
	}
	return nil
}

// Tx is the store as seen inside one Batch: the same methods as Store, but
// reads see the batch's own writes and nothing is durable until Batch
// returns. A write that fails may leave part of its objects written in the
// transaction; the caller is expected to fail the whole Batch then (Failed
// says whether one did).
type Tx struct {
	s      *Store
	tx     *bolt.Tx
	failed error
	// secretsChanged is set when a secret is written or removed, so Batch
	// moves the store's SecretsVersion once the batch is durable.
	secretsChanged bool
}

func (t *Tx) noteSecretChanges(changes []Change) {
	for _, c := range changes {
		if c.Kind == KindSecret && c.Action != Unchanged {
			t.secretsChanged = true
		}
	}
}

var errTxDone = errors.New("store transaction already ended")

// Failed is the first write error seen in this transaction, if any.
func (t *Tx) Failed() error { return t.failed }

func (t *Tx) fail(err error) error {
	if err != nil && t.failed == nil {
		t.failed = err
	}
	return err
}

func (t *Tx) live() error {
	if t.tx == nil {
		return errTxDone
	}
	return nil
}

// Apply is Store.Apply inside the transaction.
func (t *Tx) Apply(objs []runtime.Object) ([]Change, error) {
	if err := t.live(); err != nil {
		return nil, err
	}
	changes, _, err := t.s.putAll(t.tx, objs)
	if err != nil {
		return nil, t.fail(fmt.Errorf("apply to state store: %w", err))
	}
	t.noteSecretChanges(changes)
	return changes, nil
}

// Replace is Store.Replace inside the transaction.
func (t *Tx) Replace(objs []runtime.Object, scope Scope) ([]Change, error) {
	if err := t.live(); err != nil {
		return nil, err
	}
	changes, err := t.s.replaceIn(t.tx, objs, scope)
	if err != nil {
		return nil, t.fail(fmt.Errorf("replace state store contents: %w", err))
	}
	t.noteSecretChanges(changes)
	return changes, nil
}

// Delete is Store.Delete inside the transaction.
func (t *Tx) Delete(kind, namespace, name string) (bool, error) {
	if err := t.live(); err != nil {
		return false, err
	}
	bucket, err := bucketFor(kind)
	if err != nil {
		return false, err
	}
	key := []byte(Key(namespace, name))
	b := t.tx.Bucket(bucket)
	if b.Get(key) == nil {
		return false, nil
	}
	if err := b.Delete(key); err != nil {
		return false, t.fail(fmt.Errorf("delete %s %s from state store: %w", kind, key, err))
	}
	if kind == KindSecret {
		t.secretsChanged = true
	}
	return true, nil
}

// CheckSource is Store.CheckSource inside the transaction.
func (t *Tx) CheckSource(source, kind, namespace, name string) error {
	if err := t.live(); err != nil {
		return err
	}
	if _, err := bucketFor(kind); err != nil {
		return err
	}
	return t.s.checkSource(t.tx, kind, Key(namespace, name), source)
}

// ListPods is Store.ListPods inside the transaction.
func (t *Tx) ListPods() ([]*v1.Pod, error) { return txList[*v1.Pod](t, KindPod) }

// ListConfigMaps is Store.ListConfigMaps inside the transaction.
func (t *Tx) ListConfigMaps() ([]*v1.ConfigMap, error) {
	return txList[*v1.ConfigMap](t, KindConfigMap)
}

// ListSecrets is Store.ListSecrets inside the transaction.
func (t *Tx) ListSecrets() ([]*v1.Secret, error) { return txList[*v1.Secret](t, KindSecret) }

func txList[T runtime.Object](t *Tx, kind string) ([]T, error) {
	if err := t.live(); err != nil {
		return nil, err
	}
	out, err := listIn[T](t.tx, t.s.atRest, kind)
	if err != nil {
		return nil, fmt.Errorf("list %s objects in state store %s: %w", kind, t.s.path, err)
	}
	return out, nil
}

// LookupReply is Store.LookupReply inside the transaction: it sees replies
// recorded earlier in the same batch.
func (t *Tx) LookupReply(requestID string) ([]byte, bool, error) {
	if err := t.live(); err != nil {
		return nil, false, err
	}
	reply, found, err := t.s.lookupReply(t.tx, requestID)
	if err != nil {
		return nil, false, fmt.Errorf("look up reply %q in state store: %w", requestID, err)
	}
	return reply, found, nil
}

// RecordReply is Store.RecordReply inside the transaction. A reply too
// large to record changes nothing and is not a reason to undo the batch (the
// reply is still sent); any other failure may have written part of the
// record, so it marks the transaction failed.
func (t *Tx) RecordReply(requestID string, reply []byte, at time.Time) error {
	if err := t.live(); err != nil {
		return err
	}
	if err := t.s.recordReply(t.tx, requestID, reply, at); err != nil {
		err = fmt.Errorf("record reply %q in state store: %w", requestID, err)
		if errors.Is(err, ErrRecordTooLarge) {
			return err
		}
		return t.fail(err)
	}
	return nil
}
