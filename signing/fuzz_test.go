package signing_test

import (
	"testing"
	"time"

	"github.com/mqlet/mqlet/signing"
)

// FuzzOpen feeds hostile payloads to the verifier: it must never panic, and
// nothing but the one genuine envelope may ever open as signed.
func FuzzOpen(f *testing.F) {
	fx := newFixture(f, signing.Policy{Required: true}, nil)
	good := sign(f, fx.signer, claims("apply", "r1"), manifest)
	f.Add(good)
	f.Add([]byte(manifest))
	f.Add([]byte(`{"protected":"eyJhbGciOiJFZERTQSJ9","payload":"e30","signature":"AA"}`))
	f.Add([]byte("eyJhbGciOiJub25lIn0.e30."))
	f.Fuzz(func(t *testing.T, payload []byte) {
		v, err := signing.NewVerifier(signing.Policy{Required: true, Targets: []string{"gw1"}, MaxLifetime: time.Hour, ClockSkew: time.Minute, MaxEnvelopeBytes: 1 << 16,
			Keys: []signing.Key{{ID: "ops", Public: fx.signer.Public(), Verbs: []string{"*"}}}}, &memNonces{}, func() time.Time { return t0 })
		if err != nil {
			t.Fatal(err)
		}
		opened, err := v.Open("apply", "r1", payload)
		switch {
		case err == nil && !opened.Signed:
			t.Fatalf("an unsigned payload passed where signatures are required: %q", payload)
		case err == nil && string(opened.Body) != manifest:
			t.Fatalf("a forged payload opened: %q -> %q", payload, opened.Body)
		}
	})
}
