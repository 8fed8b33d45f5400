package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
)

// newFlagSet returns a subcommand's flag set with the global flags
// registered. It prints nothing itself: run prints the help on stdout for
// --help, and a one-line complaint on stderr for a bad flag. (A writer
// argument, where the usage used to go, is accepted and not used.)
func newFlagSet(name string, cfg *globalConfig, _ ...io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("mqletctl "+name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	cfg.register(fs)
	return fs
}

// flagError rewords the flag package's complaints the way kubectl says them.
func flagError(err error) error {
	msg := err.Error()
	if name, ok := strings.CutPrefix(msg, "flag provided but not defined: -"); ok {
		return fmt.Errorf("unknown flag: --%s", strings.TrimPrefix(name, "-"))
	}
	if name, ok := strings.CutPrefix(msg, "flag needs an argument: -"); ok {
		return fmt.Errorf("flag needs an argument: --%s", strings.TrimPrefix(name, "-"))
	}
	return err
}

// parseInterleaved parses flags that may appear before, between and after
// positional arguments (kubectl style: `get pods web -n kube-system`), and
// returns the positional arguments in order. "--" ends flag parsing.
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, helpRequest{fs}
			}
			return nil, usageError{flagError(err)}
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return positional, nil
		}
		// flag stops at "--" (and consumes it) or at the first positional.
		consumed := len(args) - len(rest)
		if consumed > 0 && args[consumed-1] == "--" {
			return append(positional, rest...), nil
		}
		positional = append(positional, rest[0])
		args = rest[1:]
	}
}
