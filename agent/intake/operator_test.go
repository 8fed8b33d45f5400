package intake

import (
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// pickContainer names what it refuses: an unknown container, a pod with
// several containers and none named, and an init container (a sidecar too)
// where only app containers may be named.
func TestPickContainer(t *testing.T) {
	always := v1.ContainerRestartPolicyAlways
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p"}, Spec: v1.PodSpec{
		InitContainers: []v1.Container{{Name: "setup"}, {Name: "proxy", RestartPolicy: &always}},
		Containers:     []v1.Container{{Name: "web"}, {Name: "worker"}},
	}}
	cases := []struct {
		name     string
		withInit bool
		want     string // the name picked, or a part of the error
		ok       bool
	}{
		{"web", false, "web", true},
		{"proxy", true, "proxy", true},
		{"proxy", false, `container "proxy" of pod ns/p is an init container (or sidecar); only an app container can be named here: web, worker`, false},
		{"setup", false, "is an init container", false},
		{"nope", false, `container "nope" not found in pod ns/p (containers: web, worker)`, false},
		{"", false, "has 2 containers: name one of web, worker", false},
	}
	for _, c := range cases {
		got, err := pickContainer(pod, c.name, c.withInit)
		switch {
		case c.ok && (err != nil || got != c.want):
			t.Errorf("pickContainer(%q, %v) = %q, %v; want %q", c.name, c.withInit, got, err, c.want)
		case !c.ok && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("pickContainer(%q, %v) error %v; want one containing %q", c.name, c.withInit, err, c.want)
		}
	}
}
