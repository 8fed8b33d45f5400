package main

import (
	"crypto/ed25519"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	apiv1 "github.com/mqlet/mqlet/api/v1"
	"github.com/mqlet/mqlet/mqtt/session"
	"github.com/mqlet/mqlet/signing"
)

// Environment variables read for defaults (flags override them).
const (
	envBroker   = "MQLETCTL_BROKER"
	envNode     = "MQLETCTL_NODE"
	envPassword = "MQLETCTL_PASSWORD"
	envSignKey  = "MQLETCTL_SIGN_KEY"
)

const (
	defaultBroker        = "tcp://127.0.0.1:1883"
	defaultTimeout       = 60 * time.Second
	defaultRetainedWait  = 2 * time.Second
	defaultConnectBudget = 10 * time.Second
	defaultSignTTL       = 5 * time.Minute
)

// globalConfig holds the flags every subcommand accepts.
type globalConfig struct {
	Broker       string
	Node         string
	Prefix       string
	Username     string
	PasswordFile string
	CAFile       string
	CertFile     string
	KeyFile      string
	Timeout      time.Duration
	RetainedWait time.Duration
	WaitOffline  bool
	// Expires, when set, is how long a command may wait before it runs: a
	// node that takes it later answers failed "expired" instead.
	Expires    time.Duration
	Output     string
	SignKey    string
	KeyID      string
	SignTTL    time.Duration
	ConfigFile string // mqletctl's own config file (contexts)
	Context    string // the context to use from it

	// explicit names the global flags given on the command line, and the
	// settings taken from the environment: a context fills only the rest.
	explicit    map[string]bool
	getenv      func(string) string
	contextName string // the context in use, "" for none

	// signer signs every command when SignKey is given (loaded by resolve);
	// now is the clock of its iat and exp.
	signer *signing.Signer
	// signKey is the key itself, which also signs rollout documents.
	signKey ed25519.PrivateKey
	now     func() time.Time

	// fleet is --group and -L, given before the command (mqletctl
	// --group G get pods) or among its flags (fleetCommands).
	fleet fleetFlags

	// password is read from the environment or the password file by
	// resolve; it is never a flag, so it does not show up in ps or history.
	password string
}

// newGlobalConfig returns the defaults, taking the environment into account.
func newGlobalConfig(getenv func(string) string) *globalConfig {
	c := &globalConfig{
		Broker:       defaultBroker,
		Node:         getenv(envNode),
		Prefix:       apiv1.DefaultPrefix,
		Timeout:      defaultTimeout,
		RetainedWait: defaultRetainedWait,
		SignKey:      getenv(envSignKey),
		SignTTL:      defaultSignTTL,
		now:          time.Now,
		explicit:     map[string]bool{},
		getenv:       getenv,
	}
	if b := getenv(envBroker); b != "" {
		c.Broker = b
	}
	c.explicit["broker"] = c.Broker != defaultBroker
	c.explicit["node"] = c.Node != ""
	c.explicit["sign-key"] = c.SignKey != ""
	c.password = getenv(envPassword)
	return c
}

// register adds the global flags to fs, bound to c. Each subcommand's flag
// set registers them too, so they may come before or after the subcommand.
func (c *globalConfig) register(fs *flag.FlagSet) {
	all := flag.NewFlagSet("", flag.ContinueOnError)
	c.registerOn(all)
	if c.explicit == nil {
		c.explicit = map[string]bool{}
	}
	all.VisitAll(func(f *flag.Flag) {
		fs.Var(&trackedValue{Value: f.Value, name: f.Name, set: c.explicit}, f.Name, f.Usage)
	})
}

func (c *globalConfig) registerOn(fs *flag.FlagSet) {
	fs.StringVar(&c.ConfigFile, "config", c.ConfigFile, "mqletctl config file with contexts (env "+envConfig+"; default $XDG_CONFIG_HOME/mqletctl/config.yaml)")
	fs.StringVar(&c.Context, "context", c.Context, "context of the config file to use (env "+envContext+"; default: its currentContext)")
	fs.StringVar(&c.Broker, "broker", c.Broker, "MQTT broker URL: tcp://, ssl://, ws:// or wss:// (env "+envBroker+")")
	fs.StringVar(&c.Node, "node", c.Node, "node name to command (required; env "+envNode+")")
	fs.StringVar(&c.Prefix, "prefix", c.Prefix, "topic prefix")
	fs.StringVar(&c.Username, "username", c.Username, "MQTT username (password from env "+envPassword+" or --password-file)")
	fs.StringVar(&c.PasswordFile, "password-file", c.PasswordFile, "file holding the MQTT password (first line)")
	fs.StringVar(&c.CAFile, "ca-file", c.CAFile, "PEM CA bundle to verify the broker (replaces the system roots)")
	fs.StringVar(&c.CertFile, "cert-file", c.CertFile, "PEM client certificate for mTLS")
	fs.StringVar(&c.KeyFile, "key-file", c.KeyFile, "PEM client key for mTLS")
	fs.DurationVar(&c.Timeout, "timeout", c.Timeout, "how long to wait for the broker and the agent's reply")
	fs.DurationVar(&c.RetainedWait, "retained-wait", c.RetainedWait, "how long status waits for retained topics that may not exist")
	fs.DurationVar(&c.Expires, "expires", c.Expires, "a node that gets the command later than this (e.g. offline meanwhile) answers failed: expired instead of running it (default: no expiry; a signed command's --sign-ttl still applies)")
	fs.BoolVar(&c.WaitOffline, "wait-offline", c.WaitOffline, "wait for the reply of a node whose retained state says offline (default: say the command is queued and exit 3)")
	fs.StringVar(&c.SignKey, "sign-key", c.SignKey, "Ed25519 private key file (from 'keys generate'): sign every command for the node (env "+envSignKey+")")
	fs.StringVar(&c.KeyID, "key-id", c.KeyID, "key id put in signed commands (default: derived from the key, as the node derives it)")
	fs.DurationVar(&c.SignTTL, "sign-ttl", c.SignTTL, "how long a signed command stays valid")
}

// registerOutput adds -o/--output with the formats a subcommand supports.
func (c *globalConfig) registerOutput(fs *flag.FlagSet, formats string) {
	usage := "output format: " + formats
	fs.StringVar(&c.Output, "o", c.Output, usage)
	fs.StringVar(&c.Output, "output", c.Output, usage)
}

// checkOutput rejects an output format the subcommand does not know.
func (c *globalConfig) checkOutput(allowed ...string) error {
	if c.Output == "" {
		return nil
	}
	for _, a := range allowed {
		if c.Output == a {
			return nil
		}
	}
	return usageError{fmt.Errorf("unknown output format %q (want one of: %s)", c.Output, strings.Join(allowed, ", "))}
}

// resolve validates the configuration for commanding one node and loads
// the password file.
func (c *globalConfig) resolve() error {
	return c.resolveFor(true)
}

// resolveFleet is resolve for commands that read every node under the
// prefix (get nodes) and need no --node.
func (c *globalConfig) resolveFleet() error {
	return c.resolveFor(false)
}

func (c *globalConfig) resolveFor(needNode bool) error {
	if c.getenv == nil {
		c.getenv = func(string) string { return "" }
	}
	if err := c.applyContext(); err != nil {
		return err
	}
	if needNode {
		if c.Node == "" {
			return usageError{errors.New("no node given: use --node NAME, set " + envNode + " or a context's node")}
		}
		if err := c.scheme().Validate(); err != nil {
			return usageError{err}
		}
	} else if err := apiv1.ValidatePrefix(c.Prefix); err != nil {
		return usageError{err}
	}
	if err := session.ValidateBrokerURL(c.Broker); err != nil {
		return usageError{err}
	}
	if c.Timeout <= 0 {
		return usageError{fmt.Errorf("--timeout %v must be positive", c.Timeout)}
	}
	if err := c.loadSigner(); err != nil {
		return err
	}
	if c.PasswordFile != "" {
		data, err := os.ReadFile(c.PasswordFile)
		if err != nil {
			return fmt.Errorf("reading password file: %w", err)
		}
		first, _, _ := strings.Cut(string(data), "\n")
		c.password = strings.TrimRight(first, "\r")
		if c.password == "" {
			return fmt.Errorf("password file %s is empty", c.PasswordFile)
		}
	}
	return nil
}

// loadSigner reads the signing key when one is given.
func (c *globalConfig) loadSigner() error {
	if c.Expires < 0 {
		return usageError{fmt.Errorf("--expires must be positive, got %s", c.Expires)}
	}
	if c.SignKey == "" {
		if c.KeyID != "" {
			return usageError{errors.New("--key-id needs --sign-key")}
		}
		return nil
	}
	if c.SignTTL <= 0 {
		return usageError{fmt.Errorf("--sign-ttl %v must be positive", c.SignTTL)}
	}
	key, err := signing.ReadPrivateKeyFile(c.SignKey)
	if err != nil {
		return err
	}
	s, err := signing.NewSigner(c.KeyID, key)
	if err != nil {
		return usageError{fmt.Errorf("--key-id: %w", err)}
	}
	c.signer, c.signKey = s, key
	return nil
}

// seal signs a command for the node when a signing key is given, else
// returns it as it is.
func (c *globalConfig) seal(verb, requestID string, payload []byte) ([]byte, error) {
	return c.sealAs(c.Node, verb, requestID, payload)
}

// sealAs is seal for a command to target: a node, or a group (the node
// claim of a group command names the group).
func (c *globalConfig) sealAs(target, verb, requestID string, payload []byte) ([]byte, error) {
	now := c.now()
	exp := now.Add(c.SignTTL)
	if c.Expires > 0 {
		exp = now.Add(c.Expires)
		var err error
		if payload, err = apiv1.WrapEnvelope(payload, exp); err != nil {
			return nil, err
		}
	}
	if c.signer == nil {
		return payload, nil
	}
	return c.signer.Sign(signing.Claims{Node: target, Verb: verb, RequestID: requestID, IssuedAt: now, Expires: exp}, payload)
}

// scheme is the topic scheme of the commanded node.
func (c *globalConfig) scheme() apiv1.Scheme {
	return apiv1.Scheme{Prefix: c.Prefix, Node: c.Node}
}

// usageError marks an error caused by the command line (exit code 2).
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }
