package config

import (
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Flags are the command-line overrides. A flag that was not given leaves
// the value from the file or environment alone.
type Flags struct {
	ConfigFile string
	Version    bool
	set        map[string]string
}

// flagKeys maps each override flag to the environment key it shares.
var flagKeys = []struct{ flag, env, usage string }{
	{"node", "NODE", "node name (default: hostname)"},
	{"groups", "GROUPS", "groups the node is in, comma-separated (e.g. line-1,plant-3)"},
	{"broker", "BROKER", "MQTT broker URL: tcp://, ssl://, ws:// or wss://"},
	{"state-dir", "STATE_DIR", "directory for persisted state (default /var/lib/mqlet)"},
	{"cri-endpoint", "CRI_ENDPOINT", "CRI endpoint (default unix:///run/containerd/containerd.sock)"},
	{"log-level", "LOG_LEVEL", "trace, debug, info, warn or error"},
	{"metrics-interval", "METRICS_INTERVAL", "how often metrics are published, e.g. 30s; 0 turns them off"},
	{"node-status-interval", "NODE_STATUS_INTERVAL", "how often node status is republished, e.g. 1m"},
	{"embedded-broker", "EMBEDDED_BROKER", "run an MQTT broker inside mqlet (true/false)"},
	{"embedded-broker-listen", "EMBEDDED_BROKER_LISTEN", "address of the embedded broker (default 127.0.0.1:1883)"},
}

// ParseFlags reads the command line into Flags.
func ParseFlags(name string, args []string, out io.Writer) (*Flags, error) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(out)
	f := &Flags{set: map[string]string{}}
	fs.StringVar(&f.ConfigFile, "config", os.Getenv("MQLET_CONFIG"), "YAML configuration file (env MQLET_CONFIG)")
	fs.BoolVar(&f.Version, "version", false, "print the version and exit")
	values := make(map[string]*string, len(flagKeys))
	for _, k := range flagKeys {
		values[k.flag] = fs.String(k.flag, "", k.usage+" (env MQLET_"+k.env+")")
	}
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	fs.Visit(func(fl *flag.Flag) {
		if v, ok := values[fl.Name]; ok {
			f.set[fl.Name] = *v
		}
	})
	return f, nil
}

// Load builds the configuration: defaults, the YAML file (if any), MQLET_*
// environment variables, then flags. It validates the result.
func Load(f *Flags, getenv func(string) string) (*Config, error) {
	cfg := Default()
	if f.ConfigFile != "" {
		data, err := os.ReadFile(f.ConfigFile)
		if err != nil {
			return nil, fmt.Errorf("reading config file: %w", err)
		}
		if err := decodeStrict(data, &cfg); err != nil {
			return nil, fmt.Errorf("config file %s:\n%w", f.ConfigFile, err)
		}
	}
	for _, k := range flagKeys {
		v, fromFlag := f.set[k.flag]
		source := "--" + k.flag
		if !fromFlag {
			v = getenv("MQLET_" + k.env)
			source = "MQLET_" + k.env
			if v == "" {
				continue
			}
		}
		if err := cfg.override(k.flag, v); err != nil {
			return nil, fmt.Errorf("%s: %w", source, err)
		}
	}
	if pw := getenv("MQLET_MQTT_PASSWORD"); pw != "" {
		cfg.MQTT.Password = pw
	} else if cfg.MQTT.PasswordFile != "" {
		data, err := os.ReadFile(cfg.MQTT.PasswordFile)
		if err != nil {
			return nil, &FieldError{Field: "mqtt.passwordFile", Reason: err.Error()}
		}
		cfg.MQTT.Password = strings.TrimRight(string(data), "\r\n")
	}
	if u := getenv("MQLET_MQTT_USERNAME"); u != "" {
		cfg.MQTT.Username = u
	}
	if cfg.Node == "" {
		cfg.Node = defaultNode()
	}
	// Pod files (etc-hosts, volumes) under the state dir are bind-mounted by
	// the runtime, which resolves a relative path against its own directory.
	if cfg.StateDir != "" && !filepath.IsAbs(cfg.StateDir) {
		abs, err := filepath.Abs(cfg.StateDir)
		if err != nil {
			return nil, &FieldError{Field: "stateDir", Reason: err.Error()}
		}
		cfg.StateDir = abs
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if len(cfg.MQTT.Brokers) > 0 {
		cfg.MQTT.Broker = cfg.MQTT.Brokers[0]
	}
	return &cfg, nil
}

func (c *Config) override(flagName, v string) error {
	dur := func(dst *Duration) error {
		d, err := time.ParseDuration(v)
		if err != nil {
			return fmt.Errorf("invalid duration %q", v)
		}
		dst.Duration = d
		return nil
	}
	switch flagName {
	case "node":
		c.Node = v
	case "groups":
		c.Groups = []string{}
		for _, g := range strings.Split(v, ",") {
			if g = strings.TrimSpace(g); g != "" {
				c.Groups = append(c.Groups, g)
			}
		}
	case "broker":
		// One broker given as a flag or in the environment replaces the
		// file's list, as any flag replaces the file's value.
		c.MQTT.Broker, c.MQTT.Brokers = v, nil
	case "state-dir":
		c.StateDir = v
	case "cri-endpoint":
		c.Runtime.CRIEndpoint = v
	case "log-level":
		c.LogLevel = v
	case "metrics-interval":
		return dur(&c.Telemetry.MetricsInterval)
	case "node-status-interval":
		return dur(&c.Telemetry.NodeStatusInterval)
	case "embedded-broker":
		switch strings.ToLower(v) {
		case "true", "1", "yes":
			c.EmbeddedBroker.Enabled = true
		case "false", "0", "no":
			c.EmbeddedBroker.Enabled = false
		default:
			return fmt.Errorf("invalid boolean %q", v)
		}
	case "embedded-broker-listen":
		c.EmbeddedBroker.Listen = v
	}
	return nil
}
