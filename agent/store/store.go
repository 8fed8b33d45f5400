// Package store persists mqlet's desired state (pods, config maps, secrets)
// and its bookkeeping (replies to handled requests, the connection sequence
// number, small settings) in one bbolt file, so the agent can run its pods
// from it after a restart with or without a broker.
//
// Objects are kept as JSON under "namespace/name" in one bucket per kind.
// Every write is one bbolt transaction: a command's objects are stored all
// or not at all. The store owns every object's metadata.uid (a random UUID
// made when the object is first stored and kept for its life; a client may
// repeat it but never choose it), a pod's metadata.generation (bumped only
// when the spec changes) and metadata.creationTimestamp (set when first
// stored). Uids name directories and cgroups, so only canonical UUIDs are
// ever stored; older stores holding other uids are migrated at open.
package store

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	"github.com/mqlet/mqlet/internal/defaults"
)

// Kinds the store holds.
const (
	KindPod       = "Pod"
	KindConfigMap = "ConfigMap"
	KindSecret    = "Secret"
)

// DefaultNamespace is used for objects and look-ups that name none.
const DefaultNamespace = "default"

// ErrNotFound is returned (wrapped) when an object is not in the store.
var ErrNotFound = errors.New("not found")

// Action says what a write did to one object.
type Action string

const (
	Created   Action = "created"
	Updated   Action = "updated"
	Unchanged Action = "unchanged"
	Deleted   Action = "deleted"
)

// RejectedError is a write refused because of an object's content (not a
// storage failure); it names the object and the field.
type RejectedError struct {
	Kind, Key, Field, Reason string
}

func (e *RejectedError) Error() string {
	return fmt.Sprintf("%s %s: %s: %s", e.Kind, e.Key, e.Field, e.Reason)
}

// Change is the effect of a write on one object.
type Change struct {
	Kind   string
	Key    string // "namespace/name"
	Action Action
	// Object is the object as stored after the write; for Deleted, the
	// object that was removed.
	Object runtime.Object
}

// Options tune a store; zero values take the defaults.
type Options struct {
	MaxReplies  int           // replies kept for redelivered requests; default 1000
	ReplyTTL    time.Duration // how long a reply is kept; default 24h
	LockTimeout time.Duration // wait for another process's lock on the file; default 5s
	// Now is the clock for creation timestamps and reply expiry; default time.Now.
	Now func() time.Time
	// MaxReplyBytes bounds the bytes the kept replies take; default 8 MiB.
	MaxReplyBytes int64
	// KeyFile holds the key Secrets are encrypted with at rest; default
	// store.key beside the store. Created (0600) when missing and no
	// stored Secret is encrypted yet.
	KeyFile string
}

// DefaultMaxReplyBytes is the default of Options.MaxReplyBytes.
const DefaultMaxReplyBytes = 8 << 20

func (o Options) withDefaults() Options {
	defaults.Set(&o.MaxReplies, 1000)
	defaults.Set(&o.MaxReplyBytes, DefaultMaxReplyBytes)
	defaults.Set(&o.ReplyTTL, 24*time.Hour)
	defaults.Set(&o.LockTimeout, 5*time.Second)
	if o.Now == nil {
		o.Now = time.Now
	}
	return o
}

var (
	bucketPods       = []byte("pods")
	bucketConfigMaps = []byte("configmaps")
	bucketSecrets    = []byte("secrets")
	bucketReplies    = []byte("replies")     // requestID -> 8-byte time + reply
	bucketReplyIndex = []byte("reply-index") // 8-byte time + requestID -> nothing, oldest first
	bucketMeta       = []byte("meta")
	bucketSeq        = []byte("seq")
	bucketQuarantine = []byte("quarantine")      // pod key -> Quarantine JSON
	bucketPending    = []byte("pending-replies") // requestID -> 8-byte seq + PendingReply JSON
	bucketFinals     = []byte("pending-finals")  // requestID -> 8-byte seq + uvarint topic length + topic + payload
	bucketDigests    = []byte("request-digests") // requestID -> 8-byte time + sha256 of the command it named

	allBuckets  = [][]byte{bucketPods, bucketConfigMaps, bucketSecrets, bucketReplies, bucketReplyIndex, bucketMeta, bucketSeq, bucketQuarantine, bucketPending, bucketFinals, bucketDigests, bucketGroupDocs}
	kindBuckets = map[string][]byte{KindPod: bucketPods, KindConfigMap: bucketConfigMaps, KindSecret: bucketSecrets}
	kindOrder   = []string{KindPod, KindConfigMap, KindSecret}
)

// Store is the persisted desired state. Its methods are safe for concurrent
// use (bbolt serialises writers and lets readers run alongside).
type Store struct {
	db       *bolt.DB
	path     string
	opts     Options
	migrated []string
	schema   SchemaMigration
	atRest   *atRest
	// secretsVersion moves whenever a secret is written or removed, so a
	// scrubber of secret values knows when to rebuild (SecretsVersion).
	secretsVersion atomic.Uint64
}

// Open opens (or creates) the store at path with default options.
func Open(path string) (*Store, error) { return OpenWith(path, Options{}) }

// OpenWith opens (or creates) the store at path. A file that is not a bbolt
// database or fails its consistency check is an error naming the file; it is
// never replaced or emptied.
func OpenWith(path string, opts Options) (st *Store, err error) {
	opts = opts.withDefaults()
	if opts.KeyFile == "" {
		opts.KeyFile = filepath.Join(filepath.Dir(path), KeyFileName)
	}
	db, err := openBolt(path, opts.LockTimeout)
	if err != nil {
		return nil, fmt.Errorf("open state store %s: %w", path, err)
	}
	defer func() {
		if err != nil && db != nil {
			_ = db.Close()
		}
	}()
	if err := checkConsistency(db); err != nil {
		return nil, fmt.Errorf("open state store %s: file is corrupt: %w", path, err)
	}
	schema, err := prepareSchema(db, path)
	if err != nil {
		return nil, fmt.Errorf("open state store %s: %w", path, err)
	}
	codec, err := loadAtRest(db, opts.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("open state store %s: %w", path, err)
	}
	var migrated []string
	var sealed, sourced int
	err = db.Update(func(tx *bolt.Tx) error {
		for _, name := range allBuckets {
			if _, err := tx.CreateBucketIfNotExists(name); err != nil {
				return fmt.Errorf("create bucket %s: %w", name, err)
			}
		}
		if sealed, err = sealPlainSecrets(tx, codec); err != nil {
			return fmt.Errorf("encrypt stored secrets: %w", err)
		}
		if migrated, err = migrateUIDs(tx, codec); err != nil {
			return err
		}
		if schema.From > 0 && schema.From < SchemaSources {
			if sourced, err = migrateSources(tx, codec); err != nil {
				return err
			}
		}
		return writeSchema(tx)
	})
	if err != nil {
		return nil, fmt.Errorf("open state store %s: %w", path, err)
	}
	if sealed > 0 {
		if db, err = compact(db, path, opts.LockTimeout); err != nil {
			return nil, fmt.Errorf("open state store %s: %w", path, err)
		}
	}
	schema.Sourced = sourced
	return &Store{db: db, path: path, opts: opts, migrated: migrated, schema: schema, atRest: codec}, nil
}

// migrateUIDs gives a fresh UUID to every stored object whose uid is not
// one (older mqlets kept any uid a client sent, and uids name directories).
// The pod then counts as a new pod: its workers replace what runs under the
// old uid. It returns "Kind key: old uid" for each object changed.
func migrateUIDs(tx *bolt.Tx, c *atRest) ([]string, error) {
	var out []string
	for _, kind := range kindOrder {
		b := tx.Bucket(kindBuckets[kind])
		fixed := map[string][]byte{}
		err := b.ForEach(func(k, v []byte) error {
			obj, err := c.decode(kind, k, v)
			if err != nil {
				return fmt.Errorf("%s %s: %w", kind, k, err)
			}
			m := metaOf(obj)
			if IsUID(string(m.UID)) {
				return nil
			}
			uid, err := newUID()
			if err != nil {
				return err
			}
			out = append(out, fmt.Sprintf("%s %s: %q", kind, k, m.UID))
			m.UID = uid
			if p, ok := obj.(*v1.Pod); ok {
				p.Generation = 1
			}
			raw, err := c.encode(kind, k, obj)
			if err != nil {
				return err
			}
			fixed[string(k)] = raw
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("migrate uids: %w", err)
		}
		for k, raw := range fixed {
			if err := b.Put([]byte(k), raw); err != nil {
				return nil, fmt.Errorf("migrate uid of %s %s: %w", kind, k, err)
			}
		}
	}
	return out, nil
}

// MigratedUIDs lists the objects whose non-UUID uid was replaced at open,
// as "Kind namespace/name: old uid".
func (s *Store) MigratedUIDs() []string { return append([]string(nil), s.migrated...) }

// IsUID reports whether uid is a UUID in canonical form (lowercase hex in
// 8-4-4-4-12 groups), the only uids mqlet stores.
func IsUID(uid string) bool {
	if len(uid) != 36 {
		return false
	}
	for i, c := range uid {
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return false
			}
		default:
			if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
				return false
			}
		}
	}
	return true
}

// openBolt turns bbolt's panics on some corruptions (a garbled freelist)
// into errors. The file handle bbolt held at the panic is lost; the caller
// is expected to stop on this error anyway.
func openBolt(path string, lockTimeout time.Duration) (db *bolt.DB, err error) {
	defer func() {
		if r := recover(); r != nil {
			db, err = nil, fmt.Errorf("file is corrupt: %v", r)
		}
	}()
	return bolt.Open(path, 0o600, &bolt.Options{Timeout: lockTimeout})
}

// checkConsistency walks every page once. The state is small (kilobytes to
// a few megabytes), and finding corruption at start beats losing it later.
func checkConsistency(db *bolt.DB) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("consistency check failed: %v", r)
		}
	}()
	return db.View(func(tx *bolt.Tx) error {
		var errs []error
		for e := range tx.Check() {
			errs = append(errs, e)
		}
		return errors.Join(errs...)
	})
}

// Path is the file the store lives in.
func (s *Store) Path() string { return s.path }

// Close closes the file.
func (s *Store) Close() error {
	if err := s.db.Close(); err != nil {
		return fmt.Errorf("close state store %s: %w", s.path, err)
	}
	return nil
}

// Key is how objects are keyed: "namespace/name", namespace defaulting to "default".
func Key(namespace, name string) string {
	if namespace == "" {
		namespace = DefaultNamespace
	}
	return namespace + "/" + name
}

// Apply stores objs (*v1.Pod, *v1.ConfigMap, *v1.Secret) in one transaction
// and says what happened to each. Re-applying an identical object is
// Unchanged. Pods lose their status: the store keeps desired state only.
func (s *Store) Apply(objs []runtime.Object) ([]Change, error) {
	var changes []Change
	err := s.db.Update(func(tx *bolt.Tx) error {
		var err error
		changes, _, err = s.putAll(tx, objs)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("apply to state store: %w", err)
	}
	s.noteSecretChanges(changes)
	return changes, nil
}

// SecretsVersion is a number that changes whenever a secret is stored,
// changed or deleted (it may also change when none was).
func (s *Store) SecretsVersion() uint64 { return s.secretsVersion.Load() + 1 }

func (s *Store) noteSecretChanges(changes []Change) {
	for _, c := range changes {
		if c.Kind == KindSecret && c.Action != Unchanged {
			s.secretsVersion.Add(1)
			return
		}
	}
}

// Scope limits what a Replace may delete: the stored objects of one
// source (SourceOf; "" for any) and of one namespace ("" for any).
type Scope struct {
	Source    string
	Namespace string
}

// Holds reports whether a stored object at key ("namespace/name") with
// metadata m lies in the scope.
func (sc Scope) Holds(key string, m *metav1.ObjectMeta) bool { return sc.holds(key, m) }

// holds reports whether a stored object at key ("namespace/name") with
// metadata m lies in the scope.
func (sc Scope) holds(key string, m *metav1.ObjectMeta) bool {
	if sc.Namespace != "" && !strings.HasPrefix(key, sc.Namespace+"/") {
		return false
	}
	return sc.Source == "" || SourceOf(m) == sc.Source
}

// Replace makes objs the whole desired state of scope in one transaction:
// the scope's objects not among them are deleted and reported as Deleted;
// objects outside it stay.
func (s *Store) Replace(objs []runtime.Object, scope Scope) ([]Change, error) {
	var changes []Change
	err := s.db.Update(func(tx *bolt.Tx) error {
		var err error
		changes, err = s.replaceIn(tx, objs, scope)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("replace state store contents: %w", err)
	}
	s.noteSecretChanges(changes)
	return changes, nil
}

func (s *Store) replaceIn(tx *bolt.Tx, objs []runtime.Object, scope Scope) ([]Change, error) {
	changes, keep, err := s.putAll(tx, objs)
	if err != nil {
		return nil, err
	}
	for _, kind := range kindOrder {
		b := tx.Bucket(kindBuckets[kind])
		type doomed struct {
			key []byte
			obj runtime.Object
		}
		var gone []doomed
		err := b.ForEach(func(k, v []byte) error {
			if keep[kind+" "+string(k)] {
				return nil
			}
			prev, err := s.atRest.decode(kind, k, v)
			if err != nil {
				return fmt.Errorf("read %s %s: %w", kind, k, err)
			}
			if scope.holds(string(k), metaOf(prev)) {
				gone = append(gone, doomed{append([]byte(nil), k...), prev})
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
		for _, d := range gone {
			if err := b.Delete(d.key); err != nil {
				return nil, fmt.Errorf("delete %s %s: %w", kind, d.key, err)
			}
			changes = append(changes, Change{Kind: kind, Key: string(d.key), Action: Deleted, Object: d.obj})
		}
	}
	return changes, nil
}

// putAll stores every object and returns the changes and the set of
// "Kind key" written. Two objects with the same kind and key are an error:
// which one should win would be a guess.
func (s *Store) putAll(tx *bolt.Tx, objs []runtime.Object) ([]Change, map[string]bool, error) {
	now := s.opts.Now()
	written := make(map[string]bool, len(objs))
	changes := make([]Change, 0, len(objs))
	for i, obj := range objs {
		kind, key, err := identify(obj)
		if err != nil {
			return nil, nil, fmt.Errorf("object %d: %w", i+1, err)
		}
		if written[kind+" "+key] {
			return nil, nil, fmt.Errorf("object %d: %s %s appears twice", i+1, kind, key)
		}
		written[kind+" "+key] = true
		if err := checkUID(tx, s.atRest, kind, key, obj); err != nil {
			return nil, nil, err
		}
		if err := s.checkSource(tx, kind, key, SourceOf(metaOf(obj))); err != nil {
			return nil, nil, err
		}
		ch, err := put(tx, s.atRest, kind, key, obj, now)
		if err != nil {
			return nil, nil, fmt.Errorf("store %s %s: %w", kind, key, err)
		}
		changes = append(changes, ch)
	}
	return changes, written, nil
}

func identify(obj runtime.Object) (kind, key string, err error) {
	var m *metav1.ObjectMeta
	switch o := obj.(type) {
	case *v1.Pod:
		kind, m = KindPod, &o.ObjectMeta
	case *v1.ConfigMap:
		kind, m = KindConfigMap, &o.ObjectMeta
	case *v1.Secret:
		kind, m = KindSecret, &o.ObjectMeta
	default:
		return "", "", fmt.Errorf("unsupported object type %T", obj)
	}
	if m.Name == "" {
		return "", "", fmt.Errorf("%s without metadata.name", kind)
	}
	return kind, Key(m.Namespace, m.Name), nil
}

// checkUID refuses a client-given uid unless it repeats the stored object's
// own: uids are made here, and one naming another object would make two
// pods share a sandbox, directories and cgroup.
func checkUID(tx *bolt.Tx, c *atRest, kind, key string, obj runtime.Object) error {
	given := string(metaOf(obj).UID)
	if given == "" {
		return nil
	}
	reject := func(reason string) error {
		return &RejectedError{Kind: kind, Key: key, Field: "metadata.uid", Reason: reason}
	}
	if !IsUID(given) {
		return reject(fmt.Sprintf("%q is not a UUID; uids are assigned by mqlet, omit metadata.uid", truncate(given, 64)))
	}
	b := tx.Bucket(kindBuckets[kind])
	if raw := b.Get([]byte(key)); raw != nil {
		prev, err := c.decode(kind, []byte(key), raw)
		if err != nil {
			return fmt.Errorf("store %s %s: read stored version: %w", kind, key, err)
		}
		if stored := string(metaOf(prev).UID); stored != given {
			return reject(fmt.Sprintf("%q differs from the stored uid %q; uids are assigned by mqlet: omit metadata.uid, or delete the object to re-create it", given, stored))
		}
		return nil
	}
	var owner string
	err := b.ForEach(func(k, v []byte) error {
		plain, err := c.open(kind, k, v)
		if err != nil {
			return err
		}
		if bytes.Contains(plain, []byte(`"uid":"`+given+`"`)) {
			if o, err := decodeObject(kind, plain); err == nil && string(metaOf(o).UID) == given {
				owner = string(k)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("store %s %s: look up uid: %w", kind, key, err)
	}
	if owner != "" {
		return reject(fmt.Sprintf("%q belongs to %s %s; uids are assigned by mqlet, omit metadata.uid", given, kind, owner))
	}
	return reject(fmt.Sprintf("%q is given for a new object; uids are assigned by mqlet, omit metadata.uid", given))
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// put writes one object, carrying over the store-owned metadata.
func put(tx *bolt.Tx, c *atRest, kind, key string, obj runtime.Object, now time.Time) (Change, error) {
	b := tx.Bucket(kindBuckets[kind])
	prevRaw := b.Get([]byte(key))
	var prev runtime.Object
	if prevRaw != nil {
		var err error
		if prevRaw, err = c.open(kind, []byte(key), prevRaw); err != nil {
			return Change{}, fmt.Errorf("read stored version: %w", err)
		}
		if prev, err = decodeObject(kind, prevRaw); err != nil {
			return Change{}, fmt.Errorf("read stored version: %w", err)
		}
	}
	next, err := prepare(obj, prev, now)
	if err != nil {
		return Change{}, err
	}
	raw, err := json.Marshal(next)
	if err != nil {
		return Change{}, fmt.Errorf("encode: %w", err)
	}
	action := Created
	if prevRaw != nil {
		action = Updated
		if bytes.Equal(prevRaw, raw) {
			return Change{Kind: kind, Key: key, Action: Unchanged, Object: next}, nil
		}
	}
	stored, err := c.seal(kind, []byte(key), raw)
	if err != nil {
		return Change{}, fmt.Errorf("encrypt: %w", err)
	}
	if err := b.Put([]byte(key), stored); err != nil {
		return Change{}, fmt.Errorf("write: %w", err)
	}
	return Change{Kind: kind, Key: key, Action: action, Object: next}, nil
}

// prepare returns the object as it will be stored: a copy with TypeMeta and
// namespace set, the store-owned metadata filled in, pod status dropped and
// secret stringData merged into data (as the API server does).
func prepare(obj runtime.Object, prev runtime.Object, now time.Time) (runtime.Object, error) {
	created := metav1.NewTime(now.UTC().Truncate(time.Second))
	switch o := obj.(type) {
	case *v1.Pod:
		p := o.DeepCopy()
		p.TypeMeta = metav1.TypeMeta{APIVersion: "v1", Kind: KindPod}
		p.Status = v1.PodStatus{}
		var prevPod *v1.Pod
		if prev != nil {
			prevPod = prev.(*v1.Pod)
		}
		if err := ownMetadata(&p.ObjectMeta, metaOf(prev), created); err != nil {
			return nil, err
		}
		p.Generation = 1
		if prevPod != nil && prevPod.UID == p.UID {
			p.Generation = prevPod.Generation
			same, err := sameJSON(prevPod.Spec, p.Spec)
			if err != nil {
				return nil, err
			}
			if !same {
				p.Generation++
			}
		}
		return p, nil
	case *v1.ConfigMap:
		c := o.DeepCopy()
		c.TypeMeta = metav1.TypeMeta{APIVersion: "v1", Kind: KindConfigMap}
		if err := ownMetadata(&c.ObjectMeta, metaOf(prev), created); err != nil {
			return nil, err
		}
		return c, nil
	case *v1.Secret:
		sec := o.DeepCopy()
		sec.TypeMeta = metav1.TypeMeta{APIVersion: "v1", Kind: KindSecret}
		if len(sec.StringData) > 0 {
			if sec.Data == nil {
				sec.Data = make(map[string][]byte, len(sec.StringData))
			}
			for k, v := range sec.StringData {
				sec.Data[k] = []byte(v)
			}
			sec.StringData = nil
		}
		if err := ownMetadata(&sec.ObjectMeta, metaOf(prev), created); err != nil {
			return nil, err
		}
		return sec, nil
	}
	return nil, fmt.Errorf("unsupported object type %T", obj)
}

func metaOf(obj runtime.Object) *metav1.ObjectMeta {
	switch o := obj.(type) {
	case *v1.Pod:
		return &o.ObjectMeta
	case *v1.ConfigMap:
		return &o.ObjectMeta
	case *v1.Secret:
		return &o.ObjectMeta
	}
	return nil
}

// ownMetadata sets namespace, uid and creationTimestamp: a stored object
// keeps its uid and creation time, a new one gets a fresh uid (checkUID has
// refused any other uid a client gave).
func ownMetadata(m, prev *metav1.ObjectMeta, created metav1.Time) error {
	defaults.Set(&m.Namespace, DefaultNamespace)
	m.ResourceVersion = ""
	m.Generation = 0
	if prev != nil {
		m.UID = prev.UID
		m.CreationTimestamp = prev.CreationTimestamp
		return nil
	}
	m.CreationTimestamp = created
	uid, err := newUID()
	if err != nil {
		return err
	}
	m.UID = uid
	return nil
}

func sameJSON(a, b any) (bool, error) {
	ja, err := json.Marshal(a)
	if err != nil {
		return false, fmt.Errorf("encode spec: %w", err)
	}
	jb, err := json.Marshal(b)
	if err != nil {
		return false, fmt.Errorf("encode spec: %w", err)
	}
	return bytes.Equal(ja, jb), nil
}

// newUID makes a random (version 4) UUID.
func newUID() (types.UID, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("make uid: %w", err)
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return types.UID(fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])), nil
}

func decodeObject(kind string, raw []byte) (runtime.Object, error) {
	var obj runtime.Object
	switch kind {
	case KindPod:
		obj = &v1.Pod{}
	case KindConfigMap:
		obj = &v1.ConfigMap{}
	case KindSecret:
		obj = &v1.Secret{}
	default:
		return nil, fmt.Errorf("unsupported kind %q", kind)
	}
	if err := json.Unmarshal(raw, obj); err != nil {
		return nil, fmt.Errorf("decode stored %s: %w", kind, err)
	}
	return obj, nil
}

func bucketFor(kind string) ([]byte, error) {
	b, ok := kindBuckets[kind]
	if !ok {
		return nil, fmt.Errorf("unsupported kind %q: want Pod, ConfigMap or Secret", kind)
	}
	return b, nil
}

// Delete removes one object and reports whether it was there.
func (s *Store) Delete(kind, namespace, name string) (bool, error) {
	bucket, err := bucketFor(kind)
	if err != nil {
		return false, err
	}
	key := []byte(Key(namespace, name))
	var existed bool
	err = s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucket)
		existed = b.Get(key) != nil
		if !existed {
			return nil
		}
		return b.Delete(key)
	})
	if err != nil {
		return false, fmt.Errorf("delete %s %s from state store: %w", kind, key, err)
	}
	if existed && kind == KindSecret {
		s.secretsVersion.Add(1)
	}
	return existed, nil
}

// CheckSource refuses (a *RejectedError naming both sources) a change of
// the object by a command of source when it is stored from another one.
func (s *Store) CheckSource(source, kind, namespace, name string) error {
	if _, err := bucketFor(kind); err != nil {
		return err
	}
	return s.db.View(func(tx *bolt.Tx) error { return s.checkSource(tx, kind, Key(namespace, name), source) })
}

// Get returns one object; a missing one is an error wrapping ErrNotFound.
func (s *Store) Get(kind, namespace, name string) (runtime.Object, error) {
	bucket, err := bucketFor(kind)
	if err != nil {
		return nil, err
	}
	key := Key(namespace, name)
	var obj runtime.Object
	err = s.db.View(func(tx *bolt.Tx) error {
		raw := tx.Bucket(bucket).Get([]byte(key))
		if raw == nil {
			return fmt.Errorf("%s %s: %w", kind, key, ErrNotFound)
		}
		var err error
		obj, err = s.atRest.decode(kind, []byte(key), raw)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("get from state store: %w", err)
	}
	return obj, nil
}

// Pod returns one pod (ErrNotFound if missing).
func (s *Store) Pod(namespace, name string) (*v1.Pod, error) {
	obj, err := s.Get(KindPod, namespace, name)
	if err != nil {
		return nil, err
	}
	return obj.(*v1.Pod), nil
}

// ConfigMap returns one config map (ErrNotFound if missing).
func (s *Store) ConfigMap(namespace, name string) (*v1.ConfigMap, error) {
	obj, err := s.Get(KindConfigMap, namespace, name)
	if err != nil {
		return nil, err
	}
	return obj.(*v1.ConfigMap), nil
}

// Secret returns one secret (ErrNotFound if missing).
func (s *Store) Secret(namespace, name string) (*v1.Secret, error) {
	obj, err := s.Get(KindSecret, namespace, name)
	if err != nil {
		return nil, err
	}
	return obj.(*v1.Secret), nil
}

// ListPods returns every pod, ordered by key.
func (s *Store) ListPods() ([]*v1.Pod, error) { return viewList[*v1.Pod](s, KindPod) }

// ListConfigMaps returns every config map, ordered by key.
func (s *Store) ListConfigMaps() ([]*v1.ConfigMap, error) {
	return viewList[*v1.ConfigMap](s, KindConfigMap)
}

// ListSecrets returns every secret, ordered by key.
func (s *Store) ListSecrets() ([]*v1.Secret, error) { return viewList[*v1.Secret](s, KindSecret) }

func viewList[T runtime.Object](s *Store, kind string) ([]T, error) {
	var out []T
	err := s.db.View(func(tx *bolt.Tx) error {
		var err error
		out, err = listIn[T](tx, s.atRest, kind)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("list %s objects in state store %s: %w", kind, s.path, err)
	}
	return out, nil
}

// listIn decodes every object of kind in tx, ordered by key; a Store and a
// batch's Tx list the same way.
func listIn[T runtime.Object](tx *bolt.Tx, c *atRest, kind string) ([]T, error) {
	var out []T
	err := tx.Bucket(kindBuckets[kind]).ForEach(func(k, v []byte) error {
		obj, err := c.decode(kind, k, v)
		if err != nil {
			return fmt.Errorf("%s: %w", k, err)
		}
		out = append(out, obj.(T))
		return nil
	})
	return out, err
}
