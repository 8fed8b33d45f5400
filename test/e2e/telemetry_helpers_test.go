package e2e

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	statsv1alpha1 "k8s.io/kubelet/pkg/apis/stats/v1alpha1"

	apiv1 "github.com/mqlet/mqlet/api/v1"
)

// Telemetry intervals of the agents under test, short enough to watch.
const (
	telMetricsInterval    = 2 * time.Second
	telNodeStatusInterval = 2 * time.Second
)

// telTestConfig makes relists and crash loops fast; the intervals come as
// flags, which must win over the file.
func telTestConfig(logDir string) string {
	return fmt.Sprintf(`runtime:
  plegPeriod: 300ms
  podLogDir: %s
pods:
  backoffBase: 1s
  backoffMax: 8s
`, logDir)
}

// newTelEnv is newPodEnv with metrics and node status every 2 s.
func newTelEnv(t *testing.T) *podEnv {
	t.Helper()
	return startPodEnv(t, telTestConfig,
		"--metrics-interval", telMetricsInterval.String(), "--node-status-interval", telNodeStatusInterval.String())
}

// telState is the documented payload of the state topic, field for field.
type telState struct {
	State     string    `json:"state"`
	BootID    string    `json:"bootId"`
	Seq       uint64    `json:"seq"`
	Version   string    `json:"version"`
	StartedAt time.Time `json:"startedAt"`
	TS        time.Time `json:"ts"`
	// SealingKey is the node's public key for sealed Secrets (age1...).
	SealingKey string `json:"sealingKey"`
	// Groups are the node's groups (absent when it is in none).
	Groups []string `json:"groups"`
}

// decodeStrict decodes exactly one JSON value into v, refusing unknown
// fields and anything after the value.
func decodeStrict(payload []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return fmt.Errorf("data after the JSON value (%v)", err)
	}
	return nil
}

// topicKind names the telemetry kind of topic under node, "" when the
// topic is not part of the contract.
func topicKind(node, topic string) string {
	rest, ok := strings.CutPrefix(topic, prefix+"/"+node+"/")
	if !ok {
		return ""
	}
	parts := strings.Split(rest, "/")
	switch {
	case len(parts) == 1 && (parts[0] == "state" || parts[0] == "node" || parts[0] == "events" || parts[0] == "metrics"):
		return parts[0]
	case len(parts) == 3 && parts[0] == "pods" && parts[1] != "" && parts[2] != "":
		return "pods"
	case len(parts) == 2 && parts[0] == "reply" && parts[1] != "":
		return "reply"
	case len(parts) >= 2 && parts[0] == "cmd":
		return "cmd" // our own commands, echoed by the # subscription
	}
	return ""
}

// decodeTelemetry strictly decodes one message by its topic.
func decodeTelemetry(node string, m Msg) (kind string, err error) {
	kind = topicKind(node, m.Topic)
	switch kind {
	case "state":
		var s telState
		err = decodeStrict(m.Payload, &s)
		if err == nil && (s.State != "online" && s.State != "offline" || s.BootID == "" || s.StartedAt.IsZero() || s.TS.IsZero() || !strings.HasPrefix(s.SealingKey, "age1")) {
			err = fmt.Errorf("state message lacks documented values: %+v", s)
		}
	case "node":
		var n v1.Node
		err = decodeStrict(m.Payload, &n)
	case "pods":
		if len(m.Payload) == 0 {
			return kind, nil // a deleted pod's cleared topic
		}
		var p v1.Pod
		err = decodeStrict(m.Payload, &p)
	case "events":
		var ev v1.Event
		err = decodeStrict(m.Payload, &ev)
	case "metrics":
		var s statsv1alpha1.Summary
		err = decodeStrict(m.Payload, &s)
	case "reply":
		var r apiv1.Reply
		err = decodeStrict(m.Payload, &r)
	case "cmd":
	default:
		err = errors.New("topic is not in the contract")
	}
	return kind, err
}

// events returns every event published since mark, decoded.
func (e *podEnv) events(from int) []v1.Event {
	e.t.Helper()
	var out []v1.Event
	for _, m := range e.mq.Messages()[from:] {
		if m.Topic != prefix+"/"+e.node+"/events" {
			continue
		}
		var ev v1.Event
		if err := json.Unmarshal(m.Payload, &ev); err != nil {
			e.t.Fatalf("event is not a v1.Event: %v: %s", err, m.Payload)
		}
		out = append(out, ev)
	}
	return out
}

// podStatuses returns every non-empty status of pod name published, in order.
func (e *podEnv) podStatuses(name string) []v1.Pod {
	e.t.Helper()
	var out []v1.Pod
	for _, m := range e.mq.Messages() {
		if m.Topic != e.podTopic(name) || len(m.Payload) == 0 {
			continue
		}
		var p v1.Pod
		if err := json.Unmarshal(m.Payload, &p); err != nil {
			e.t.Fatalf("pod status is not a v1.Pod: %v: %s", err, m.Payload)
		}
		out = append(out, p)
	}
	return out
}

// nodeCondition returns the condition t of a node message.
func nodeCondition(n *v1.Node, t v1.NodeConditionType) *v1.NodeCondition {
	for i := range n.Status.Conditions {
		if n.Status.Conditions[i].Type == t {
			return &n.Status.Conditions[i]
		}
	}
	return nil
}

// waitNode waits for a node message at or after from that satisfies cond.
func (e *podEnv) waitNode(from int, timeout time.Duration, what string, cond func(*v1.Node) bool) (*v1.Node, Msg) {
	e.t.Helper()
	var got v1.Node
	m := e.mq.WaitFor(from, timeout, "node "+what, func(m Msg) bool {
		if m.Topic != prefix+"/"+e.node+"/node" {
			return false
		}
		var n v1.Node
		if json.Unmarshal(m.Payload, &n) != nil || !cond(&n) {
			return false
		}
		got = n
		return true
	})
	return &got, m
}

// percentile returns the p-th percentile (nearest rank) of ds.
func percentile(ds []time.Duration, p float64) time.Duration {
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	rank := int(p/100*float64(len(s))+0.999999) - 1
	return s[max(0, min(rank, len(s)-1))]
}

// The strict decoder really refuses what the contract forbids.
func TestDecodeStrictRefusesUnknownFields(t *testing.T) {
	var p v1.Pod
	if err := decodeStrict([]byte(`{"metadata":{"name":"a"},"status":{"phase":"Running","nope":1}}`), &p); err == nil {
		t.Error("an unknown field decoded")
	}
	if err := decodeStrict([]byte(`{"metadata":{"name":"a"}}{}`), &p); err == nil {
		t.Error("trailing data decoded")
	}
	if err := decodeStrict([]byte(`{"metadata":{"name":"a"}}`), &p); err != nil || p.Name != "a" {
		t.Errorf("a valid pod: %v", err)
	}
	if _, err := decodeTelemetry("n", Msg{Topic: prefix + "/n/pods/ns", Payload: []byte(`{}`)}); err == nil {
		t.Error("a topic outside the contract was accepted")
	}
	if _, err := decodeTelemetry("n", Msg{Topic: prefix + "/n/state", Payload: []byte(`{"state":"online","bootId":"b","seq":1,"version":"v","startedAt":"2026-01-01T00:00:00Z","ts":"2026-01-01T00:00:00Z","extra":1}`)}); err == nil {
		t.Error("a state with an undocumented field was accepted")
	}
}
