package config

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"time"

	apiv1 "github.com/mqlet/mqlet/api/v1"
)

// Security is how commands are authenticated beyond the broker login:
// signed commands (docs/signed-commands.md).
type Security struct {
	// Commands is CommandsOff or CommandsSignedOnly.
	Commands CommandsMode `json:"commands"`
	// SignedVerbs need a signature even when Commands is off.
	SignedVerbs []string `json:"signedVerbs"`
	// Groups are further names a command may be signed for (besides the node's).
	Groups []string `json:"groups"`
	// ClockSkew tolerated between the signer's clock and the node's.
	ClockSkew Duration `json:"clockSkew"`
	// MaxLifetime bounds exp - iat of a signed command.
	MaxLifetime Duration `json:"maxLifetime"`
	// MaxNonces bounds the record of used nonces (<stateDir>/nonces.db).
	MaxNonces   int          `json:"maxNonces"`
	TrustedKeys []TrustedKey `json:"trustedKeys"`
	// RequireSealedSecrets refuses Secrets that do not come sealed to the
	// node's sealing key (docs/secrets.md).
	RequireSealedSecrets bool `json:"requireSealedSecrets"`
}

// TrustedKey is a public key whose signatures the node accepts.
type TrustedKey struct {
	// KeyID is the "kid" the signer uses; empty: derived from the key
	// (first 16 hex digits of its SHA-256, as mqletctl does).
	KeyID string `json:"keyId"`
	// PublicKey is the raw Ed25519 key, standard base64 (as `mqletctl keys generate` prints it).
	PublicKey string `json:"publicKey"`
	// PublicKeyFile is a PEM "PUBLIC KEY" file instead of PublicKey.
	PublicKeyFile string `json:"publicKeyFile"`
	// Verbs the key may sign; "*" for all.
	Verbs []string `json:"verbs"`
	// MaxProfile is the most permissive pod security profile the key may
	// lift a command's pods to: privileged, baseline or restricted; empty:
	// the node's own.
	MaxProfile string `json:"maxProfile"`
	// Namespaces limit the key's commands to objects of these namespaces;
	// empty: any.
	Namespaces []string `json:"namespaces"`
}

// CommandsMode says whether unsigned commands are accepted.
type CommandsMode string

// The values of security.commands.
const (
	CommandsOff        CommandsMode = "off"
	CommandsSignedOnly CommandsMode = "signed-only"
)

// UnmarshalJSON also takes YAML's unquoted off, which YAML 1.1 reads as false.
func (m *CommandsMode) UnmarshalJSON(b []byte) error {
	var off bool
	if json.Unmarshal(b, &off) == nil {
		if off {
			return fmt.Errorf("security.commands: want off or signed-only, got true")
		}
		*m = CommandsOff
		return nil
	}
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("security.commands: want off or signed-only, got %s", string(b))
	}
	*m = CommandsMode(s)
	return nil
}

// signableVerbs are the verbs of the command topics: every verb of the
// contract, cancel too.
var signableVerbs = apiv1.Verbs()

func defaultSecurity() Security {
	return Security{
		Commands:    CommandsOff,
		SignedVerbs: []string{},
		Groups:      []string{},
		ClockSkew:   Duration{30 * time.Second},
		MaxLifetime: Duration{time.Hour},
		MaxNonces:   100000,
		TrustedKeys: []TrustedKey{},
	}
}

func (s *Security) validate(bad func(field, format string, args ...any)) {
	switch s.Commands {
	case CommandsOff, CommandsSignedOnly:
	default:
		bad("security.commands", "%q is not one of off, signed-only", s.Commands)
	}
	for i, v := range s.SignedVerbs {
		if !slices.Contains(signableVerbs, v) {
			bad(fmt.Sprintf("security.signedVerbs[%d]", i), "%q is not a verb (%s)", v, strings.Join(signableVerbs, ", "))
		}
	}
	for i, g := range s.Groups {
		if g == "" || strings.ContainsAny(g, "/+#$ ") {
			bad(fmt.Sprintf("security.groups[%d]", i), "%q must be non-empty, without '/', '+', '#', '$' or spaces", g)
		}
	}
	if s.ClockSkew.Duration < 0 || s.ClockSkew.Duration > 10*time.Minute {
		bad("security.clockSkew", "must be between 0 and 10m, got %s", s.ClockSkew.Duration)
	}
	if s.MaxLifetime.Duration <= 0 || s.MaxLifetime.Duration > 24*time.Hour {
		bad("security.maxLifetime", "must be positive and at most 24h, got %s", s.MaxLifetime.Duration)
	}
	if s.MaxNonces < 100 || s.MaxNonces > 10000000 {
		bad("security.maxNonces", "must be between 100 and 10000000, got %d", s.MaxNonces)
	}
	if (s.Commands == CommandsSignedOnly || len(s.SignedVerbs) > 0) && len(s.TrustedKeys) == 0 {
		bad("security.trustedKeys", "signed commands are required (commands: %s, signedVerbs: %v) but no key is trusted", s.Commands, s.SignedVerbs)
	}
	ids := map[string]bool{}
	for i, k := range s.TrustedKeys {
		field := fmt.Sprintf("security.trustedKeys[%d]", i)
		if k.KeyID != "" {
			if len(k.KeyID) > 64 || strings.Trim(k.KeyID, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") != "" {
				bad(field+".keyId", "%q must be 1 to 64 letters, digits, '.', '-' or '_'", k.KeyID)
			}
			if ids[k.KeyID] {
				bad(field+".keyId", "%q is given twice", k.KeyID)
			}
			ids[k.KeyID] = true
		}
		switch {
		case (k.PublicKey == "") == (k.PublicKeyFile == ""):
			bad(field, "exactly one of publicKey and publicKeyFile must be given")
		case k.PublicKey != "":
			if b, err := base64.StdEncoding.DecodeString(k.PublicKey); err != nil || len(b) != 32 {
				bad(field+".publicKey", "must be the 32-byte Ed25519 key in standard base64")
			}
		case !filepath.IsAbs(k.PublicKeyFile):
			bad(field+".publicKeyFile", "%q must be an absolute path", k.PublicKeyFile)
		}
		if len(k.Verbs) == 0 {
			bad(field+".verbs", "must name the verbs the key may sign (or \"*\")")
		}
		for j, v := range k.Verbs {
			if v != "*" && !slices.Contains(signableVerbs, v) {
				bad(fmt.Sprintf("%s.verbs[%d]", field, j), "%q is not a verb (%s, or *)", v, strings.Join(signableVerbs, ", "))
			}
		}
		switch k.MaxProfile {
		case "", "privileged", "baseline", "restricted":
		default:
			bad(field+".maxProfile", "%q is not one of privileged, baseline, restricted", k.MaxProfile)
		}
		for j, ns := range k.Namespaces {
			if err := apiv1.ValidateNamespace(ns); err != nil {
				bad(fmt.Sprintf("%s.namespaces[%d]", field, j), "%v", err)
			}
		}
	}
}
