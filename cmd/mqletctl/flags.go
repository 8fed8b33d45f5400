package main

import (
	"flag"
	"io"
)

// newFlagSet returns a subcommand's flag set with the global flags
// registered, writing its usage to w.
func newFlagSet(name string, cfg *globalConfig, w io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("mqletctl "+name, flag.ContinueOnError)
	fs.SetOutput(w)
	cfg.register(fs)
	return fs
}

// parseInterleaved parses flags that may appear before, between and after
// positional arguments (kubectl style: `get pods web -n kube-system`), and
// returns the positional arguments in order. "--" ends flag parsing.
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
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
