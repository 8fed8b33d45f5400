package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/mqlet/mqlet/signing"
)

const defaultKeyFile = "mqlet-signing.key"

// runKeys manages signing keys; only generate for now.
func runKeys(_ context.Context, cfg *globalConfig, args []string, e env) error {
	if len(args) == 0 || args[0] != "generate" {
		return usageError{errors.New("keys: want `keys generate [--out FILE]`")}
	}
	fs := newFlagSet("keys generate", cfg, e.stderr)
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
	pub := signing.EncodePublicKey(s.Public())
	fmt.Fprintf(e.stderr, "wrote private key %s (keep it secret; sign with --sign-key %s)\n", *out, *out)
	fmt.Fprintf(e.stdout, "keyId: %s publicKey: %s\n", s.KeyID(), pub)
	fmt.Fprintf(e.stdout, "# node config, under security.trustedKeys:\n")
	fmt.Fprintf(e.stdout, "  - keyId: %s\n    publicKey: %s\n    verbs: [apply, delete, sync, get]\n", s.KeyID(), pub)
	return nil
}
