package main

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/mqlet/mqlet/internal/pki"
)

const defaultCertDir = "mqlet-certs"

// hostList is a repeatable --host flag.
type hostList []string

func (h *hostList) String() string { return strings.Join(*h, ",") }
func (h *hostList) Set(v string) error {
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			*h = append(*h, s)
		}
	}
	return nil
}

// runCerts makes the fleet's certificates in --dir and says where each
// file goes: `certs ca`, `certs broker --host H`, `certs node NAME`,
// `certs operator`.
func runCerts(_ context.Context, cfg *globalConfig, args []string, e env) error {
	if len(args) == 0 {
		return usageError{errors.New("certs: want `certs ca|broker|node NAME|operator [--dir DIR]`")}
	}
	kind := args[0]
	if isHelpFlag(kind) {
		kind = "" // `certs --help`: list every kind's flags
	} else if strings.HasPrefix(kind, "-") {
		return usageError{fmt.Errorf("certs: want ca, broker, node NAME or operator before the flags, got %s", kind)}
	}
	fs := newFlagSet("certs "+kind, cfg)
	dir := fs.String("dir", defaultCertDir, "directory holding ca.crt/ca.key and the issued files")
	days := fs.Int("days", 0, "validity in days (default: CA 3650, others 825; never past the CA)")
	var hosts hostList
	if kind == "broker" || kind == "" {
		fs.Var(&hosts, "host", "DNS name or IP the gateways dial (repeat, or comma-separate)")
	}
	if kind == "" {
		args = append([]string{""}, args...)
	}
	pos, err := parseInterleaved(fs, args[1:])
	if err != nil {
		return err
	}
	validity := func(def int) time.Duration {
		if *days > 0 {
			return time.Duration(*days) * 24 * time.Hour
		}
		return time.Duration(def) * 24 * time.Hour
	}
	now := e.now()
	abs, err := filepath.Abs(*dir)
	if err != nil {
		return fmt.Errorf("--dir: %w", err)
	}
	caCert, caKey := filepath.Join(abs, "ca.crt"), filepath.Join(abs, "ca.key")
	if kind == "ca" {
		if len(pos) > 0 {
			return usageError{fmt.Errorf("certs ca: unexpected arguments %q", pos)}
		}
		p, err := pki.NewCA("mqlet fleet CA", validity(3650), now)
		if err != nil {
			return err
		}
		if _, _, err := pki.WritePair(abs, "ca", p); err != nil {
			return err
		}
		fmt.Fprintf(e.stdout, "fleet CA: %s (certificate: copy to the broker and every gateway)\n", caCert)
		fmt.Fprintf(e.stdout, "          %s (private key: keep offline; it signs every certificate of the fleet)\n", caKey)
		fmt.Fprintf(e.stdout, "next: mqletctl certs broker --dir %s --host BROKER-NAME-OR-IP\n", *dir)
		return nil
	}
	ca, err := pki.LoadCA(caCert, caKey)
	if err != nil {
		return fmt.Errorf("%w (make one with `mqletctl certs ca --dir %s`)", err, *dir)
	}
	switch kind {
	case "broker":
		if len(pos) > 0 {
			return usageError{fmt.Errorf("certs broker: unexpected arguments %q", pos)}
		}
		p, err := ca.IssueServer("mqlet broker", hosts, validity(825), now)
		if err != nil {
			return usageError{err}
		}
		cert, key, err := pki.WritePair(abs, "broker", p)
		if err != nil {
			return err
		}
		fmt.Fprintf(e.stdout, "broker certificate for %s:\n", hosts.String())
		fmt.Fprintf(e.stdout, "  install -m 0644 %s /etc/mosquitto/certs/ca.crt\n", caCert)
		fmt.Fprintf(e.stdout, "  install -m 0644 %s /etc/mosquitto/certs/server.crt\n", cert)
		fmt.Fprintf(e.stdout, "  install -m 0640 -g mosquitto %s /etc/mosquitto/certs/server.key\n", key)
		fmt.Fprintln(e.stdout, "  then /usr/share/doc/mqlet/mosquitto-tls.conf -> /etc/mosquitto/conf.d/mqlet.conf, mosquitto-mqlet.acl -> /etc/mosquitto/mqlet.acl")
		return nil
	case "node":
		name := cfg.Node
		if len(pos) == 1 {
			name = pos[0]
		} else if len(pos) > 1 {
			return usageError{fmt.Errorf("certs node: one node name, got %q", pos)}
		}
		if name == "" {
			return usageError{errors.New("certs node: want `certs node NAME`")}
		}
		p, err := ca.IssueClient(name, false, validity(825), now)
		if err != nil {
			return usageError{err}
		}
		cert, key, err := pki.WritePair(abs, name, p)
		if err != nil {
			return err
		}
		fmt.Fprintf(e.stdout, "gateway %s (certificate CN %q = its node name = its ACL user):\n", name, name)
		fmt.Fprintf(e.stdout, "  on the gateway: install -D -m 0644 %s /etc/mqlet/tls/ca.crt\n", caCert)
		fmt.Fprintf(e.stdout, "                  install -D -m 0644 %s /etc/mqlet/tls/node.crt\n", cert)
		fmt.Fprintf(e.stdout, "                  install -D -m 0600 %s /etc/mqlet/tls/node.key\n", key)
		fmt.Fprintf(e.stdout, "  then: mqlet init --node %s --broker ssl://BROKER:8883 --ca /etc/mqlet/tls/ca.crt --cert /etc/mqlet/tls/node.crt --key /etc/mqlet/tls/node.key\n", name)
		fmt.Fprintf(e.stdout, "  files: %s %s\n", cert, key)
		return nil
	case "operator":
		if len(pos) > 0 {
			return usageError{fmt.Errorf("certs operator: unexpected arguments %q", pos)}
		}
		p, err := ca.IssueClient(pki.OperatorCN, true, validity(825), now)
		if err != nil {
			return err
		}
		cert, key, err := pki.WritePair(abs, pki.OperatorCN, p)
		if err != nil {
			return err
		}
		fmt.Fprintf(e.stdout, "operator certificate (CN %q: commands and watches every gateway):\n", pki.OperatorCN)
		fmt.Fprintf(e.stdout, "  mqletctl --broker ssl://BROKER:8883 --ca-file %s --cert-file %s --key-file %s --node NODE status\n", caCert, cert, key)
		return nil
	}
	return usageError{fmt.Errorf("certs: unknown kind %q (want ca, broker, node, operator)", kind)}
}
