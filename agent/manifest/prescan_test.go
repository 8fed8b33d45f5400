package manifest

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	yaml3 "go.yaml.in/yaml/v3"
)

// treeValues counts the values of a yaml.v3 tree as built (an alias is one
// node), without its document node.
func treeValues(n *yaml3.Node) int {
	c := 1
	if n.Kind == yaml3.DocumentNode {
		c = 0
	}
	for _, x := range n.Content {
		c += treeValues(x)
	}
	return c
}

// prescanCases are YAML documents whose values the prescan must not
// overcount: every construct it reads, and the ones it must not read as
// structure (quotes and flow indicators inside scalars, block scalars,
// comments, continuation lines).
var prescanCases = []string{
	"a: b\n", "a:\n", "a:\nb:\n", "- a\n- b\n", "- \n- \n", "- - a\n  - b\n", "- [a]\n- [b]\n",
	"- a: b\n  c: d\n- e: f\n", "k: [a, b, c]\n", "k: {a: 1, b: 2}\n", "[a, ]\n", "[[a], [b]]\n",
	"{a}\n", "{a, b}\n", "[a: b]\n", "k: [a: b, c]\n", "{\"a\":\"b\", \"c\": [1, 2]}\n",
	"k: 'a, [b], {c}'\n", "k: \"a, [b]: \\\"c, d\\\"\"\n", "k: 'it''s, [x]'\n", "k: it's [x], {y}\n",
	"k: a[1, 2]\n", "k: a # [b, c], d\n", "# - a\n# - b\nk: v\n",
	"k: |\n  - a\n  - b: c\n  [d, e]\nz: 1\n", "k: >-\n  - a\n  b: c\n", "- |\n  - a\n  - b\n- c\n",
	"k: some text\n  - not an item\n  [nor, a, flow]\n", "k: \"multi\n  line, [x]\n  \"\nz: [a,\n  b]\nq: c\n",
	"a: &x [1, 2]\nb: *x\nc: !!str d\n", "? a\n: b\n", "- 'q': v\n- \"r\": [1, 2]\n", "a: b\r\nc: d\r\n",
	"k: [a,\n  # c, d\n  b]\n", "apiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: ConfigMap\n  metadata: {name: a}\n  data:\n    x: \"1\"\n",
	"- - - - a\n", "k:\n  - a\n  - b\n  -\n  - [c, d]\n", "{a: [b], c: {d: e}}\n", "[a\"b, c]\n", "[a\":b, c]\n",
	"k: 'x' # '\nz: v\n", "[0:]", "{a:}", "[a:,b]", "['a':b]", "{\"a\":b, \"c\":[1]}", "[a :b]", "{a, b: c, [d]}", "\"k\": v\n'k2': v2\n", "- &a x\n- *a\n", "k: !t\n  a: b\n",
}

func TestPrescanNeverCountsMoreThanTheTree(t *testing.T) {
	docs := prescanCases
	for _, dir := range []string{"testdata", filepath.Join("..", "..", "test", "fixtures")} {
		files, _ := filepath.Glob(filepath.Join(dir, "*.yaml"))
		for _, f := range files {
			data, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range bytes.Split(data, []byte("\n---\n")) {
				docs = append(docs, string(d))
			}
		}
	}
	for _, doc := range docs {
		var tree yaml3.Node
		if err := yaml3.Unmarshal([]byte(doc), &tree); err != nil {
			t.Errorf("case %q is not YAML: %v", doc, err)
			continue
		}
		want := treeValues(&tree)
		if got := yamlValuesAtLeast([]byte(doc), MaxNodes); got > want {
			t.Errorf("prescan of %q counts %d values, the tree holds %d", doc, got, want)
		}
	}
}

// TestPrescanCountsDensePayloads: the dense shapes of a 1 MiB payload are
// counted close to what their trees hold, so they are refused unparsed.
func TestPrescanCountsDensePayloads(t *testing.T) {
	const size = 1 << 20
	for name, unit := range map[string]struct{ head, item, sep, tail string }{
		"flow sequence":  {"[", "a", ",", "]"},
		"flow mapping":   {"{", "a: b", ",", "}"},
		"block sequence": {"", "- a", "\n", "\n"},
		"block mapping":  {"", "a: b", "\n", "\n"},
		"nested entries": {"k:\n", "  - a: b", "\n", "\n"},
		"flow in block":  {"", "- [a]", "\n", "\n"},
	} {
		var b strings.Builder
		b.WriteString(unit.head)
		for b.Len() < size-len(unit.item)-len(unit.sep)-len(unit.tail) {
			b.WriteString(unit.item)
			b.WriteString(unit.sep)
		}
		b.WriteString(unit.item)
		b.WriteString(unit.tail)
		doc := []byte(b.String())
		got := yamlValuesAtLeast(doc, 1<<30)
		var tree yaml3.Node
		if err := yaml3.Unmarshal(doc, &tree); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		want := treeValues(&tree)
		if got > want || got < want*9/10 {
			t.Errorf("%s: prescan counts %d values, the tree holds %d (want at least 90 %%)", name, got, want)
		}
		if err := checkYAMLDensity(doc, MaxNodes); err == nil {
			t.Errorf("%s (%d values in 1 MiB) passes the prescan", name, want)
		}
	}
}

// FuzzPrescan: for any input yaml.v3 parses, the prescan counts no more
// values than the tree holds.
func FuzzPrescan(f *testing.F) {
	for _, c := range prescanCases {
		f.Add([]byte(c))
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		var tree yaml3.Node
		if err := yaml3.Unmarshal(doc, &tree); err != nil {
			return
		}
		if got, want := yamlValuesAtLeast(doc, MaxNodes), treeValues(&tree); got > want {
			t.Errorf("prescan of %q counts %d values, the tree holds %d", doc, got, want)
		}
	})
}
