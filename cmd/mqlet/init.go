package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/mqlet/mqlet/config"
)

// initConfig is what `mqlet init` writes: only the keys it was given, so
// every other setting keeps its documented default (configs/mqlet.yaml,
// installed as /usr/share/doc/mqlet/mqlet.yaml).
type initConfig struct {
	Node           string              `json:"node"`
	StateDir       string              `json:"stateDir,omitempty"`
	MQTT           initMQTT            `json:"mqtt"`
	EmbeddedBroker *initEmbeddedBroker `json:"embeddedBroker,omitempty"`
	Runtime        *initRuntime        `json:"runtime,omitempty"`
}

type initMQTT struct {
	Broker   string `json:"broker"`
	CAFile   string `json:"caFile,omitempty"`
	CertFile string `json:"certFile,omitempty"`
	KeyFile  string `json:"keyFile,omitempty"`
}

type initEmbeddedBroker struct {
	Enabled bool   `json:"enabled"`
	Listen  string `json:"listen"`
}

type initRuntime struct {
	CRIEndpoint string `json:"criEndpoint"`
}

const initHeader = `# Written by "mqlet init". Every other setting keeps its default; all of
# them are documented in /usr/share/doc/mqlet/mqlet.yaml (configs/mqlet.yaml).
# Check with: mqlet --check-config --config %s
`

// runInit writes a configuration from flags, after checking that mqlet
// would accept it, so that no step of an install needs an editor.
func runInit(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("mqlet init", flag.ContinueOnError)
	fs.SetOutput(stderr)
	out := fs.String("config", "/etc/mqlet/mqlet.yaml", "file to write")
	node := fs.String("node", "", "node name: the <node> level of every topic (required)")
	broker := fs.String("broker", "", "MQTT broker URL: tcp://, ssl://, ws:// or wss:// (required unless --embedded-broker)")
	ca := fs.String("ca", "", "CA bundle that signed the broker's certificate")
	cert := fs.String("cert", "", "this node's client certificate (CN = node name) for mTLS")
	key := fs.String("key", "", "the client certificate's private key")
	embedded := fs.Bool("embedded-broker", false, "single box: run the MQTT broker inside mqlet on 127.0.0.1:1883")
	stateDir := fs.String("state-dir", "", "state directory (default /var/lib/mqlet)")
	cri := fs.String("cri-endpoint", "", "CRI endpoint (the package's containerd: unix:///run/mqlet/containerd/containerd.sock)")
	force := fs.Bool("force", false, "replace a config that already names a broker")
	if err := fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return 0
		}
		return exitConfigInvalid
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "mqlet init: unexpected argument %q\n", fs.Arg(0))
		return exitConfigInvalid
	}
	c := initConfig{Node: *node, StateDir: *stateDir, MQTT: initMQTT{Broker: *broker}}
	var problems []string
	if *node == "" {
		problems = append(problems, "--node is required")
	}
	if *embedded {
		c.EmbeddedBroker = &initEmbeddedBroker{Enabled: true, Listen: "127.0.0.1:1883"}
		if c.MQTT.Broker == "" {
			c.MQTT.Broker = "tcp://127.0.0.1:1883"
		}
	} else if *broker == "" {
		problems = append(problems, "--broker is required (or --embedded-broker for a single box)")
	}
	for _, f := range []struct {
		flag string
		path *string
		dst  *string
	}{{"--ca", ca, &c.MQTT.CAFile}, {"--cert", cert, &c.MQTT.CertFile}, {"--key", key, &c.MQTT.KeyFile}} {
		if *f.path == "" {
			continue
		}
		abs, err := filepath.Abs(*f.path)
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s %s: %v", f.flag, *f.path, err))
			continue
		}
		if _, err := os.Stat(abs); err != nil {
			problems = append(problems, fmt.Sprintf("%s: %v", f.flag, err))
		}
		*f.dst = abs
	}
	if *cri == "" {
		// The package's comment-free stanza points at its own containerd;
		// a re-init keeps it unless told otherwise.
		*cri = existingCRIEndpoint(*out)
	}
	if *cri != "" {
		c.Runtime = &initRuntime{CRIEndpoint: *cri}
	}
	if len(problems) > 0 {
		fmt.Fprintln(stderr, "mqlet init: "+strings.Join(problems, "; "))
		return exitConfigInvalid
	}
	if !*force {
		named, err := namesBroker(*out)
		if err != nil {
			fmt.Fprintln(stderr, "mqlet init:", err)
			return exitConfigInvalid
		}
		if named {
			fmt.Fprintf(stderr, "mqlet init: %s already names a broker; pass --force to replace it\n", *out)
			return exitConfigInvalid
		}
	}
	body, err := yaml.Marshal(c)
	if err != nil {
		fmt.Fprintln(stderr, "mqlet init: encoding config:", err)
		return 1
	}
	data := append([]byte(fmt.Sprintf(initHeader, *out)), body...)
	if err := writeCheckedConfig(*out, data, stderr); err != nil {
		fmt.Fprintln(stderr, "mqlet init:", err)
		return exitConfigInvalid
	}
	fmt.Fprintf(stdout, "wrote %s for node %q, broker %s\n", *out, c.Node, c.MQTT.Broker)
	fmt.Fprintln(stdout, "start it with: systemctl restart mqlet   (logs: journalctl -u mqlet -f)")
	return 0
}

// writeCheckedConfig writes data next to path, loads it as mqlet would at
// start, and only then renames it into place: a refused config never
// replaces a working one.
func writeCheckedConfig(path string, data []byte, stderr io.Writer) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("creating %s: %w", dir, err)
	}
	tmp, err := os.CreateTemp(dir, ".mqlet-init-*.yaml")
	if err != nil {
		return fmt.Errorf("writing config: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("writing config: %w", err)
	}
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return fmt.Errorf("writing config: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("writing config: %w", err)
	}
	flags, err := config.ParseFlags("mqlet", []string{"--config", tmp.Name()}, stderr)
	if err != nil {
		return err
	}
	// Only the file counts: the environment of the shell running init must
	// not make a config look valid that the service would refuse.
	cfg, err := config.Load(flags, func(string) string { return "" })
	if err != nil {
		return fmt.Errorf("the config would be refused: %w", err)
	}
	if _, err := tlsFor(cfg); err != nil {
		return fmt.Errorf("the config would be refused: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("installing config: %w", err)
	}
	return nil
}

// existingCRIEndpoint returns runtime.criEndpoint of the file at path, or ""
// when there is none (or the file cannot be read: init then writes the default).
func existingCRIEndpoint(path string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	var doc struct {
		Runtime struct {
			CRIEndpoint string `json:"criEndpoint"`
		} `json:"runtime"`
	}
	if yaml.Unmarshal(data, &doc) != nil {
		return ""
	}
	return doc.Runtime.CRIEndpoint
}
