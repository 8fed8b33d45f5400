package cri

import (
	"testing"

	v1 "k8s.io/api/core/v1"
)

func TestContainerGracePrefersOverrideThenSpecThenRecorded(t *testing.T) {
	i := func(v int64) *int64 { return &v }
	withSpec := &v1.Pod{Spec: v1.PodSpec{TerminationGracePeriodSeconds: i(7)}}
	specless := &v1.Pod{} // killed by ref: only the runtime labels are known
	recorded := ContainerStatus{GracePeriod: i(2)}
	cases := []struct {
		name     string
		pod      *v1.Pod
		c        ContainerStatus
		override *int64
		want     int64
	}{
		{"override wins", withSpec, recorded, i(0), 0},
		{"spec next", withSpec, recorded, nil, 7},
		{"recorded when no spec", specless, recorded, nil, 2},
		{"nil pod uses recorded", nil, recorded, nil, 2},
		{"default when nothing known", specless, ContainerStatus{}, nil, defaultStopGracePeriod},
	}
	for _, c := range cases {
		if got := containerGrace(c.pod, c.c, c.override); got != c.want {
			t.Errorf("%s: grace %d, want %d", c.name, got, c.want)
		}
	}
	if parseGrace("5") == nil || *parseGrace("5") != 5 || parseGrace("") != nil || parseGrace("-1") != nil || parseGrace("x") != nil {
		t.Fatal("parseGrace wrong")
	}
}

func TestNormalizeImage(t *testing.T) {
	for in, want := range map[string]string{
		"busybox":                      "docker.io/library/busybox:latest",
		"busybox:1.36":                 "docker.io/library/busybox:1.36",
		"mqlet/busybox:test":           "docker.io/mqlet/busybox:test",
		"docker.io/mqlet/busybox:test": "docker.io/mqlet/busybox:test",
		"registry.local:5000/app":      "registry.local:5000/app:latest",
		"localhost/app:v1":             "localhost/app:v1",
		"quay.io/x/y@sha256:abc":       "quay.io/x/y@sha256:abc",
		"registry.k8s.io/pause:3.9":    "registry.k8s.io/pause:3.9",
	} {
		if got := NormalizeImage(in); got != want {
			t.Errorf("NormalizeImage(%q) = %q, want %q", in, got, want)
		}
	}
}
