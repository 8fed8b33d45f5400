// Package sealing encrypts a Secret's values to one node, so they travel
// over the broker unreadable to every other subscriber; the node holds the
// only private key. It is shared by the agent (identity, unsealing) and
// mqletctl (sealing), like signing.
//
// Each value of a sealed Secret's data is an age file (X25519 recipient,
// binary, not armored) whose plaintext is
//
//	"mqlet-sealed-secret-v1" NUL <namespace>/<name>/<key> NUL <value>
//
// so a sealed value opens only as the value of the Secret key it was
// sealed for: copied into another Secret (one a reader's pod mounts) it is
// refused. The Secret carries the annotation AnnotationSealedTo, the key
// ids (KeyID) of the nodes it was sealed to, comma-separated.
package sealing

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"strings"

	"filippo.io/age"
	v1 "k8s.io/api/core/v1"

	"github.com/mqlet/mqlet/internal/keyfile"
)

// AnnotationSealedTo marks a sealed Secret: the key ids its values are
// sealed to. The node removes it once the values are unsealed.
const AnnotationSealedTo = "mqlet.io/sealed-to"

// plaintextTag starts every sealed value's plaintext.
const plaintextTag = "mqlet-sealed-secret-v1"

// maxHeaderBytes bounds an age header the node reads: an X25519 stanza is
// about 100 bytes, and each one costs a scalar multiplication to try.
const maxHeaderBytes = 4096

// KeyID names a node's sealing key (an age recipient, "age1..."): the first
// 16 hex digits of the SHA-256 of the recipient string.
func KeyID(recipient string) string {
	sum := sha256.Sum256([]byte(recipient))
	return hex.EncodeToString(sum[:8])
}

// Recipient is a node's public sealing key.
type Recipient struct {
	r  *age.X25519Recipient
	id string
}

// ParseRecipient reads an age X25519 recipient ("age1...").
func ParseRecipient(s string) (Recipient, error) {
	r, err := age.ParseX25519Recipient(strings.TrimSpace(s))
	if err != nil {
		return Recipient{}, fmt.Errorf("sealing key: %w", err)
	}
	return Recipient{r: r, id: KeyID(r.String())}, nil
}

// String is the recipient as published ("age1...").
func (r Recipient) String() string { return r.r.String() }

// KeyID is the recipient's key id.
func (r Recipient) KeyID() string { return r.id }

// Identity is a node's private sealing key.
type Identity struct {
	id        *age.X25519Identity
	recipient string
	keyID     string
}

// LoadOrCreateIdentity reads the node's identity from path (an age secret
// key line, mode 0600), or creates one there when the file does not exist.
// A file that others may read is refused.
func LoadOrCreateIdentity(path string) (*Identity, error) {
	raw, err := readPrivate(path)
	if errors.Is(err, fs.ErrNotExist) {
		return createIdentity(path)
	}
	if err != nil {
		return nil, err
	}
	var line string
	for _, l := range strings.Split(string(raw), "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			line = l
		}
	}
	id, err := age.ParseX25519Identity(line)
	if err != nil {
		return nil, fmt.Errorf("sealing key file %s: not an age X25519 identity", path)
	}
	return newIdentity(id), nil
}

func newIdentity(id *age.X25519Identity) *Identity {
	r := id.Recipient().String()
	return &Identity{id: id, recipient: r, keyID: KeyID(r)}
}

// NewIdentity makes a fresh identity that is kept nowhere (tests, benchmarks).
func NewIdentity() (*Identity, error) {
	id, err := age.GenerateX25519Identity()
	if err != nil {
		return nil, fmt.Errorf("making a sealing key: %w", err)
	}
	return newIdentity(id), nil
}

// Recipient is the public key to publish ("age1...").
func (i *Identity) Recipient() string { return i.recipient }

// KeyID is the identity's key id.
func (i *Identity) KeyID() string { return i.keyID }

func readPrivate(path string) ([]byte, error) {
	return keyfile.Read(path, "the sealing key file", 1024)
}

func createIdentity(path string) (*Identity, error) {
	id, err := age.GenerateX25519Identity()
	if err != nil {
		return nil, fmt.Errorf("making a sealing key: %w", err)
	}
	content := fmt.Sprintf("# mqlet sealing key, public key: %s\n%s\n", id.Recipient(), id)
	if err := keyfile.Create(path, "the sealing key file", []byte(content)); err != nil {
		return nil, err
	}
	return newIdentity(id), nil
}

func binding(namespace, name, key string) []byte {
	if namespace == "" {
		namespace = v1.NamespaceDefault
	}
	return []byte(plaintextTag + "\x00" + namespace + "/" + name + "/" + key + "\x00")
}

// SealValue seals one value of Secret namespace/name under key to the recipients.
func SealValue(to []Recipient, namespace, name, key string, value []byte) ([]byte, error) {
	if len(to) == 0 {
		return nil, errors.New("sealing: no recipient")
	}
	rs := make([]age.Recipient, len(to))
	for i, r := range to {
		rs[i] = r.r
	}
	var out bytes.Buffer
	w, err := age.Encrypt(&out, rs...)
	if err != nil {
		return nil, fmt.Errorf("sealing %s: %w", key, err)
	}
	if _, err := w.Write(binding(namespace, name, key)); err != nil {
		return nil, fmt.Errorf("sealing %s: %w", key, err)
	}
	if _, err := w.Write(value); err != nil {
		return nil, fmt.Errorf("sealing %s: %w", key, err)
	}
	if err := w.Close(); err != nil {
		return nil, fmt.Errorf("sealing %s: %w", key, err)
	}
	return out.Bytes(), nil
}

// UnsealValue opens a value sealed for Secret namespace/name under key.
// Its errors never hold the value.
func (i *Identity) UnsealValue(namespace, name, key string, sealed []byte) ([]byte, error) {
	end := bytes.Index(sealed, []byte("\n--- "))
	if end < 0 || end > maxHeaderBytes {
		return nil, fmt.Errorf("key %q: not a sealed value (no age header within %d bytes)", key, maxHeaderBytes)
	}
	r, err := age.Decrypt(bytes.NewReader(sealed), i.id)
	if err != nil {
		var none *age.NoIdentityMatchError
		if errors.As(err, &none) {
			return nil, fmt.Errorf("key %q: not sealed to this node's key %s", key, i.keyID)
		}
		return nil, fmt.Errorf("key %q: %w", key, err)
	}
	plain, err := io.ReadAll(io.LimitReader(r, int64(len(sealed))))
	if err != nil {
		return nil, fmt.Errorf("key %q: %w", key, err)
	}
	want := binding(namespace, name, key)
	if !bytes.HasPrefix(plain, want) {
		return nil, fmt.Errorf("key %q: sealed for another Secret or key (a sealed value only opens as the value it was sealed for)", key)
	}
	return plain[len(want):], nil
}

// IsSealed reports whether a Secret says it is sealed.
func IsSealed(sec *v1.Secret) bool {
	_, ok := sec.Annotations[AnnotationSealedTo]
	return ok
}

// UnsealSecret replaces every value of a sealed Secret's data by its
// plaintext and removes the annotation; the Secret must be sealed to this
// identity and carry no stringData. On an error sec is unchanged.
func (i *Identity) UnsealSecret(sec *v1.Secret) error {
	ids := strings.Split(sec.Annotations[AnnotationSealedTo], ",")
	found := false
	for _, id := range ids {
		found = found || strings.TrimSpace(id) == i.keyID
	}
	if !found {
		return fmt.Errorf("sealed to key(s) %q, this node's sealing key is %s (read the node's state topic again)", sec.Annotations[AnnotationSealedTo], i.keyID)
	}
	if len(sec.StringData) > 0 {
		return errors.New("a sealed Secret carries its values in data only, stringData must be empty")
	}
	plain := make(map[string][]byte, len(sec.Data))
	for k, v := range sec.Data {
		p, err := i.UnsealValue(sec.Namespace, sec.Name, k, v)
		if err != nil {
			return err
		}
		plain[k] = p
	}
	sec.Data = plain
	delete(sec.Annotations, AnnotationSealedTo)
	if len(sec.Annotations) == 0 {
		sec.Annotations = nil
	}
	return nil
}
