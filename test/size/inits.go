package main

import (
	"bufio"
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
)

// initCost is one package's init as GODEBUG=inittrace=1 reports it.
type initCost struct {
	pkg    string
	ms     float64
	bytes  int64
	allocs int64
}

func runInits(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("inits", flag.ContinueOnError)
	fs.SetOutput(stderr)
	top := fs.Int("top", 25, "rows shown, by bytes allocated")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return usageError{fmt.Errorf("inits [-top N] BINARY")}
	}
	// --version runs every package's init and stops: what any start pays
	// before main.
	cmd := exec.Command(fs.Arg(0), "--version")
	cmd.Env = append(os.Environ(), "GODEBUG=inittrace=1")
	var trace bytes.Buffer
	cmd.Stderr = &trace
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("run %s --version: %w: %s", fs.Arg(0), err, trace.String())
	}
	costs, err := parseInitTrace(&trace)
	if err != nil {
		return err
	}
	printInits(stdout, costs, *top)
	return nil
}

// parseInitTrace reads lines of the form
// "init PKG @0.12 ms, 0.034 ms clock, 1234 bytes, 5 allocs".
func parseInitTrace(r io.Reader) ([]initCost, error) {
	var costs []initCost
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 11 || f[0] != "init" || f[6] != "clock," || f[8] != "bytes," || f[10] != "allocs" {
			continue
		}
		ms, err1 := strconv.ParseFloat(f[4], 64)
		b, err2 := strconv.ParseInt(f[7], 10, 64)
		a, err3 := strconv.ParseInt(f[9], 10, 64)
		if err1 != nil || err2 != nil || err3 != nil {
			return nil, fmt.Errorf("unreadable inittrace line %q", sc.Text())
		}
		costs = append(costs, initCost{pkg: f[1], ms: ms, bytes: b, allocs: a})
	}
	if len(costs) == 0 {
		return nil, fmt.Errorf("no inittrace lines (was GODEBUG=inittrace=1 honoured?)")
	}
	return costs, sc.Err()
}

func printInits(w io.Writer, costs []initCost, top int) {
	var total initCost
	for _, c := range costs {
		total.ms += c.ms
		total.bytes += c.bytes
		total.allocs += c.allocs
	}
	slices.SortFunc(costs, func(a, b initCost) int {
		if a.bytes != b.bytes {
			return int(b.bytes - a.bytes)
		}
		return strings.Compare(a.pkg, b.pkg)
	})
	fmt.Fprintf(w, "%d package inits: %.1f ms clock, %d bytes (%s) in %d allocations\n",
		len(costs), total.ms, total.bytes, mib(total.bytes), total.allocs)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "bytes\tallocs\tms\tpackage\t")
	for i, c := range costs {
		if i == top {
			break
		}
		fmt.Fprintf(tw, "%d\t%d\t%.2f\t%s\t\n", c.bytes, c.allocs, c.ms, c.pkg)
	}
	tw.Flush()
}
