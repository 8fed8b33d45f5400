package apiv1

import (
	"strings"
	"testing"
)

func TestTopics(t *testing.T) {
	s := Scheme{Node: "gw1"}
	cases := map[string]string{
		s.CommandFilter():             "mqlet/v1/gw1/cmd/#",
		s.State():                     "mqlet/v1/gw1/state",
		s.NodeTopic():                 "mqlet/v1/gw1/node",
		s.Pod("default", "web"):       "mqlet/v1/gw1/pods/default/web",
		s.Events():                    "mqlet/v1/gw1/events",
		s.Metrics():                   "mqlet/v1/gw1/metrics",
		s.Reply("r-1"):                "mqlet/v1/gw1/reply/r-1",
		s.Input("r-1"):                "mqlet/v1/gw1/in/r-1",
		s.InputFilter():               "mqlet/v1/gw1/in/+",
		s.Command("apply", "abc"):     "mqlet/v1/gw1/cmd/apply/abc",
		s.Command("apply", ""):        "mqlet/v1/gw1/cmd/apply",
		Scheme{"site/a", "n"}.State(): "site/a/n/state",
	}
	for got, want := range cases {
		if got != want {
			t.Errorf("got %q, want %q", got, want)
		}
	}
}

func TestParseInput(t *testing.T) {
	s := Scheme{Node: "gw1"}
	if id, err := s.ParseInput("mqlet/v1/gw1/in/r-1"); err != nil || id != "r-1" {
		t.Fatalf("ParseInput = %q, %v; want r-1", id, err)
	}
	for _, bad := range []string{"mqlet/v1/gw2/in/r-1", "mqlet/v1/gw1/in/", "mqlet/v1/gw1/in/a/b", "mqlet/v1/gw1/in/..", "mqlet/v1/gw1/cmd/logs/r-1"} {
		if id, err := s.ParseInput(bad); err == nil {
			t.Errorf("ParseInput(%q) = %q, want an error", bad, id)
		}
	}
}

func TestParseCommand(t *testing.T) {
	s := Scheme{Node: "gw1"}
	ok := []struct{ topic, verb, id string }{
		{"mqlet/v1/gw1/cmd/apply", "apply", ""},
		{"mqlet/v1/gw1/cmd/apply/req-1", "apply", "req-1"},
		{"mqlet/v1/gw1/cmd/get/A.b_c-9", "get", "A.b_c-9"},
		{"mqlet/v1/gw1/cmd/logs/" + strings.Repeat("x", 128), "logs", strings.Repeat("x", 128)},
	}
	for _, c := range ok {
		verb, id, err := s.ParseCommand(c.topic)
		if err != nil || verb != c.verb || id != c.id {
			t.Errorf("ParseCommand(%q) = %q, %q, %v; want %q, %q", c.topic, verb, id, err, c.verb, c.id)
		}
	}
	bad := []string{
		"mqlet/v1/gw2/cmd/apply",          // other node
		"other/v1/gw1/cmd/apply",          // other prefix
		"mqlet/v1/gw1/state",              // not a command
		"mqlet/v1/gw1/cmd/",               // empty verb
		"mqlet/v1/gw1/cmd//id",            // empty verb with id
		"mqlet/v1/gw1/cmd/apply/id/extra", // extra level
		"mqlet/v1/gw1/cmd/apply/",         // empty id
		"mqlet/v1/gw1/cmd/apply/..",       // dot path
		"mqlet/v1/gw1/cmd/apply/a..b",     // dot path
		"mqlet/v1/gw1/cmd/apply/.",        // dot
		"mqlet/v1/gw1/cmd/apply/a+b",      // wildcard
		"mqlet/v1/gw1/cmd/apply/a#",       // wildcard
		"mqlet/v1/gw1/cmd/apply/a b",      // space
		"mqlet/v1/gw1/cmd/ap ply",         // bad verb
		"mqlet/v1/gw1/cmd/apply/" + strings.Repeat("x", 129),
		"mqlet/v1/gw1x/cmd/apply", // node prefix of another node
	}
	for _, topic := range bad {
		if verb, id, err := s.ParseCommand(topic); err == nil {
			t.Errorf("ParseCommand(%q) = %q, %q, nil; want an error", topic, verb, id)
		}
	}
	if _, _, err := s.ParseCommand("mqlet/v1/gw2/cmd/apply"); err == nil || !strings.Contains(err.Error(), ErrNotCommand.Error()) {
		t.Errorf("other node error = %v, want ErrNotCommand", err)
	}
}

func TestValidate(t *testing.T) {
	for _, n := range []string{"gw1", "edge-01.site", "node_A"} {
		if err := ValidateNodeName(n); err != nil {
			t.Errorf("ValidateNodeName(%q) = %v", n, err)
		}
	}
	for _, n := range []string{"", "$sys", "a+b", "a#", "a/b"} {
		if err := ValidateNodeName(n); err == nil {
			t.Errorf("ValidateNodeName(%q) = nil, want error", n)
		}
	}
	for _, p := range []string{"mqlet/v1", "site/a/mqlet"} {
		if err := ValidatePrefix(p); err != nil {
			t.Errorf("ValidatePrefix(%q) = %v", p, err)
		}
	}
	for _, p := range []string{"", "$SYS/x", "a/+/b", "a/#", "/a", "a//b", "a/"} {
		if err := ValidatePrefix(p); err == nil {
			t.Errorf("ValidatePrefix(%q) = nil, want error", p)
		}
	}
	if err := (Scheme{Prefix: "a/#", Node: "n"}).Validate(); err == nil {
		t.Error("Scheme.Validate accepted a wildcard prefix")
	}
	if err := (Scheme{Node: "n"}).Validate(); err != nil {
		t.Errorf("Scheme.Validate default prefix: %v", err)
	}
}
