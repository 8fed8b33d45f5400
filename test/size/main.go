// Command size measures mqlet's binaries: what each package and module adds
// to a build (report), what each package's init costs (inits), and whether a
// stripped binary grew past the recorded figure (check, record).
//
//	go run ./test/size report [-by package|module] [-top 40] BINARY   # a build with symbols
//	go run ./test/size inits [-top 25] BINARY                          # GODEBUG=inittrace=1
//	go run ./test/size check [-record FILE] [-max-growth 5] BINARY...  # stripped builds
//	go run ./test/size record [-record FILE] BINARY...
//
// make build, make size and test/run-tests.sh run it; docs/benchmarks.md
// holds the breakdown it gave.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintln(stderr, "usage: size report|inits|check|record [flags] BINARY...")
		return 2
	}
	var err error
	switch args[0] {
	case "report":
		err = runReport(args[1:], stdout, stderr)
	case "inits":
		err = runInits(args[1:], stdout, stderr)
	case "check":
		err = runCheck(args[1:], stdout, stderr)
	case "record":
		err = runRecord(args[1:], stdout, stderr)
	default:
		err = fmt.Errorf("unknown command %q (report, inits, check, record)", args[0])
	}
	var usage usageError
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &usage):
		fmt.Fprintln(stderr, "size:", err)
		return 2
	default:
		fmt.Fprintln(stderr, "size:", err)
		return 1
	}
}

// usageError is a mistake in the command line (exit 2), not a measurement
// that failed (exit 1).
type usageError struct{ error }
