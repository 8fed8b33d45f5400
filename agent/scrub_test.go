package agent

import (
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/mqlet/mqlet/internal/redact"
)

type capturedEvents struct{ msgs []string }

func (c *capturedEvents) ObjectEvent(_ v1.ObjectReference, _, reason, message string) {
	c.msgs = append(c.msgs, reason+": "+message)
}

// A probe's output is the container's text: scrubbed with its pod's
// scrubber, and only the message (the reason is the protocol's word).
func TestProbeEventsAreScrubbedWithTheirPodsSecrets(t *testing.T) {
	var next capturedEvents
	s := redact.New("Unhealthy", "hunter2-value")
	ev := podScrubbingEvents{next: &next, scrub: func(ns, name string) *redact.Scrubber {
		if ns == "ns" && name == "p" {
			return s
		}
		return nil
	}}
	ev.ObjectEvent(v1.ObjectReference{Namespace: "ns", Name: "p"}, v1.EventTypeWarning, "Unhealthy", "Liveness probe failed: hunter2-value")
	ev.ObjectEvent(v1.ObjectReference{Namespace: "ns", Name: "other"}, v1.EventTypeWarning, "Unhealthy", "Liveness probe failed: hunter2-value")
	if next.msgs[0] != "Unhealthy: Liveness probe failed: "+redact.Placeholder {
		t.Fatalf("own pod: %q", next.msgs[0])
	}
	if next.msgs[1] != "Unhealthy: Liveness probe failed: hunter2-value" {
		t.Fatalf("a pod not given the secret is not scrubbed of it (no oracle): %q", next.msgs[1])
	}
}
