package statusmgr

import (
	"bytes"
	"encoding/json"
	"sync"
	"testing"

	"github.com/rs/zerolog"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/mqlet/mqlet/agent/retained"
	apiv1 "github.com/mqlet/mqlet/api/v1"
	"github.com/mqlet/mqlet/mqtt/outbox"
)

type capture struct {
	mu   sync.Mutex
	msgs []outbox.Message
}

// Set and Clear publish as the node's registry of retained topics does.
func (c *capture) Set(topic string, payload []byte) error {
	return c.Put(retained.Message(topic, payload))
}
func (c *capture) Clear(topic string) error { return c.Put(retained.Message(topic, nil)) }

func (c *capture) Put(m outbox.Message) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.msgs = append(c.msgs, m)
	return nil
}

func pod() *v1.Pod {
	return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default", UID: "u1", Generation: 1},
		Spec: v1.PodSpec{Containers: []v1.Container{{Name: "c", Image: "busybox"}}}}
}

func TestPublishesOnlyOnChangeAndClearsOnRemove(t *testing.T) {
	c := &capture{}
	m := New(apiv1.Scheme{Prefix: "mqlet/v1", Node: "n1"}, c, nil, zerolog.Nop())
	p := pod()
	pending := v1.PodStatus{Phase: v1.PodPending}
	for range 3 {
		if err := m.Set(p, pending); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.Set(p, v1.PodStatus{Phase: v1.PodRunning}); err != nil {
		t.Fatal(err)
	}
	if len(c.msgs) != 2 {
		t.Fatalf("want 2 publishes (pending, running), got %d", len(c.msgs))
	}
	first := c.msgs[0]
	if first.Topic != "mqlet/v1/n1/pods/default/web" || !first.Retained || first.QoS != 1 {
		t.Fatalf("wrong message envelope %+v", first)
	}
	var decoded v1.Pod
	dec := json.NewDecoder(bytes.NewReader(c.msgs[1].Payload))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&decoded); err != nil {
		t.Fatalf("payload is not a strict v1.Pod: %v", err)
	}
	if decoded.Status.Phase != v1.PodRunning || decoded.Kind != "Pod" || decoded.UID != "u1" {
		t.Fatalf("decoded %+v", decoded)
	}
	if got, ok := m.Get("default", "web"); !ok || got.Status.Phase != v1.PodRunning {
		t.Fatal("Get does not return the latest status")
	}
	if err := m.Remove("default", "web"); err != nil {
		t.Fatal(err)
	}
	last := c.msgs[len(c.msgs)-1]
	if len(last.Payload) != 0 || !last.Retained {
		t.Fatalf("remove must publish an empty retained payload, got %+v", last)
	}
	if _, ok := m.Get("default", "web"); ok {
		t.Fatal("removed pod still known")
	}
	if pub, skip := m.Stats(); pub != 2 || skip != 2 {
		t.Fatalf("stats published=%d skipped=%d", pub, skip)
	}
}

type memLedger struct {
	mu sync.Mutex
	kv map[string][]byte
}

func (l *memLedger) Meta(k string) ([]byte, bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	v, ok := l.kv[k]
	return v, ok, nil
}

func (l *memLedger) SetMeta(k string, v []byte) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.kv[k] = v
	return nil
}

func TestStaleStatusesOfAnEarlierRunAreCleared(t *testing.T) {
	ledger := &memLedger{kv: map[string][]byte{}}
	scheme := apiv1.Scheme{Prefix: "mqlet/v1", Node: "n1"}
	first := New(scheme, &capture{}, ledger, zerolog.Nop())
	for _, name := range []string{"keep", "gone", "deleted"} {
		p := pod()
		p.Name = name
		if err := first.Set(p, v1.PodStatus{Phase: v1.PodRunning}); err != nil {
			t.Fatal(err)
		}
	}
	if err := first.Remove("default", "deleted"); err != nil {
		t.Fatal(err)
	}

	// The next run of mqlet: only "keep" is still desired.
	c := &capture{}
	second := New(scheme, c, ledger, zerolog.Nop())
	n, err := second.ClearStale(func(key string) bool { return key == "default/keep" })
	if err != nil || n != 1 {
		t.Fatalf("cleared %d (%v), want 1", n, err)
	}
	if len(c.msgs) != 1 || c.msgs[0].Topic != "mqlet/v1/n1/pods/default/gone" || len(c.msgs[0].Payload) != 0 || !c.msgs[0].Retained {
		t.Fatalf("want one empty retained message for default/gone, got %+v", c.msgs)
	}
	if n, _ := second.ClearStale(func(string) bool { return false }); n != 1 {
		t.Fatalf("after clearing, only keep remains in the ledger; cleared %d", n)
	}
}

// Retained tells the pod workers which pods an earlier run left a status
// for (the ledger), less those removed since, plus those set in this run.
func TestRetainedFollowsTheLedgerAndThisRun(t *testing.T) {
	ledger := &memLedger{kv: map[string][]byte{}}
	scheme := apiv1.Scheme{Prefix: "mqlet/v1", Node: "n1"}
	first := New(scheme, &capture{}, ledger, zerolog.Nop())
	for _, name := range []string{"kept", "removed"} {
		p := pod()
		p.Name = name
		if err := first.Set(p, v1.PodStatus{Phase: v1.PodRunning}); err != nil {
			t.Fatal(err)
		}
	}

	second := New(scheme, &capture{}, ledger, zerolog.Nop())
	if !second.Retained("default", "kept") || !second.Retained("default", "removed") || second.Retained("default", "never") {
		t.Fatal("the earlier run's statuses are not all seen as retained")
	}
	if err := second.Remove("default", "removed"); err != nil {
		t.Fatal(err)
	}
	p := pod()
	p.Name = "new"
	if err := second.Set(p, v1.PodStatus{Phase: v1.PodPending}); err != nil {
		t.Fatal(err)
	}
	if second.Retained("default", "removed") || !second.Retained("default", "new") || !second.Retained("default", "kept") {
		t.Fatal("Retained does not follow this run's removals and sets")
	}
	if New(scheme, &capture{}, nil, zerolog.Nop()).Retained("default", "kept") {
		t.Fatal("without a ledger nothing is retained from earlier runs")
	}
}
