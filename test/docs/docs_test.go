// Package docs checks the project's docs against the tree, so that they
// stay true when the tree changes.
package docs

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The layout table of docs/design.md names every Go package of the tree:
// either by its path in backticks, or by its last elements inside the row
// of an ancestor written `ancestor/…`.
func TestDesignLayoutNamesEveryPackage(t *testing.T) {
	design, err := os.ReadFile("../../docs/design.md")
	if err != nil {
		t.Fatal(err)
	}
	layout := section(string(design), "## Layout")
	if layout == "" {
		t.Fatal("docs/design.md has no ## Layout section")
	}
	pkgs := packages(t, "../..")
	if len(pkgs) < 20 {
		t.Fatalf("found only %d packages (%v): the walk is wrong", len(pkgs), pkgs)
	}
	for _, p := range pkgs {
		if !named(layout, p) {
			t.Errorf("docs/design.md's layout does not name the package %s", p)
		}
	}
}

// A package the table does not name is found (the check can fail).
func TestNamedRefusesAnUnnamedPackage(t *testing.T) {
	layout := "| `agent/intake` | x |\n| `internal/…` | `pki`, `testutil/…` |\n"
	for pkg, want := range map[string]bool{
		"agent/intake": true, "internal/pki": true, "internal/testutil/natscluster": true,
		"agent/store": false, "internal/redact": false, "agent": false,
	} {
		if got := named(layout, pkg); got != want {
			t.Errorf("named(%s) = %v, want %v", pkg, got, want)
		}
	}
}

func named(layout, pkg string) bool {
	if strings.Contains(layout, "`"+pkg+"`") {
		return true
	}
	parts := strings.Split(pkg, "/")
	for i := len(parts) - 1; i > 0; i-- {
		ancestor := strings.Join(parts[:i], "/")
		rest := parts[i:]
		for _, row := range strings.Split(layout, "\n") {
			if !strings.Contains(row, "`"+ancestor+"/…`") {
				continue
			}
			if strings.Contains(row, "`"+strings.Join(rest, "/")+"`") || strings.Contains(row, "`"+rest[0]+"/…`") {
				return true
			}
		}
	}
	return false
}

// section is the text of the markdown section that starts with heading,
// up to the next heading of the same level.
func section(doc, heading string) string {
	i := strings.Index(doc, "\n"+heading)
	if i < 0 {
		return ""
	}
	rest := doc[i+1+len(heading):]
	if j := strings.Index(rest, "\n## "); j >= 0 {
		rest = rest[:j]
	}
	return rest
}

// packages lists the directories under root that hold non-test Go files,
// as slash paths relative to root.
func packages(t *testing.T, root string) []string {
	t.Helper()
	seen := map[string]bool{}
	var out []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "bin") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		rel, err := filepath.Rel(root, filepath.Dir(path))
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		if rel != "." && !seen[rel] {
			seen[rel] = true
			out = append(out, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}
