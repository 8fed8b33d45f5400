package eventlog

import (
	"fmt"
	"path/filepath"
	"testing"

	"github.com/rs/zerolog"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func event(name, pod string, count int32) *v1.Event {
	return &v1.Event{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		InvolvedObject: v1.ObjectReference{Kind: "Pod", Namespace: "default", Name: pod}, Count: count, Reason: "R"}
}

func TestKeepsTheNewestAcrossReopenAndCompaction(t *testing.T) {
	path := filepath.Join(t.TempDir(), "events")
	l, err := Open(path, 5, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	for i := range 23 { // past 2*max: compacted on the way
		l.Add(event(fmt.Sprintf("e%d", i), fmt.Sprintf("p%d", i%2), 1))
	}
	l.Add(event("e20", "p0", 2)) // a repeat moves last, with its count
	l.Close()
	l, err = Open(path, 5, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var names []string
	for _, ev := range l.List(nil) {
		names = append(names, ev.Name)
	}
	if fmt.Sprint(names) != "[e18 e19 e21 e22 e20]" {
		t.Fatalf("kept %v", names)
	}
	p0 := l.List(func(ev *v1.Event) bool { return ev.InvolvedObject.Name == "p0" })
	if len(p0) != 3 || p0[2].Name != "e20" || p0[2].Count != 2 {
		t.Fatalf("filtered: %+v", p0)
	}
}
