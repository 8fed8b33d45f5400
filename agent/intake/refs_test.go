package intake

import (
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/mqlet/mqlet/agent/store"
)

func TestUsersOf(t *testing.T) {
	pod := func(ns, name string, vols []v1.Volume, env []v1.EnvVar) *v1.Pod {
		return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: v1.PodSpec{Volumes: vols, Containers: []v1.Container{{Name: "c", Env: env}}}}
	}
	cmVol := []v1.Volume{{Name: "v", VolumeSource: v1.VolumeSource{ConfigMap: &v1.ConfigMapVolumeSource{LocalObjectReference: v1.LocalObjectReference{Name: "cfg"}}}}}
	projSecret := []v1.Volume{{Name: "v", VolumeSource: v1.VolumeSource{Projected: &v1.ProjectedVolumeSource{Sources: []v1.VolumeProjection{
		{Secret: &v1.SecretProjection{LocalObjectReference: v1.LocalObjectReference{Name: "sec"}}}}}}}}
	envSecret := []v1.EnvVar{{Name: "X", ValueFrom: &v1.EnvVarSource{SecretKeyRef: &v1.SecretKeySelector{LocalObjectReference: v1.LocalObjectReference{Name: "sec"}, Key: "k"}}}}
	pods := []*v1.Pod{
		pod("a", "uses-cm", cmVol, nil),
		pod("b", "other-ns", cmVol, nil),
		pod("a", "proj-secret", projSecret, nil),
		pod("a", "env-secret", nil, envSecret),
		pod("a", "nothing", nil, nil),
	}
	cases := []struct {
		changes []store.Change
		want    []string
	}{
		{[]store.Change{{Kind: store.KindConfigMap, Key: "a/cfg", Action: store.Updated}}, []string{"a/uses-cm"}},
		{[]store.Change{{Kind: store.KindSecret, Key: "a/sec", Action: store.Deleted}}, []string{"a/proj-secret", "a/env-secret"}},
		{[]store.Change{{Kind: store.KindConfigMap, Key: "a/cfg", Action: store.Unchanged}}, nil},
		{[]store.Change{{Kind: store.KindPod, Key: "a/uses-cm", Action: store.Updated}}, nil},
		// The same name as a Secret is not the ConfigMap.
		{[]store.Change{{Kind: store.KindSecret, Key: "a/cfg", Action: store.Created}}, nil},
	}
	for i, c := range cases {
		got := usersOf(c.changes, pods)
		if !slices.Equal(got, c.want) {
			t.Errorf("case %d: %v, want %v", i, got, c.want)
		}
	}
}
