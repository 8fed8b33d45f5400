package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

func TestPackageOf(t *testing.T) {
	for sym, want := range map[string]string{
		"k8s.io/api/core/v1.(*PodSpec).Unmarshal":                       "k8s.io/api/core/v1",
		"k8s.io/kubernetes/pkg/features.init":                           "k8s.io/kubernetes/pkg/features",
		"runtime.mallocgc":                                              "runtime",
		"github.com/eclipse/paho%2emqtt%2egolang.(*client).Connect":     "github.com/eclipse/paho.mqtt.golang",
		"type:.eq.k8s.io/api/core/v1.NodeSystemInfo":                    "k8s.io/api/core/v1",
		"go:itab.*github.com/mqlet/mqlet/cri.statusOnly,k8s.io/cri-api": "github.com/mqlet/mqlet/cri",
		"slices.SortFunc[go.shape.[]string,go.shape.string]":            "slices",
		"k8s.io/apimachinery/pkg/util/sets.Set[go.shape.string].Insert": "k8s.io/apimachinery/pkg/util/sets",
		"go:func.*":                               "go:func.*",
		"type:.namedata.*func() string-":          "(type data)",
		"vendor/golang.org/x/net/idna.idnaValues": "vendor/golang.org/x/net/idna",
	} {
		if got := packageOf(sym); got != want {
			t.Errorf("packageOf(%q) = %q, want %q", sym, got, want)
		}
	}
}

func TestParseInitTrace(t *testing.T) {
	in := "init internal/bytealg @0.003 ms, 0.005 ms clock, 0 bytes, 0 allocs\n" +
		"mqlet dev\n" +
		"init k8s.io/kubernetes/pkg/features @12 ms, 3.9 ms clock, 550304 bytes, 6897 allocs\n"
	costs, err := parseInitTrace(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if len(costs) != 2 || costs[1] != (initCost{pkg: "k8s.io/kubernetes/pkg/features", ms: 3.9, bytes: 550304, allocs: 6897}) {
		t.Fatalf("got %+v", costs)
	}
	if _, err := parseInitTrace(strings.NewReader("nothing\n")); err == nil {
		t.Fatal("a trace without init lines was read")
	}
}

// TestCheckFailsOnGrowth builds a tiny stripped program, records its size
// and checks it against a record 5 % and 10 % smaller.
func TestCheckFailsOnGrowth(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "tiny")
	if err := os.MkdirAll(src, 0o755); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(src, "go.mod"), "module example.com/tiny\n\ngo 1.22\n")
	write(t, filepath.Join(src, "main.go"), "package main\n\nfunc main() { println(\"tiny\") }\n")
	bin := filepath.Join(dir, "tiny.bin")
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", bin, ".")
	cmd.Dir = src
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64", "GOFLAGS=-mod=mod", "GOWORK=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v: %s", err, out)
	}
	record := filepath.Join(dir, "sizes.txt")
	var out, errOut bytes.Buffer
	if code := run([]string{"record", "-record", record, bin}, &out, &errOut); code != 0 {
		t.Fatalf("record: exit %d: %s", code, errOut.String())
	}
	b, err := readBinary(bin)
	if err != nil {
		t.Fatal(err)
	}
	if b.key() != "tiny linux/amd64" {
		t.Fatalf("key %q, want tiny linux/amd64", b.key())
	}
	if code := run([]string{"check", "-record", record, bin}, &out, &errOut); code != 0 {
		t.Fatalf("check against its own record: exit %d: %s", code, errOut.String())
	}
	for _, c := range []struct {
		recorded int64
		ok       bool
	}{{b.size * 100 / 104, true}, {b.size * 100 / 110, false}} {
		write(t, record, "tiny linux/amd64 "+strconv.FormatInt(c.recorded, 10)+"\n")
		errOut.Reset()
		code := run([]string{"check", "-record", record, bin}, &out, &errOut)
		if (code == 0) != c.ok {
			t.Errorf("record %d, binary %d: exit %d (%s), want ok=%v", c.recorded, b.size, code, errOut.String(), c.ok)
		}
		if !c.ok && !strings.Contains(errOut.String(), "grew") {
			t.Errorf("the failure does not say what grew: %s", errOut.String())
		}
	}
	write(t, record, "other linux/amd64 100\n")
	if code := run([]string{"check", "-record", record, bin}, &out, &errOut); code == 0 {
		t.Error("a binary without a record passed")
	}
}

func write(t *testing.T, file, content string) {
	t.Helper()
	if err := os.WriteFile(file, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}
