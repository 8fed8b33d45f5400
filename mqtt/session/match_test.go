package session

import "testing"

func TestMatchFilter(t *testing.T) {
	for _, c := range []struct {
		filter, topic string
		want          bool
	}{
		{"a/n1/pods/+/+", "a/n1/pods/default/web", true},
		{"a/n1/pods/+/+", "a/n1/pods/default", false},
		{"a/n1/pods/+/+", "a/n1/pods/default/web/x", false},
		{"a/n1/pods/+/+", "a/n1/cmd/apply/r1", false},
		{"a/n1/cmd/#", "a/n1/cmd/apply/r1", true},
		{"a/n1/cmd/#", "a/n1/cmd", true},
		{"a/n1/cmd/#", "a/n1/pods/x/y", false},
	} {
		if got := MatchFilter(c.filter, c.topic); got != c.want {
			t.Errorf("MatchFilter(%q, %q) = %v, want %v", c.filter, c.topic, got, c.want)
		}
	}
}
