package cri

import (
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// The preStop handler recorded on a container resolves its named port (a
// deleted pod has no spec left to resolve it) and reads back the same.
func TestPreStopRecordedWithPortResolved(t *testing.T) {
	c := &v1.Container{Name: "main", Ports: []v1.ContainerPort{{Name: "web", ContainerPort: 8080}},
		Lifecycle: &v1.Lifecycle{PreStop: &v1.LifecycleHandler{HTTPGet: &v1.HTTPGetAction{Path: "/bye", Port: intstr.FromString("web")}}}}
	s, err := preStopAnnotation(c)
	if err != nil {
		t.Fatal(err)
	}
	h := parsePreStop(s)
	if h == nil || h.HTTPGet == nil || h.HTTPGet.Port.Type != intstr.Int || h.HTTPGet.Port.IntValue() != 8080 || h.HTTPGet.Path != "/bye" {
		t.Fatalf("recorded %q, read back %+v; want GET /bye on port 8080", s, h)
	}
	if c.Lifecycle.PreStop.HTTPGet.Port.Type != intstr.String {
		t.Fatal("recording changed the spec")
	}
	c.Lifecycle.PreStop.HTTPGet.Port = intstr.FromString("nope")
	if _, err := preStopAnnotation(c); err == nil {
		t.Fatal("an unknown named port was recorded")
	}
	if s, err := preStopAnnotation(&v1.Container{Name: "plain"}); s != "" || err != nil {
		t.Fatalf("no hook: %q %v", s, err)
	}
	if parsePreStop("{not json") != nil || parsePreStop("") != nil {
		t.Fatal("a bad or empty annotation gave a handler")
	}
}
