package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/mqlet/mqlet/config"
)

// Exit codes of --check-config. The packaged systemd unit runs it as
// ExecCondition: any code from 1 to 254 skips the start without a failure,
// so a freshly installed node stays down until `mqlet init` names a broker.
const (
	exitConfigOK       = 0
	exitConfigInvalid  = 2
	exitConfigNoBroker = 3
)

// checkFlags are the flags handled before config.ParseFlags sees the
// command line: they change what mqlet does, not how it is configured.
type checkFlags struct {
	check         bool // --check-config: validate and exit
	requireBroker bool // --require-broker: also insist that the file names a broker
}

// splitCheckFlags removes --check-config and --require-broker from args.
func splitCheckFlags(args []string) (checkFlags, []string) {
	var f checkFlags
	rest := make([]string, 0, len(args))
	for _, a := range args {
		switch strings.TrimLeft(a, "-") {
		case "check-config":
			if strings.HasPrefix(a, "-") {
				f.check = true
				continue
			}
		case "require-broker":
			if strings.HasPrefix(a, "-") {
				f.requireBroker = true
				continue
			}
		}
		rest = append(rest, a)
	}
	return f, rest
}

// checkConfig loads and validates the configuration as a start would, also
// loading the TLS material it names, and says what is wrong or what mqlet
// would connect to.
func checkConfig(flags *config.Flags, cf checkFlags, getenv func(string) string, stdout, stderr io.Writer) int {
	cfg, err := config.Load(flags, getenv)
	if err != nil {
		fmt.Fprintln(stderr, "mqlet: configuration is not valid:")
		for _, line := range strings.Split(err.Error(), "\n") {
			fmt.Fprintln(stderr, "  -", line)
		}
		return exitConfigInvalid
	}
	if _, err := tlsFor(cfg); err != nil {
		fmt.Fprintln(stderr, "mqlet: configuration is not valid:\n  -", err)
		return exitConfigInvalid
	}
	if cf.requireBroker {
		named, err := namesBroker(flags.ConfigFile)
		if err != nil {
			fmt.Fprintln(stderr, "mqlet:", err)
			return exitConfigInvalid
		}
		if !named {
			fmt.Fprintf(stderr, "mqlet: %s names no broker yet (mqtt.broker or embeddedBroker.enabled); run: mqlet init --node NAME --broker URL\n", orNone(flags.ConfigFile))
			return exitConfigNoBroker
		}
	}
	fmt.Fprintf(stdout, "configuration OK: node %q, broker %s, CRI %s, state %s", cfg.Node, cfg.MQTT.Broker, cfg.Runtime.CRIEndpoint, cfg.StateDir)
	if cfg.EmbeddedBroker.Enabled {
		fmt.Fprintf(stdout, ", embedded broker on %s", cfg.EmbeddedBroker.Listen)
	}
	fmt.Fprintln(stdout)
	return exitConfigOK
}

// namesBroker reports whether the config file itself sets mqtt.broker or
// enables the embedded broker; the default broker does not count, so the
// comment-only file the package installs is "not configured yet".
func namesBroker(file string) (bool, error) {
	if file == "" {
		return false, nil
	}
	data, err := os.ReadFile(file)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("reading config file: %w", err)
	}
	var doc struct {
		MQTT struct {
			Broker string `json:"broker"`
		} `json:"mqtt"`
		EmbeddedBroker struct {
			Enabled bool `json:"enabled"`
		} `json:"embeddedBroker"`
	}
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return false, fmt.Errorf("parsing config file %s: %w", file, err)
	}
	return doc.MQTT.Broker != "" || doc.EmbeddedBroker.Enabled, nil
}

func orNone(file string) string {
	if file == "" {
		return "the configuration (no --config file)"
	}
	return file
}
