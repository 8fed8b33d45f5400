package cri

import "testing"

// The collector removes what a pod's sync made only when no sync of the
// pod is under way and none began after the collection's mark.
func TestSyncsQuiet(t *testing.T) {
	const a, b, c = "uid-a", "uid-b", "uid-c"
	var s syncs
	endOld := s.begin(a)
	endOld()
	endB := s.begin(b) // still under way at the mark
	since := s.mark()
	endC := s.begin(c) // begun after the mark, then done
	endC()
	cases := []struct {
		uid  string
		want bool
	}{
		{a, true},       // synced and done before the mark
		{b, false},      // under way
		{c, false},      // begun since the mark
		{"uid-d", true}, // never synced
	}
	for _, tc := range cases {
		ran := false
		if got := s.ifQuiet(tc.uid, since, func() { ran = true }); got != tc.want || ran != tc.want {
			t.Errorf("ifQuiet(%s) = %v (ran %v), want %v", tc.uid, got, ran, tc.want)
		}
	}
	endB()
	since = s.mark()
	for _, uid := range []string{b, c} {
		if !s.ifQuiet(uid, since, func() {}) {
			t.Errorf("%s: quiet at the next mark, yet kept", uid)
		}
	}
	if len(s.lastSeq) != 0 || len(s.active) != 0 {
		t.Errorf("a mark with nothing syncing keeps %v %v", s.lastSeq, s.active)
	}
}
