package redact

import (
	"bytes"
	"encoding/json"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
)

// SecretSource is where a Live scrubber takes the node's secrets from (the
// desired-state store).
type SecretSource interface {
	// SecretsVersion changes whenever the set of secrets may have changed.
	SecretsVersion() uint64
	ListSecrets() ([]*v1.Secret, error)
}

// RetiredStore keeps the retired values across restarts (the store, which
// seals them as it seals secrets). A SecretSource that is one is used.
type RetiredStore interface {
	RetiredSecrets() ([]byte, error)
	SetRetiredSecrets(plain []byte) error
}

// PodSource gives a desired pod's spec, so a pod's text is scrubbed of
// the secrets it refers to. A SecretSource that is one is used.
type PodSource interface {
	Pod(namespace, name string) (*v1.Pod, error)
}

// Live is a Scrubber kept current with a changing set of secrets: it is
// rebuilt when the source's version moves, so a value stored a moment ago
// is already scrubbed from the next log line or message. The zero value
// scrubs nothing until Bind. Safe for concurrent use.
type Live struct {
	mu   sync.Mutex // serialises rebuilds
	src  atomic.Pointer[liveSource]
	seen atomic.Uint64
	cur  atomic.Pointer[Scrubber]
	// last are the secrets of the last build by key; retired those
	// deleted or changed since (oldest first, at most MaxRetired, none
	// older than MaxRetiredAge), persisted through a RetiredStore: a
	// deleted or rotated value still sits in the runtime's records of
	// containers that ran with it (a last state's message, an old log)
	// and would be published again unscrubbed, also after a restart.
	last    map[string]*v1.Secret
	retired []retiredSecret
	loaded  bool
	now     func() time.Time

	podMu sync.Mutex
	pods  map[string]podScrubber // by "namespace/name"
}

type retiredSecret struct {
	Key  string            `json:"key"` // namespace/name
	At   time.Time         `json:"at"`
	Data map[string][]byte `json:"data"`
}

type podScrubber struct {
	version uint64
	names   string // the secrets referred to, sorted, joined
	s       *Scrubber
}

// Bounds of the retired values kept.
const (
	MaxRetired    = 256
	MaxRetiredAge = 7 * 24 * time.Hour
	maxPodCache   = 4096
)

type liveSource struct{ SecretSource }

// Bind makes src the source of secrets (nil: none).
func (l *Live) Bind(src SecretSource) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if src == nil {
		l.src.Store(nil)
	} else {
		l.src.Store(&liveSource{src})
	}
	l.seen.Store(0)
}

// Current returns the Scrubber for every secret value the node holds now
// and the retired ones (for mqlet's own log, which leaves the node only
// through its operator). When listing them fails, the last good one is
// kept (and retried next time).
func (l *Live) Current() *Scrubber {
	l.refresh()
	return l.cur.Load()
}

// refresh rebuilds after a change of the source's secrets.
func (l *Live) refresh() {
	src := l.src.Load()
	if src == nil {
		return
	}
	v := src.SecretsVersion()
	if v == l.seen.Load() {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if v == l.seen.Load() {
		return
	}
	secrets, err := src.ListSecrets()
	if err != nil {
		return
	}
	now := l.clock()
	rs, persist := src.SecretSource.(RetiredStore)
	if !l.loaded {
		l.loaded = true
		if persist {
			if raw, err := rs.RetiredSecrets(); err == nil && len(raw) > 0 {
				_ = json.Unmarshal(raw, &l.retired)
			}
		}
	}
	byKey := make(map[string]*v1.Secret, len(secrets))
	for _, s := range secrets {
		if s != nil {
			byKey[s.Namespace+"/"+s.Name] = s
		}
	}
	changed := false
	for key, old := range l.last {
		if s, ok := byKey[key]; !ok || !sameData(s, old) {
			l.retired = append(l.retired, retiredSecret{Key: key, At: now, Data: dataOf(old)})
			changed = true
		}
	}
	kept := l.retired[:0]
	for _, r := range l.retired {
		if now.Sub(r.At) <= MaxRetiredAge {
			kept = append(kept, r)
		} else {
			changed = true
		}
	}
	if n := len(kept); n > MaxRetired {
		kept, changed = kept[n-MaxRetired:], true
	}
	l.retired = append([]retiredSecret(nil), kept...)
	if changed && persist {
		if raw, err := json.Marshal(l.retired); err == nil {
			_ = rs.SetRetiredSecrets(raw) // kept in memory either way
		}
	}
	l.last = byKey
	all := append([]*v1.Secret(nil), secrets...)
	for _, r := range l.retired {
		all = append(all, &v1.Secret{Data: r.Data})
	}
	l.cur.Store(FromSecrets(all))
	l.seen.Store(v)
}

func (l *Live) clock() time.Time {
	if l.now != nil {
		return l.now()
	}
	return time.Now()
}

// dataOf is a secret's values as one map (stringData folded in).
func dataOf(s *v1.Secret) map[string][]byte {
	out := make(map[string][]byte, len(s.Data)+len(s.StringData))
	for k, v := range s.Data {
		out[k] = v
	}
	for k, v := range s.StringData {
		out[k] = []byte(v)
	}
	return out
}

// ForPod returns the Scrubber for text that came from pod namespace/name
// (its logs, exec output, termination messages, runtime errors): the
// current and retired values of the secrets that pod refers to, and no
// other. Scrubbing a pod's text with every secret of the node would be an
// oracle: a pod printing candidate values would learn which one is a
// secret it was never given by seeing it come back redacted. A pod no
// longer desired keeps the secrets it referred to when last seen.
func (l *Live) ForPod(namespace, name string) *Scrubber {
	l.refresh()
	src := l.src.Load()
	if src == nil {
		return nil
	}
	key := namespace + "/" + name
	var names []string
	pods, ok := src.SecretSource.(PodSource)
	found := false
	if ok {
		if pod, err := pods.Pod(namespace, name); err == nil && pod != nil {
			names, found = PodSecretNames(pod), true
		}
	}
	sort.Strings(names)
	names = slices.Compact(names)
	joined := strings.Join(names, "\x00")
	version := l.seen.Load()
	l.podMu.Lock()
	defer l.podMu.Unlock()
	if c, ok := l.pods[key]; ok && (!found || c.names == joined) && c.version == version {
		return c.s
	} else if ok && !found {
		joined, names = c.names, strings.Split(c.names, "\x00")
	}
	l.mu.Lock()
	var picked []*v1.Secret
	for _, n := range names {
		if n == "" {
			continue
		}
		k := namespace + "/" + n
		if s, ok := l.last[k]; ok {
			picked = append(picked, s)
		}
		for _, r := range l.retired {
			if r.Key == k {
				picked = append(picked, &v1.Secret{Data: r.Data})
			}
		}
	}
	l.mu.Unlock()
	s := FromSecrets(picked)
	if l.pods == nil || len(l.pods) >= maxPodCache {
		l.pods = map[string]podScrubber{}
	}
	l.pods[key] = podScrubber{version: version, names: joined, s: s}
	return s
}

// PodSecretNames lists the secrets pod refers to (pull secrets, volumes,
// projected volumes, env and envFrom).
func PodSecretNames(pod *v1.Pod) []string {
	var names []string
	for _, r := range pod.Spec.ImagePullSecrets {
		names = append(names, r.Name)
	}
	for _, vol := range pod.Spec.Volumes {
		if vol.Secret != nil {
			names = append(names, vol.Secret.SecretName)
		}
		if vol.Projected != nil {
			for _, src := range vol.Projected.Sources {
				if src.Secret != nil {
					names = append(names, src.Secret.Name)
				}
			}
		}
	}
	for _, list := range [][]v1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for _, c := range list {
			for _, from := range c.EnvFrom {
				if from.SecretRef != nil {
					names = append(names, from.SecretRef.Name)
				}
			}
			for _, e := range c.Env {
				if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
					names = append(names, e.ValueFrom.SecretKeyRef.Name)
				}
			}
		}
	}
	return names
}

func sameData(a, b *v1.Secret) bool {
	if len(a.Data) != len(b.Data) || len(a.StringData) != len(b.StringData) {
		return false
	}
	for k, v := range a.Data {
		if w, ok := b.Data[k]; !ok || !bytes.Equal(v, w) {
			return false
		}
	}
	for k, v := range a.StringData {
		if w, ok := b.StringData[k]; !ok || v != w {
			return false
		}
	}
	return true
}

// JSON returns doc with every known value removed from its string values,
// keeping it valid JSON: object keys (field, label and annotation names,
// never a value the node was given as secret) are left alone, so a stored
// secret whose value is a field name such as "name" or "kind" cannot break
// the structure of everything published. A doc that
// holds no value is returned as is; one that is not JSON is scrubbed as
// text.
func (s *Scrubber) JSON(doc []byte) []byte {
	if s.Len() == 0 || !s.Contains(string(doc)) {
		return doc
	}
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil || dec.More() {
		return []byte(s.String(string(doc)))
	}
	var out bytes.Buffer
	enc := json.NewEncoder(&out)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(s.scrubValue(v)); err != nil {
		return []byte(s.String(string(doc)))
	}
	clean := bytes.TrimSuffix(out.Bytes(), []byte("\n"))
	if bytes.HasSuffix(doc, []byte("\n")) {
		clean = append(clean, '\n')
	}
	return clean
}

func (s *Scrubber) scrubValue(v any) any {
	switch x := v.(type) {
	case string:
		return s.String(x)
	case []any:
		for i := range x {
			x[i] = s.scrubValue(x[i])
		}
		return x
	case map[string]any:
		for k, e := range x {
			x[k] = s.scrubValue(e)
		}
		return x
	}
	return v
}
