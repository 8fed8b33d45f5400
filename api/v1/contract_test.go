package apiv1

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
)

// contract is what the docs' examples of each verb decode into: the request
// payload, and every result type its replies carry (none: it has no result).
var contract = map[string]struct {
	request func([]byte) error
	results []func() any
}{
	VerbApply:   {decodeManifest, []func() any{func() any { return &[]ChangeResult{} }}},
	VerbSync:    {decodeManifest, []func() any{func() any { return &[]ChangeResult{} }}},
	VerbDelete:  {into(func() any { return &DeleteRequest{} }), nil},
	VerbGet:     {into(func() any { return &GetRequest{} }), []func() any{func() any { return &GetResult{} }, func() any { return &NodeList{} }}},
	VerbRestart: {into(func() any { return &RestartRequest{} }), []func() any{func() any { return &RestartResult{} }}},
	VerbLogs:    {into(func() any { return &LogsRequest{} }), []func() any{func() any { return &LogsChunk{} }, func() any { return &LogsResult{} }}},
	VerbExec:    {into(func() any { return &ExecRequest{} }), []func() any{func() any { return &ExecResult{} }}},
	VerbConfig:  {into(func() any { return &ConfigPatch{} }), []func() any{func() any { return &ConfigView{} }}},
	VerbCancel:  {into(func() any { return &CancelRequest{} }), []func() any{func() any { return &CancelResult{} }}},
}

// strict decodes exactly one JSON value into v, refusing unknown fields.
func strict(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("data after the JSON value")
	}
	return nil
}

func into(newV func() any) func([]byte) error {
	return func(b []byte) error { return strict(b, newV()) }
}

// decodeManifest decodes a manifest example into the k8s.io/api type of its kind.
func decodeManifest(b []byte) error {
	var probe struct {
		Kind string `json:"kind"`
	}
	if err := json.Unmarshal(b, &probe); err != nil {
		return err
	}
	switch probe.Kind {
	case "Pod":
		return strict(b, &v1.Pod{})
	case "ConfigMap":
		return strict(b, &v1.ConfigMap{})
	case "Secret":
		return strict(b, &v1.Secret{})
	case "List":
		return strict(b, &v1.List{})
	}
	return fmt.Errorf("kind %q is not a manifest mqlet takes", probe.Kind)
}

// decodeResult decodes b into the first of types that takes it strictly and
// returns its index.
func decodeResult(b []byte, types []func() any) (int, error) {
	var errs []error
	for i, newV := range types {
		err := strict(b, newV())
		if err == nil {
			return i, nil
		}
		errs = append(errs, err)
	}
	if len(types) == 0 {
		return -1, errors.New("this verb has no result")
	}
	return -1, errors.Join(errs...)
}

var codeSpan = regexp.MustCompile("`([^`]+)`")

// section returns the lines of a markdown file from the heading that starts
// with from up to the next heading of the same level.
func section(t *testing.T, path, from string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	level := strings.SplitN(from, " ", 2)[0] + " "
	var out []string
	in := false
	for _, l := range strings.Split(string(b), "\n") {
		switch {
		case strings.HasPrefix(l, from):
			in = true
		case in && strings.HasPrefix(l, level):
			return out
		case in:
			out = append(out, l)
		}
	}
	if !in {
		t.Fatalf("%s: no section %q", path, from)
	}
	return out
}

type row struct {
	where string
	cells []string
}

func tableRows(path string, lines []string) []row {
	var rows []row
	for i, l := range lines {
		if !strings.HasPrefix(l, "|") || strings.HasPrefix(l, "|---") {
			continue
		}
		cells := strings.Split(strings.Trim(l, "|"), " | ")
		for j := range cells {
			cells[j] = strings.TrimSpace(cells[j])
		}
		rows = append(rows, row{where: fmt.Sprintf("%s (section line %d)", path, i+1), cells: cells})
	}
	return rows
}

// jsonSpans are the code spans of a cell that are JSON examples; each must
// be valid JSON, so a sketch like {"name":…} cannot pass for an example.
func jsonSpans(t *testing.T, where, cell string) [][]byte {
	var out [][]byte
	for _, m := range codeSpan.FindAllStringSubmatch(cell, -1) {
		s := m[1]
		if !strings.HasPrefix(s, "{") && !strings.HasPrefix(s, "[") {
			continue
		}
		if !json.Valid([]byte(s)) {
			t.Errorf("%s: example is not JSON: %s", where, s)
			continue
		}
		out = append(out, []byte(s))
	}
	return out
}

func verbOf(cell string) string {
	if m := codeSpan.FindStringSubmatch(cell); m != nil {
		return m[1]
	}
	return ""
}

// checkReply decodes a reply example strictly, and its result as a part,
// the end of parts, or a result of its verb.
func checkReply(t *testing.T, where string, b []byte) {
	var raw json.RawMessage
	r := Reply{Result: &raw}
	if err := strict(b, &r); err != nil {
		t.Errorf("%s: reply example %s: %v", where, b, err)
		return
	}
	if PhaseRank(r.Phase) == 0 {
		t.Errorf("%s: reply example has phase %q", where, r.Phase)
	}
	if len(raw) == 0 {
		return
	}
	c, ok := contract[r.Verb]
	if !ok {
		t.Errorf("%s: reply example of unknown verb %q", where, r.Verb)
		return
	}
	types := append([]func() any{func() any { return &Part{} }, func() any { return &Parts{} }}, c.results...)
	if _, err := decodeResult(raw, types); err != nil {
		t.Errorf("%s: result of reply example %s: %v", where, b, err)
	}
}

func TestContractCoversEveryVerb(t *testing.T) {
	for _, verb := range Verbs() {
		if _, ok := contract[verb]; !ok {
			t.Errorf("verb %q has no entry in this test's contract", verb)
		}
	}
	if len(contract) != len(Verbs()) {
		t.Errorf("the test knows %d verbs, Verbs() has %d", len(contract), len(Verbs()))
	}
}

// Every JSON example of the command table in docs/design.md decodes
// strictly into the verb's payload or result type, and every verb has one.
func TestDesignCommandExamplesDecode(t *testing.T) {
	const path = "../../docs/design.md"
	lines := section(t, path, "### Commands")
	seen := map[string]bool{}
	for _, r := range tableRows(path, lines) {
		if r.cells[0] == "verb" {
			if len(r.cells) != 4 || r.cells[1] != "payload (example)" || r.cells[2] != "result (examples)" {
				t.Fatalf("%s: header %q: want verb, payload (example), result (examples), effect", r.where, r.cells)
			}
			continue
		}
		verb := verbOf(r.cells[0])
		c, ok := contract[verb]
		if !ok {
			t.Errorf("%s: row for verb %q, which is not in Verbs()", r.where, verb)
			continue
		}
		if len(r.cells) != 4 {
			t.Errorf("%s: %d cells, want 4", r.where, len(r.cells))
			continue
		}
		seen[verb] = true
		reqs := jsonSpans(t, r.where, r.cells[1])
		if len(reqs) == 0 {
			t.Errorf("%s: verb %q has no JSON payload example", r.where, verb)
		}
		for _, b := range reqs {
			if err := c.request(b); err != nil {
				t.Errorf("%s: %s payload example %s: %v", r.where, verb, b, err)
			}
		}
		covered := make([]bool, len(c.results))
		results := jsonSpans(t, r.where, r.cells[2])
		for _, b := range results {
			i, err := decodeResult(b, c.results)
			if err != nil {
				t.Errorf("%s: %s result example %s: %v", r.where, verb, b, err)
				continue
			}
			// An example may fit several types (a chunk is a result without
			// totals); it covers each of them.
			for j := i; j < len(c.results); j++ {
				if strict(b, c.results[j]()) == nil {
					covered[j] = true
				}
			}
		}
		for j, ok := range covered {
			if !ok {
				t.Errorf("%s: verb %q has no result example of type %T", r.where, verb, c.results[j]())
			}
		}
	}
	for _, verb := range Verbs() {
		if !seen[verb] {
			t.Errorf("%s: no row for verb %q", path, verb)
		}
	}
}

// The telemetry table of docs/design.md and the contract table of README.md:
// reply and state examples decode strictly, and the command row of the
// README names every verb.
func TestTopicTableExamplesDecode(t *testing.T) {
	tables := []struct{ path, section string }{
		{"../../docs/design.md", "### Telemetry"},
		{"../../README.md", "## The MQTT contract"},
	}
	examples := 0
	for _, tb := range tables {
		for _, r := range tableRows(tb.path, section(t, tb.path, tb.section)) {
			topic := verbOf(r.cells[0])
			for _, cell := range r.cells[1:] {
				for _, b := range jsonSpans(t, r.where, cell) {
					examples++
					switch {
					case strings.Contains(topic, "/reply/"):
						checkReply(t, r.where, b)
					case strings.HasSuffix(topic, "/state"):
						var s NodeState
						if err := strict(b, &s); err != nil || (s.State != StateOnline && s.State != StateOffline) {
							t.Errorf("%s: state example %s: %v (state %q)", r.where, b, err, s.State)
						}
					default:
						t.Errorf("%s: example on %s has no type in this test: %s", r.where, topic, b)
					}
				}
			}
			if strings.Contains(topic, "/cmd/") {
				var named []string
				for _, m := range codeSpan.FindAllStringSubmatch(r.cells[2], -1) {
					named = append(named, m[1])
				}
				for _, verb := range Verbs() {
					if !slices.Contains(named, verb) {
						t.Errorf("%s: the command row does not name verb %q", r.where, verb)
					}
				}
			}
		}
	}
	if examples < 4 {
		t.Fatalf("found %d examples in the topic tables; the parser is broken", examples)
	}
}

// The test's decoding is strict: an unknown field fails.
func TestStrictDecodingRefusesUnknownFields(t *testing.T) {
	if err := contract[VerbLogs].request([]byte(`{"name":"web","tail":3}`)); err == nil {
		t.Fatal("logs with the unknown field tail decoded")
	}
	if err := decodeManifest([]byte(`{"apiVersion":"v1","kind":"Pod","metadata":{"nmae":"x"}}`)); err == nil {
		t.Fatal("a pod with metadata.nmae decoded")
	}
	var raw json.RawMessage
	if err := strict([]byte(`{"requestId":"r","phase":"accepted","ts":"2026-01-01T00:00:00Z","extra":1}`), &Reply{Result: &raw}); err == nil {
		t.Fatal("a reply with an unknown field decoded")
	}
}
