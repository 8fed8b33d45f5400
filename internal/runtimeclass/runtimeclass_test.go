package runtimeclass

import (
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

func TestHandlerAdmitFits(t *testing.T) {
	set, err := New([]Class{
		{Name: "b", Handler: "runc-b", Overhead: v1.ResourceList{v1.ResourceMemory: resource.MustParse("16Mi")}},
		{Name: "edge", Handler: "crun", NodeSelector: map[string]string{"tier": "edge"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := New([]Class{{Name: "x"}, {Name: "x"}}); err == nil {
		t.Fatal("a name given twice was taken")
	}
	name := func(s string) *string { return &s }
	tests := []struct {
		name        string
		class       *string
		overhead    v1.ResourceList
		labels      map[string]string
		handler     string
		handlerErr  string
		admitErr    string
		fits        string
		setOverhead string
	}{
		{name: "no class", handler: ""},
		{name: "no class with overhead", overhead: v1.ResourceList{v1.ResourceCPU: resource.MustParse("1m")}, admitErr: "spec.overhead: Forbidden"},
		{name: "class with overhead", class: name("b"), handler: "runc-b", setOverhead: "16Mi"},
		{name: "same overhead given", class: name("b"), overhead: v1.ResourceList{v1.ResourceMemory: resource.MustParse("16Mi")}, handler: "runc-b", setOverhead: "16Mi"},
		{name: "other overhead", class: name("b"), overhead: v1.ResourceList{v1.ResourceMemory: resource.MustParse("1Mi")}, handler: "runc-b", admitErr: "spec.overhead: Invalid value"},
		{name: "unknown", class: name("kata"), handlerErr: `RuntimeClass "kata" not found`, admitErr: `spec.runtimeClassName: Not found: "kata"`, fits: `RuntimeClass "kata" not found`},
		{name: "selector matched", class: name("edge"), labels: map[string]string{"tier": "edge"}, handler: "crun"},
		{name: "selector not matched", class: name("edge"), labels: map[string]string{"tier": "core"}, handler: "crun", fits: `didn't match the scheduling.nodeSelector of RuntimeClass "edge"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pod := &v1.Pod{Spec: v1.PodSpec{RuntimeClassName: tt.class, Overhead: tt.overhead}}
			h, err := set.Handler(pod)
			if tt.handlerErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.handlerErr) {
					t.Fatalf("Handler err %v, want %q", err, tt.handlerErr)
				}
			} else if err != nil || h != tt.handler {
				t.Fatalf("Handler = %q, %v; want %q", h, err, tt.handler)
			}
			errs := set.Admit(pod)
			got := errs.ToAggregate()
			switch {
			case tt.admitErr == "" && got != nil:
				t.Fatalf("Admit: %v", got)
			case tt.admitErr != "" && (got == nil || !strings.Contains(got.Error(), tt.admitErr)):
				t.Fatalf("Admit: %v, want %q", got, tt.admitErr)
			}
			if tt.setOverhead != "" && pod.Spec.Overhead.Memory().String() != tt.setOverhead {
				t.Fatalf("overhead %v, want memory %s", pod.Spec.Overhead, tt.setOverhead)
			}
			if f := set.Fits(pod, tt.labels); (tt.fits == "") != (f == "") || !strings.Contains(f, tt.fits) {
				t.Fatalf("Fits = %q, want %q", f, tt.fits)
			}
		})
	}
}
