package apiv1

import (
	"strings"
	"testing"
)

func TestDecodeGroupDocument(t *testing.T) {
	good := `{"apiVersion":"mqlet.io/v1","kind":"GroupDocument","group":"line-1","generation":7,"objects":{"apiVersion":"v1","kind":"List","items":[]}}`
	d, err := DecodeGroupDocument("line-1", []byte(good))
	if err != nil || d.Generation != 7 || d.Group != "line-1" {
		t.Fatalf("good document: %+v, %v", d, err)
	}
	for name, tc := range map[string]struct{ payload, want string }{
		"unknown field":   {`{"apiVersion":"mqlet.io/v1","kind":"GroupDocument","group":"line-1","generation":7,"objects":{},"extra":1}`, `unknown field "extra"`},
		"other group":     {strings.Replace(good, `"group":"line-1"`, `"group":"line-2"`, 1), `names group "line-2"`},
		"generation 0":    {strings.Replace(good, `"generation":7`, `"generation":0`, 1), "generation 0"},
		"generation 2^53": {strings.Replace(good, `"generation":7`, `"generation":9007199254740992`, 1), "generation 9007199254740992"},
		"negative":        {strings.Replace(good, `"generation":7`, `"generation":-1`, 1), "cannot unmarshal"},
		"no objects":      {strings.Replace(good, `,"objects":{"apiVersion":"v1","kind":"List","items":[]}`, ``, 1), "no objects"},
		"null objects":    {strings.Replace(good, `{"apiVersion":"v1","kind":"List","items":[]}`, `null`, 1), "no objects"},
		"wrong kind":      {strings.Replace(good, `"GroupDocument"`, `"List"`, 1), `kind "List"`},
		"trailing":        {good + `{}`, "trailing data"},
		"not json":        {`apiVersion: mqlet.io/v1`, "group document"},
	} {
		_, err := DecodeGroupDocument("line-1", []byte(tc.payload))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want one containing %q", name, err, tc.want)
		}
	}
}

func TestGroupDesiredTopic(t *testing.T) {
	s := Scheme{Node: "gw-1"}
	topic := s.GroupDesired("line-1")
	if topic != "mqlet/v1/group/line-1/desired" {
		t.Fatalf("topic %q", topic)
	}
	if g, ok, err := s.ParseGroupDesired(topic); g != "line-1" || !ok || err != nil {
		t.Fatalf("parse %q: %q %v %v", topic, g, ok, err)
	}
	for _, other := range []string{"mqlet/v1/group/line-1/cmd/sync", "mqlet/v1/gw-1/cmd/apply", "other/group/line-1/desired", "mqlet/v1/group/a/b/desired"} {
		if _, ok, _ := s.ParseGroupDesired(other); ok {
			t.Errorf("%q parsed as a group document topic", other)
		}
	}
	for _, bad := range []string{"mqlet/v1/group/a+b/desired", "mqlet/v1/group/a#/desired", "mqlet/v1/group/-a/desired", "mqlet/v1/group//desired"} {
		if _, ok, err := s.ParseGroupDesired(bad); !ok || err == nil {
			t.Errorf("%q: ok %v, err %v; want a refused group name", bad, ok, err)
		}
	}
	if id := GroupDocumentRequestID("line-1", 12); ValidateRequestID(id) != nil || id != "desired.line-1.12" {
		t.Fatalf("request id %q", id)
	}
	if id := GroupDocumentRequestID(strings.Repeat("g", MaxGroupNameLen), MaxGeneration); ValidateRequestID(id) != nil {
		t.Fatalf("longest request id %q: %v", id, ValidateRequestID(id))
	}
}
