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

// flagError rewords the flag package's complaints the way kubectl says
// them, naming the flag as it was typed in args (the flag package drops
// its dashes: -x and --x read the same).
func flagError(err error, args []string) error {
	msg := err.Error()
	if name, ok := strings.CutPrefix(msg, "flag provided but not defined: -"); ok {
		typed := asTyped(strings.TrimPrefix(name, "-"), args)
		if len(typed) == 2 {
			return fmt.Errorf("unknown shorthand flag: '%s' in %s", typed[1:], typed)
		}
		return fmt.Errorf("unknown flag: %s", typed)
	}
	if name, ok := strings.CutPrefix(msg, "flag needs an argument: -"); ok {
		return fmt.Errorf("flag needs an argument: %s", asTyped(strings.TrimPrefix(name, "-"), args))
	}
	return err
}

// asTyped is flag name as it appears in args: -x or --name (--name when
// it does not appear).
func asTyped(name string, args []string) string {
	for _, a := range args {
		if a == "--" {
			break
		}
		flagPart, _, _ := strings.Cut(a, "=")
		if flagPart == "-"+name || flagPart == "--"+name {
			return flagPart
		}
	}
	return "--" + name
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
			return nil, usageError{flagError(err, args)}
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
