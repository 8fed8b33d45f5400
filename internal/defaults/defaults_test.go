package defaults

import (
	"testing"
	"time"
)

func TestSet(t *testing.T) {
	s, empty := "set", ""
	Set(&s, "default")
	Set(&empty, "default")
	if s != "set" || empty != "default" {
		t.Errorf("strings: %q %q", s, empty)
	}
	neg, zero, pos := -1, 0, 3
	for _, p := range []*int{&neg, &zero} {
		Set(p, 7)
	}
	Set(&pos, 7)
	if neg != 7 || zero != 7 || pos != 3 {
		t.Errorf("ints: %d %d %d", neg, zero, pos)
	}
	d := time.Duration(0)
	Set(&d, time.Second)
	if d != time.Second {
		t.Errorf("duration: %s", d)
	}
}
