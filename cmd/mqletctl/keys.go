package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	apiv1 "github.com/mqlet/mqlet/api/v1"
	"github.com/mqlet/mqlet/signing"
)

const defaultKeyFile = "mqlet-signing.key"

// runKeys manages signing keys: generate a new one, or show the node's
// config entry of an existing one.
func runKeys(_ context.Context, cfg *globalConfig, args []string, e env) error {
	if len(args) > 0 && args[0] == "show" {
		return showKey(cfg, args[1:], e)
	}
	if len(args) > 0 && isHelpFlag(args[0]) {
		args = append([]string{"generate"}, args...)
	}
	if len(args) > 0 && args[0] != "generate" {
		return usageError{fmt.Errorf("keys: want `keys generate [--out FILE]` or `keys show --sign-key FILE`, got %s", args[0])}
	}
	if len(args) == 0 {
		return usageError{errors.New("keys: want `keys generate [--out FILE]` or `keys show --sign-key FILE`")}
	}
	fs := newFlagSet("keys generate", cfg)
	out := fs.String("out", defaultKeyFile, "file for the new private key (created 0600; never overwritten)")
	pos, err := parseInterleaved(fs, args[1:])
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usageError{fmt.Errorf("keys generate: unexpected arguments %q", pos)}
	}
	key, err := signing.GenerateKey()
	if err != nil {
		return err
	}
	if err := signing.WritePrivateKeyFile(*out, key); err != nil {
		return err
	}
	s, err := signing.NewSigner(cfg.KeyID, key)
	if err != nil {
		return usageError{fmt.Errorf("--key-id: %w", err)}
	}
	fmt.Fprintf(e.stderr, "wrote private key %s (keep it secret; sign with --sign-key %s)\n", *out, *out)
	printTrustedKey(e, s)
	return nil
}

func showKey(cfg *globalConfig, args []string, e env) error {
	fs := newFlagSet("keys show", cfg)
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 || cfg.SignKey == "" {
		return usageError{errors.New("keys show: want `keys show --sign-key FILE`")}
	}
	if err := cfg.loadSigner(); err != nil {
		return err
	}
	printTrustedKey(e, cfg.signer)
	return nil
}

// printTrustedKey prints the key id and public key, and the entry to paste
// into the node's configuration.
func printTrustedKey(e env, s *signing.Signer) {
	pub := signing.EncodePublicKey(s.Public())
	fmt.Fprintf(e.stdout, "keyId: %s publicKey: %s\n", s.KeyID(), pub)
	fmt.Fprintf(e.stdout, "# node config, under security.trustedKeys:\n")
	// Every verb of the contract: the operator's key signs all it sends.
	fmt.Fprintf(e.stdout, "  - keyId: %s\n    publicKey: %s\n    verbs: [%s]\n", s.KeyID(), pub, strings.Join(apiv1.Verbs(), ", "))
}

// runSign prints a signed envelope instead of sending it, for a dashboard
// or mosquitto_pub on a node that wants signed commands.
func runSign(ctx context.Context, cfg *globalConfig, args []string, e env) error {
	fs := newFlagSet("sign", cfg)
	file := fs.String("f", "", "the command body: manifest or JSON args (- for stdin)")
	id := fs.String("request-id", "", "request id of the topic it will be sent on (default: a new one)")
	sealTo := fs.String("seal-to", "", "seal the Secrets of an apply or sync body to these sealing keys (age1..., comma-separated) first")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usageError{errors.New("sign: want VERB (apply, delete, sync, get, ...) and -f FILE")}
	}
	verb := pos[0]
	if *file == "" {
		return usageError{errors.New("sign: -f FILE (or -f - for stdin) is required")}
	}
	if cfg.SignKey == "" {
		return usageError{errors.New("sign: --sign-key FILE is required")}
	}
	if err := cfg.resolve(); err != nil {
		return err
	}
	if *id == "" {
		*id = newRequestID()
	}
	scheme := cfg.scheme()
	if err := apiv1.ValidateRequestID(*id); err != nil {
		return usageError{fmt.Errorf("sign: --request-id: %w", err)}
	}
	body, err := readManifest(*file, e.stdin)
	if err != nil {
		return err
	}
	if *sealTo != "" && (verb == "apply" || verb == "sync") {
		if body, err = sealSecrets(ctx, cfg, body, *sealTo); err != nil {
			return err
		}
	}
	env, err := cfg.seal(verb, *id, body)
	if err != nil {
		return err
	}
	fmt.Fprintf(e.stderr, "publish to %s (valid for %s)\n", scheme.Command(verb, *id), cfg.SignTTL)
	fmt.Fprintf(e.stdout, "%s\n", env)
	return nil
}
