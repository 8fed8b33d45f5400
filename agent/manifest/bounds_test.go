package manifest

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
)

// aliasBomb is the payload that took mqlet to its memory cap: one 256 KiB
// string, aliased until the payload is about 700 KB (about 28 GiB expanded).
func aliasBomb() []byte {
	var b strings.Builder
	b.WriteString("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: bomb\n  annotations:\n    a: &a \"")
	b.WriteString(strings.Repeat("x", 256<<10))
	b.WriteString("\"\ndata:\n  b: [")
	for b.Len() < 700_000 {
		b.WriteString("*a, ")
	}
	b.WriteString("*a]\n")
	return []byte(b.String())
}

// billionLaughs nests nine aliases per level, nine levels deep.
func billionLaughs() []byte {
	var b strings.Builder
	b.WriteString("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: lol}\ndata:\n  l0: &l0 \"lol\"\n")
	for i := 1; i <= 9; i++ {
		fmt.Fprintf(&b, "  l%d: &l%d [", i, i)
		for j := range 9 {
			if j > 0 {
				b.WriteString(",")
			}
			fmt.Fprintf(&b, "*l%d", i-1)
		}
		b.WriteString("]\n")
	}
	return []byte(b.String())
}

// allocated returns the bytes allocated while f runs.
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

func TestDecodeRefusesAliasBombsWithoutExpanding(t *testing.T) {
	for name, payload := range map[string][]byte{"256 KiB string aliased": aliasBomb(), "billion laughs": billionLaughs()} {
		t.Run(name, func(t *testing.T) {
			var err error
			used := allocated(func() { _, err = Decode(payload) })
			if !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "expands to more than") && !strings.Contains(err.Error(), "values") {
				t.Fatalf("Decode = %v, want ErrTooLarge about the expansion", err)
			}
			// The parse tree of an alias-dense payload costs tens of bytes
			// per payload byte; an expansion would be gigabytes.
			if limit := uint64(48*len(payload) + 1<<20); used > limit {
				t.Fatalf("refusing a %d-byte bomb allocated %d bytes (limit %d)", len(payload), used, limit)
			}
			t.Logf("%d-byte payload refused after allocating %d bytes: %v", len(payload), used, err)
		})
	}
}

func TestDecodeRefusesSelfReferencingAlias(t *testing.T) {
	_, err := Decode([]byte("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\ndata: &d {x: *d}\n"))
	if err == nil {
		t.Fatal("a self-referencing alias was accepted")
	}
}

func TestDecodeCountsAliasesAtExpandedSize(t *testing.T) {
	// A few uses of a small anchor are fine.
	ok := "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\n  labels: &l {app: web}\n  annotations: *l\ndata: {k: v}\n"
	if _, err := Decode([]byte(ok)); err != nil {
		t.Fatalf("small aliases refused: %v", err)
	}
	// A 1 MiB value used 4 times is 4 MiB expanded: over the bound by the
	// aliases alone, though the payload is 1 MiB.
	big := "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\n  annotations: {v: &v \"" + strings.Repeat("y", 1<<20) + "\"}\ndata: {a: *v, b: *v, c: *v, d: *v}\n"
	if _, err := Decode([]byte(big)); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("4 aliases of 1 MiB: %v, want ErrTooLarge", err)
	}
}

func nestedYAML(depth int) string {
	return "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\nx: " + strings.Repeat("[", depth-1) + strings.Repeat("]", depth-1) + "\n"
}

func nestedJSON(depth int) string {
	return `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a"},"x":` + strings.Repeat("[", depth-1) + strings.Repeat("]", depth-1) + "}"
}

func TestDecodeBoundsDepth(t *testing.T) {
	for name, nested := range map[string]func(int) string{"YAML": nestedYAML, "JSON": nestedJSON} {
		t.Run(name, func(t *testing.T) {
			// At the bound the payload passes the bounds and fails for its
			// unknown field "x"; one deeper is refused before decoding.
			if _, err := Decode([]byte(nested(MaxDepth))); err == nil || errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), `"x"`) {
				t.Fatalf("depth %d: %v, want the unknown field reported", MaxDepth, err)
			}
			_, err := Decode([]byte(nested(MaxDepth + 1)))
			if !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "deeper than 64") {
				t.Fatalf("depth %d: %v, want ErrTooLarge", MaxDepth+1, err)
			}
		})
	}
}

func configMapList(n int, asJSON bool) []byte {
	var b strings.Builder
	if asJSON {
		b.WriteString(`{"apiVersion":"v1","kind":"List","items":[`)
		for i := range n {
			if i > 0 {
				b.WriteString(",")
			}
			fmt.Fprintf(&b, `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"c%d"}}`, i)
		}
		b.WriteString("]}")
		return []byte(b.String())
	}
	b.WriteString("apiVersion: v1\nkind: List\nitems:\n")
	for i := range n {
		fmt.Fprintf(&b, "- {apiVersion: v1, kind: ConfigMap, metadata: {name: c%d}}\n", i)
	}
	return []byte(b.String())
}

func TestDecodeBoundsObjects(t *testing.T) {
	for _, asJSON := range []bool{false, true} {
		t.Run(fmt.Sprintf("List json=%v", asJSON), func(t *testing.T) {
			objs, err := Decode(configMapList(MaxObjects, asJSON))
			if err != nil || len(objs) != MaxObjects {
				t.Fatalf("%d items: %d objects, %v", MaxObjects, len(objs), err)
			}
			_, err = Decode(configMapList(MaxObjects+1, asJSON))
			if !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "257 objects") {
				t.Fatalf("%d items: %v, want ErrTooLarge naming the count", MaxObjects+1, err)
			}
		})
	}
	t.Run("documents", func(t *testing.T) {
		var b strings.Builder
		for i := range MaxObjects + 1 {
			fmt.Fprintf(&b, "---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: c%d}\n", i)
		}
		if _, err := Decode([]byte(b.String())); !errors.Is(err, ErrTooLarge) {
			t.Fatalf("%d documents: %v, want ErrTooLarge", MaxObjects+1, err)
		}
	})
}

func TestDecodeBoundsValues(t *testing.T) {
	dense := "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\nx: [" + strings.Repeat("a,", MaxNodes) + "a]\n"
	if _, err := Decode([]byte(dense)); !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "values") {
		t.Fatalf("YAML of %d values: %v, want ErrTooLarge", MaxNodes, err)
	}
	denseJSON := `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a"},"x":[` + strings.Repeat("1,", MaxNodes) + "1]}"
	if _, err := Decode([]byte(denseJSON)); !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "values") {
		t.Fatalf("JSON of %d values: %v, want ErrTooLarge", MaxNodes, err)
	}
}

func TestDecodeArgsBounded(t *testing.T) {
	var args struct {
		Name string `json:"name"`
	}
	if err := DecodeArgs(billionLaughs(), &args); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("DecodeArgs(bomb) = %v, want ErrTooLarge", err)
	}
	if err := DecodeArgs([]byte(`{"name":`+strings.Repeat("[", 70)+strings.Repeat("]", 70)+`}`), &args); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("DecodeArgs(deep JSON) = %v, want ErrTooLarge", err)
	}
}

// largestList is a List of MaxObjects ConfigMaps just under 1 MiB (the
// default mqtt.maxPayloadBytes), the largest ordinary payload mqlet takes.
func largestList(asJSON bool) []byte {
	value := strings.Repeat("v", (1<<20)/MaxObjects-200)
	var b strings.Builder
	if asJSON {
		b.WriteString(`{"apiVersion":"v1","kind":"List","items":[`)
	} else {
		b.WriteString("apiVersion: v1\nkind: List\nitems:\n")
	}
	for i := range MaxObjects {
		if asJSON {
			if i > 0 {
				b.WriteString(",")
			}
			fmt.Fprintf(&b, `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"c%d"},"data":{"k":%q}}`, i, value)
		} else {
			fmt.Fprintf(&b, "- apiVersion: v1\n  kind: ConfigMap\n  metadata: {name: c%d}\n  data: {k: %s}\n", i, value)
		}
	}
	if asJSON {
		b.WriteString("]}")
	}
	return []byte(b.String())
}

// BenchmarkDecodeLargest reports the bytes allocated (B/op, an upper bound
// of the peak heap growth) decoding the largest allowed payloads and refusing
// the bombs.
func BenchmarkDecodeLargest(b *testing.B) {
	cases := []struct {
		name    string
		payload []byte
		refused bool
	}{
		{"ListYAML-256x4KiB", largestList(false), false},
		{"ListJSON-256x4KiB", largestList(true), false},
		{"AliasBomb-700KB", aliasBomb(), true},
		{"BillionLaughs", billionLaughs(), true},
		{"DenseYAML-1MiB", []byte("x: [" + strings.Repeat("a,", 1<<19) + "a]\n"), true},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(c.payload)))
			var peak uint64
			for b.Loop() {
				var err error
				used := allocated(func() { _, err = Decode(c.payload) })
				peak = max(peak, used)
				if (err != nil) != c.refused {
					b.Fatalf("Decode: %v", err)
				}
			}
			b.ReportMetric(float64(peak)/(1<<20), "MiB-alloc-max")
		})
	}
}

func TestCheckJSONIgnoresStrings(t *testing.T) {
	js := `{"apiVersion":"v1","kind":"List","items":[{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a"},"data":{"items":"[,,\",]{","k":"\\\\"}}]}`
	objects, err := checkJSON([]byte(js))
	if err != nil || objects != 1 {
		t.Fatalf("checkJSON = %d, %v; want 1 object", objects, err)
	}
	objs, err := Decode([]byte(js))
	if err != nil || len(objs) != 1 {
		t.Fatalf("Decode = %d, %v", len(objs), err)
	}
	if n, err := checkJSON([]byte(`{"kind":"List","items":[]}`)); err != nil || n != 1 {
		t.Fatalf("empty List: %d, %v", n, err)
	}
}
