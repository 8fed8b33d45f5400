package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"sigs.k8s.io/yaml"
)

// Environment variables that select the config file and context.
const (
	envConfig  = "MQLETCTL_CONFIG"
	envContext = "MQLETCTL_CONTEXT"
)

// fileConfig is mqletctl's config file, shaped like a kubeconfig: named
// contexts, one of them current. Relative paths are relative to the file.
type fileConfig struct {
	CurrentContext string        `json:"currentContext,omitempty"`
	Contexts       []contextSpec `json:"contexts"`
}

// contextSpec is one broker and node to talk to, and how to log in.
type contextSpec struct {
	Name         string `json:"name"`
	Broker       string `json:"broker,omitempty"`
	Prefix       string `json:"prefix,omitempty"`
	Node         string `json:"node,omitempty"` // the default --node
	Username     string `json:"username,omitempty"`
	PasswordFile string `json:"passwordFile,omitempty"`
	CAFile       string `json:"caFile,omitempty"`
	CertFile     string `json:"certFile,omitempty"`
	KeyFile      string `json:"keyFile,omitempty"`
	SignKey      string `json:"signKey,omitempty"`
}

// configPath is where the config file is looked for: --config, then
// $MQLETCTL_CONFIG, then $XDG_CONFIG_HOME/mqletctl/config.yaml, then
// ~/.config/mqletctl/config.yaml. explicit says the user named it, so its
// absence is an error.
func configPath(flagValue string, getenv func(string) string) (path string, explicit bool) {
	if flagValue != "" {
		return flagValue, true
	}
	if p := getenv(envConfig); p != "" {
		return p, true
	}
	if x := getenv("XDG_CONFIG_HOME"); x != "" {
		return filepath.Join(x, "mqletctl", "config.yaml"), false
	}
	if h := getenv("HOME"); h != "" {
		return filepath.Join(h, ".config", "mqletctl", "config.yaml"), false
	}
	return "", false
}

// loadFileConfig reads the config file; a missing default file is no
// config at all.
func loadFileConfig(path string, explicit bool, getenv func(string) string) (*fileConfig, error) {
	if path == "" {
		return &fileConfig{}, nil
	}
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) && !explicit {
		return &fileConfig{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading config file: %w", err)
	}
	var fc fileConfig
	if err := yaml.UnmarshalStrict(data, &fc); err != nil {
		return nil, fmt.Errorf("config file %s: %w", path, err)
	}
	seen := map[string]bool{}
	for i, c := range fc.Contexts {
		if c.Name == "" {
			return nil, fmt.Errorf("config file %s: contexts[%d] has no name", path, i)
		}
		if seen[c.Name] {
			return nil, fmt.Errorf("config file %s: context %q is defined twice", path, c.Name)
		}
		seen[c.Name] = true
	}
	dir := filepath.Dir(path)
	for i := range fc.Contexts {
		c := &fc.Contexts[i]
		for _, p := range []*string{&c.PasswordFile, &c.CAFile, &c.CertFile, &c.KeyFile, &c.SignKey} {
			*p = relativeTo(dir, *p, getenv)
		}
	}
	return &fc, nil
}

// relativeTo resolves ~/ and paths relative to the config file's dir.
func relativeTo(dir, p string, getenv func(string) string) string {
	switch {
	case p == "":
		return ""
	case strings.HasPrefix(p, "~/"):
		if h := getenv("HOME"); h != "" {
			return filepath.Join(h, p[2:])
		}
		return p
	case filepath.IsAbs(p):
		return p
	}
	return filepath.Join(dir, p)
}

// applyContext fills every setting that neither a flag nor the environment
// gave from the selected context: flag > environment > context > default.
func (c *globalConfig) applyContext() error {
	path, explicit := configPath(c.ConfigFile, c.getenv)
	fc, err := loadFileConfig(path, explicit, c.getenv)
	if err != nil {
		return err
	}
	name := c.Context
	if name == "" {
		name = c.getenv(envContext)
	}
	if name == "" {
		name = fc.CurrentContext
	}
	if name == "" {
		return nil
	}
	var ctx *contextSpec
	for i := range fc.Contexts {
		if fc.Contexts[i].Name == name {
			ctx = &fc.Contexts[i]
		}
	}
	if ctx == nil {
		if path == "" {
			return usageError{fmt.Errorf("context %q: no config file (looked for $XDG_CONFIG_HOME/mqletctl/config.yaml)", name)}
		}
		return usageError{fmt.Errorf("context %q is not in %s", name, path)}
	}
	c.contextName = name
	fill := func(flagName string, dst *string, v string) {
		if v != "" && !c.explicit[flagName] {
			*dst = v
		}
	}
	fill("broker", &c.Broker, ctx.Broker)
	fill("prefix", &c.Prefix, ctx.Prefix)
	fill("node", &c.Node, ctx.Node)
	fill("username", &c.Username, ctx.Username)
	fill("ca-file", &c.CAFile, ctx.CAFile)
	fill("cert-file", &c.CertFile, ctx.CertFile)
	fill("key-file", &c.KeyFile, ctx.KeyFile)
	fill("sign-key", &c.SignKey, ctx.SignKey)
	// A password from the environment wins over the context's file.
	if c.password == "" {
		fill("password-file", &c.PasswordFile, ctx.PasswordFile)
	}
	return nil
}

// trackedValue records that a global flag was given on the command line,
// so the context does not override it.
type trackedValue struct {
	flag.Value
	name string
	set  map[string]bool
}

func (t *trackedValue) Set(s string) error {
	t.set[t.name] = true
	return t.Value.Set(s)
}

// Unwrap gives the help printer the real value, for its type name.
func (t *trackedValue) Unwrap() flag.Value { return t.Value }

// IsBoolFlag keeps a boolean global flag usable without a value.
func (t *trackedValue) IsBoolFlag() bool {
	b, ok := t.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}
