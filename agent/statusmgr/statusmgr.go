// Package statusmgr publishes each pod's status on its retained topic,
// only when the payload changes, with a periodic full resync, and clears the
// topic when the pod is gone. It also answers "what is the status now".
package statusmgr

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"sync"

	"github.com/rs/zerolog"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	apiv1 "github.com/mqlet/mqlet/api/v1"
	"github.com/mqlet/mqlet/internal/liveperiod"
)

// Retained is where pod statuses are published: the node's registry of
// retained topics (agent/retained), which owns how.
type Retained interface {
	Set(topic string, payload []byte) error
	Clear(topic string) error
}

type entry struct {
	pod     *v1.Pod
	payload []byte
}

// Ledger persists the set of pods whose status topic holds a retained
// value, so a restarted mqlet can clear the ones no longer desired.
type Ledger interface {
	Meta(key string) ([]byte, bool, error)
	SetMeta(key string, value []byte) error
}

const ledgerKey = "statusmgr/published-pods"

// Manager keeps the latest published status of every pod. Safe for concurrent use.
type Manager struct {
	topics apiv1.Scheme
	out    Retained
	ledger Ledger
	log    zerolog.Logger

	mu   sync.Mutex
	pods map[string]entry // key "namespace/name"

	ledgerMu sync.Mutex      // serialises read-modify-write of the ledger
	earlier  map[string]bool // the ledger as this process found it, less the pods removed since; nil until read

	published, skipped uint64
}

// New returns a Manager publishing through out; ledger may be nil.
func New(topics apiv1.Scheme, out Retained, ledger Ledger, log zerolog.Logger) *Manager {
	return &Manager{topics: topics, out: out, ledger: ledger, log: log, pods: map[string]entry{}}
}

// ClearStale clears the retained status of every pod published by an
// earlier run that is not desired any more (isDesired gets "ns/name").
func (m *Manager) ClearStale(isDesired func(key string) bool) (int, error) {
	if m.ledger == nil {
		return 0, nil
	}
	raw, ok, err := m.ledger.Meta(ledgerKey)
	if err != nil || !ok {
		return 0, err
	}
	var keys []string
	if err := json.Unmarshal(raw, &keys); err != nil {
		return 0, fmt.Errorf("reading the published-pods ledger: %w", err)
	}
	cleared := 0
	for _, key := range keys {
		if isDesired(key) {
			continue
		}
		ns, name, _ := strings.Cut(key, "/")
		if err := m.Remove(ns, name); err != nil {
			return cleared, err
		}
		cleared++
	}
	return cleared, nil
}

// Retained reports whether the pod's topic holds a retained status: one
// this process set, or one an earlier process published (the ledger) and
// nobody removed since. The pod workers keep that last known view instead
// of publishing a status built without the runtime.
func (m *Manager) Retained(namespace, name string) bool {
	key := namespace + "/" + name
	m.mu.Lock()
	_, ok := m.pods[key]
	m.mu.Unlock()
	if ok {
		return true
	}
	if m.ledger == nil {
		return false
	}
	m.ledgerMu.Lock()
	defer m.ledgerMu.Unlock()
	if m.earlier == nil {
		raw, found, err := m.ledger.Meta(ledgerKey)
		if err != nil {
			m.log.Warn().Err(err).Msg("reading the published-pods ledger")
			return false
		}
		m.earlier = map[string]bool{}
		var keys []string
		if found && json.Unmarshal(raw, &keys) == nil {
			for _, k := range keys {
				m.earlier[k] = true
			}
		}
	}
	return m.earlier[key]
}

// record updates the ledger when the set of published pods changes.
func (m *Manager) record(key string, present bool) {
	if m.ledger == nil {
		return
	}
	m.ledgerMu.Lock()
	defer m.ledgerMu.Unlock()
	if !present && m.earlier != nil {
		delete(m.earlier, key)
	}
	set := map[string]bool{}
	if raw, ok, err := m.ledger.Meta(ledgerKey); err == nil && ok {
		var keys []string
		if json.Unmarshal(raw, &keys) == nil {
			for _, k := range keys {
				set[k] = true
			}
		}
	}
	if set[key] == present {
		return
	}
	if present {
		set[key] = true
	} else {
		delete(set, key)
	}
	keys := make([]string, 0, len(set))
	for k := range set {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	raw, _ := json.Marshal(keys)
	if err := m.ledger.SetMeta(ledgerKey, raw); err != nil {
		m.log.Warn().Err(err).Msg("recording published pods")
	}
}

// Set records the status of pod (its desired spec) and publishes it when
// the payload differs from the last one published.
func (m *Manager) Set(pod *v1.Pod, status v1.PodStatus) error {
	full := &v1.Pod{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{
			Name:              pod.Name,
			Namespace:         pod.Namespace,
			UID:               pod.UID,
			Generation:        pod.Generation,
			CreationTimestamp: pod.CreationTimestamp,
			// Set while a deleted pod terminates (Terminating).
			DeletionTimestamp:          pod.DeletionTimestamp,
			DeletionGracePeriodSeconds: pod.DeletionGracePeriodSeconds,
			Labels:                     pod.Labels,
			Annotations:                pod.Annotations,
		},
		Spec:   pod.Spec,
		Status: status,
	}
	payload, err := json.Marshal(full)
	if err != nil {
		return fmt.Errorf("encoding status of pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	key := pod.Namespace + "/" + pod.Name
	m.mu.Lock()
	if old, ok := m.pods[key]; ok && bytes.Equal(old.payload, payload) {
		m.skipped++
		m.mu.Unlock()
		return nil
	}
	_, known := m.pods[key]
	m.pods[key] = entry{pod: full, payload: payload}
	m.published++
	m.mu.Unlock()
	if !known {
		m.record(key, true)
	}
	m.log.Debug().Str("pod", key).Str("phase", string(status.Phase)).Msg("pod status changed")
	return m.put(pod.Namespace, pod.Name, payload)
}

// Remove clears the pod's retained topic with an empty payload. It does so
// even when this process never published the pod: a pod deleted while
// mqlet was down still has a retained status at the broker.
func (m *Manager) Remove(namespace, name string) error {
	m.mu.Lock()
	delete(m.pods, namespace+"/"+name)
	m.mu.Unlock()
	if err := m.put(namespace, name, nil); err != nil {
		return err
	}
	m.record(namespace+"/"+name, false)
	return nil
}

// ClearForeign clears the retained status topic of a pod this node does
// not hold (not desired, not set by this process, not in the ledger): a
// broker user can publish a fake retained status on the node's topics,
// which would otherwise be taken as the node's word and survive restarts.
// It reports whether it cleared the topic.
func (m *Manager) ClearForeign(namespace, name string, desired bool) (bool, error) {
	if desired || m.Retained(namespace, name) {
		return false, nil
	}
	// Under the lock, so a status Set for the pod meanwhile is queued
	// after this clear, never before it.
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.pods[namespace+"/"+name]; ok {
		return false, nil
	}
	return true, m.put(namespace, name, nil)
}

// Get returns the last status set for the pod.
func (m *Manager) Get(namespace, name string) (*v1.Pod, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.pods[namespace+"/"+name]
	if !ok {
		return nil, false
	}
	return e.pod.DeepCopy(), true
}

// Terminating returns the pods published with a deletion timestamp: deleted
// from the desired state, still in their grace period.
func (m *Manager) Terminating() []*v1.Pod {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []*v1.Pod
	for _, e := range m.pods {
		if e.pod.DeletionTimestamp != nil {
			out = append(out, e.pod.DeepCopy())
		}
	}
	return out
}

// Stats returns how many statuses were published and how many unchanged ones were skipped.
func (m *Manager) Stats() (published, skipped uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.published, m.skipped
}

// Resync republishes every known status.
func (m *Manager) Resync() {
	m.mu.Lock()
	all := make(map[string]entry, len(m.pods))
	for k, e := range m.pods {
		all[k] = e
	}
	m.mu.Unlock()
	for _, e := range all {
		if err := m.put(e.pod.Namespace, e.pod.Name, e.payload); err != nil {
			m.log.Warn().Err(err).Msg("resyncing pod status")
		}
	}
}

// Run resyncs every interval until ctx ends.
func (m *Manager) Run(ctx context.Context, interval liveperiod.Source) {
	interval.Every(ctx, m.Resync)
}

func (m *Manager) put(namespace, name string, payload []byte) error {
	topic := m.topics.Pod(namespace, name)
	var err error
	if len(payload) == 0 {
		err = m.out.Clear(topic)
	} else {
		err = m.out.Set(topic, payload)
	}
	if err != nil {
		return fmt.Errorf("queueing status of pod %s/%s: %w", namespace, name, err)
	}
	return nil
}
