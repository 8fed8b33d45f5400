package main

import (
	"fmt"
	"io"
	"path/filepath"
	"time"

	"github.com/mqlet/mqlet/config"
	"github.com/mqlet/mqlet/signing"
	"github.com/mqlet/mqlet/signing/noncestore"
)

// nopCloser closes nothing: no nonce store is opened when no key is trusted.
type nopCloser struct{}

func (nopCloser) Close() error { return nil }

// verifierFrom builds the signed-command verifier from the security section;
// the returned Closer closes its nonce store (<stateDir>/nonces.db).
func verifierFrom(cfg *config.Config, groups func() []string) (*signing.Verifier, io.Closer, error) {
	sec := cfg.Security
	keys := make([]signing.Key, 0, len(sec.TrustedKeys))
	for i, k := range sec.TrustedKeys {
		var pub []byte
		var err error
		if k.PublicKeyFile != "" {
			pub, err = signing.ReadPublicKeyFile(k.PublicKeyFile)
		} else {
			pub, err = signing.ParsePublicKey(k.PublicKey)
		}
		if err != nil {
			return nil, nil, fmt.Errorf("security.trustedKeys[%d]: %w", i, err)
		}
		id := k.KeyID
		if id == "" {
			id = signing.KeyID(pub)
		}
		keys = append(keys, signing.Key{ID: id, Public: pub, Verbs: k.Verbs, MaxProfile: k.MaxProfile, Namespaces: k.Namespaces})
	}
	policy := signing.Policy{
		Required:    sec.Commands == config.CommandsSignedOnly,
		SignedVerbs: sec.SignedVerbs,
		Targets:     append([]string{cfg.Node}, sec.Groups...),
		Groups:      groups,
		Keys:        keys,
		ClockSkew:   sec.ClockSkew.Duration,
		MaxLifetime: sec.MaxLifetime.Duration,
		// A body of maxPayloadBytes grows by base64 twice (body in the
		// claims, claims in the JWS): 16/9, plus room for the claims.
		MaxEnvelopeBytes: cfg.MQTT.MaxPayloadBytes*16/9 + 4096,
	}
	var closer io.Closer = nopCloser{}
	var nonces signing.NonceStore
	if len(keys) > 0 {
		st, err := noncestore.Open(filepath.Join(cfg.StateDir, "nonces.db"), sec.MaxNonces)
		if err != nil {
			return nil, nil, err
		}
		if _, err := st.Prune(time.Now()); err != nil {
			st.Close()
			return nil, nil, err
		}
		nonces, closer = st, st
	}
	v, err := signing.NewVerifier(policy, nonces, nil)
	if err != nil {
		closer.Close()
		return nil, nil, err
	}
	return v, closer, nil
}
