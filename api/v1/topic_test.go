package apiv1

import (
	"strings"
	"testing"
)

func TestTopics(t *testing.T) {
	s := Scheme{Node: "gw1"}
	cases := map[string]string{
		s.CommandFilters()[0]:                                        "mqlet/v1/gw1/cmd/#",
		s.CommandFilters()[1]:                                        "mqlet/v1/gw1/ns/+/cmd/#",
		s.GroupFilters("l1")[0]:                                      "mqlet/v1/group/l1/cmd/#",
		s.GroupFilters("l1")[1]:                                      "mqlet/v1/group/l1/ns/+/cmd/#",
		s.CommandIn(Scope{Namespace: "a"}, "get", "r"):               "mqlet/v1/gw1/ns/a/cmd/get/r",
		s.CommandIn(Scope{Group: "l1"}, "apply", ""):                 "mqlet/v1/group/l1/cmd/apply",
		s.CommandIn(Scope{Group: "l1", Namespace: "b"}, "sync", "x"): "mqlet/v1/group/l1/ns/b/cmd/sync/x",
		s.State():                     "mqlet/v1/gw1/state",
		s.NodeTopic():                 "mqlet/v1/gw1/node",
		s.Pod("default", "web"):       "mqlet/v1/gw1/pods/default/web",
		s.Events():                    "mqlet/v1/gw1/events",
		s.Metrics():                   "mqlet/v1/gw1/metrics",
		s.Reply("r-1"):                "mqlet/v1/gw1/reply/r-1",
		s.Input("r-1"):                "mqlet/v1/gw1/in/r-1",
		s.InputFilter():               "mqlet/v1/gw1/in/+",
		s.Output("r-1"):               "mqlet/v1/gw1/out/r-1",
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
	ok := []struct {
		topic, verb, id string
		scope           Scope
	}{
		{"mqlet/v1/gw1/cmd/apply", "apply", "", Scope{}},
		{"mqlet/v1/gw1/cmd/apply/req-1", "apply", "req-1", Scope{}},
		{"mqlet/v1/gw1/cmd/get/A.b_c-9", "get", "A.b_c-9", Scope{}},
		{"mqlet/v1/gw1/cmd/logs/" + strings.Repeat("x", 128), "logs", strings.Repeat("x", 128), Scope{}},
		{"mqlet/v1/gw1/ns/team-a/cmd/get/r1", "get", "r1", Scope{Namespace: "team-a"}},
		{"mqlet/v1/gw1/ns/b/cmd/apply", "apply", "", Scope{Namespace: "b"}},
		{"mqlet/v1/group/line-1/cmd/apply/r2", "apply", "r2", Scope{Group: "line-1"}},
		{"mqlet/v1/group/line-1/ns/a/cmd/sync", "sync", "", Scope{Group: "line-1", Namespace: "a"}},
		{"mqlet/v1/group/gw1/cmd/get", "get", "", Scope{Group: "gw1"}},
	}
	for _, c := range ok {
		got, err := s.ParseCommand(c.topic)
		if err != nil || got.Verb != c.verb || got.RequestID != c.id || got.Scope != c.scope {
			t.Errorf("ParseCommand(%q) = %+v, %v; want %q, %q, %+v", c.topic, got, err, c.verb, c.id, c.scope)
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
		"mqlet/v1/gw1x/cmd/apply",                                 // node prefix of another node
		"mqlet/v1/gw1/ns/cmd/apply",                               // no namespace
		"mqlet/v1/gw1/ns//cmd/apply",                              // empty namespace
		"mqlet/v1/gw1/ns/A/cmd/apply",                             // not a DNS label
		"mqlet/v1/gw1/ns/-a/cmd/apply",                            // not a DNS label
		"mqlet/v1/gw1/ns/a_b/cmd/apply",                           // not a DNS label
		"mqlet/v1/gw1/ns/a/b/cmd/apply",                           // extra level
		"mqlet/v1/gw1/ns/a",                                       // no cmd
		"mqlet/v1/gw1/ns/a/pods/x",                                // not a command
		"mqlet/v1/group/cmd/apply",                                // no group
		"mqlet/v1/group//cmd/apply",                               // empty group
		"mqlet/v1/group/a+b/cmd/apply",                            // wildcard
		"mqlet/v1/group/a b/cmd/apply",                            // space
		"mqlet/v1/group/../cmd/apply",                             // dot path
		"mqlet/v1/group/l1/ns/a/ns/b/cmd/get",                     // two namespaces
		"mqlet/v1/group/l1/reply/x",                               // not a command
		"mqlet/v1/group/" + strings.Repeat("g", 64) + "/cmd/get",  // too long
		"mqlet/v1/gw1/ns/" + strings.Repeat("n", 64) + "/cmd/get", // too long
	}
	for _, topic := range bad {
		if got, err := s.ParseCommand(topic); err == nil {
			t.Errorf("ParseCommand(%q) = %+v, nil; want an error", topic, got)
		}
	}
	if _, err := s.ParseCommand("mqlet/v1/gw2/cmd/apply"); err == nil || !strings.Contains(err.Error(), ErrNotCommand.Error()) {
		t.Errorf("other node error = %v, want ErrNotCommand", err)
	}
}

func TestScopeSource(t *testing.T) {
	if got := (Scope{}).Source(); got != SourceNode {
		t.Errorf("node scope source %q", got)
	}
	if got := (Scope{Group: "l1", Namespace: "a"}).Source(); got != "group/l1" {
		t.Errorf("group scope source %q", got)
	}
	if got := (Scope{Group: "l1", Namespace: "a"}).String(); got != "group l1, namespace a" {
		t.Errorf("scope string %q", got)
	}
}

func TestValidate(t *testing.T) {
	for _, n := range []string{"gw1", "edge-01.site", "node_A"} {
		if err := ValidateNodeName(n); err != nil {
			t.Errorf("ValidateNodeName(%q) = %v", n, err)
		}
	}
	for _, n := range []string{"", "$sys", "a+b", "a#", "a/b", "group", "rollouts"} {
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
