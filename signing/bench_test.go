package signing_test

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/mqlet/mqlet/signing"
	"github.com/mqlet/mqlet/signing/noncestore"
)

// BenchmarkOpenSigned measures what verifying one signed command costs the
// agent (parse, Ed25519 verify, claims, in-memory nonce record).
func BenchmarkOpenSigned(b *testing.B) {
	for _, size := range []int{512, 64 << 10} {
		b.Run(fmt.Sprintf("body=%dB", size), func(b *testing.B) {
			f := newFixture(b, signing.Policy{Required: true}, &memNonces{})
			body := make([]byte, size)
			for i := range body {
				body[i] = 'a' + byte(i%26)
			}
			envs := make([][]byte, b.N)
			for i := range envs {
				c := claims("apply", fmt.Sprintf("r%d", i))
				envs[i] = sign(b, f.signer, c, string(body))
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if _, err := f.verifier.Open("apply", fmt.Sprintf("r%d", i), envs[i]); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkSign is the CLI's side.
func BenchmarkSign(b *testing.B) {
	s := newKey(b, "ops")
	c := signing.Claims{Node: "gw1", Verb: "apply", RequestID: "r1", IssuedAt: time.Now(), Expires: time.Now().Add(time.Minute)}
	body := make([]byte, 512)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if _, err := s.Sign(c, body); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkOpenSignedPersisted is the same with the agent's bbolt nonce
// store, whose durable write per command dominates.
func BenchmarkOpenSignedPersisted(b *testing.B) {
	st, err := noncestore.Open(filepath.Join(b.TempDir(), "nonces.db"), 1<<20)
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	f := newFixture(b, signing.Policy{Required: true}, st)
	envs := make([][]byte, b.N)
	for i := range envs {
		envs[i] = sign(b, f.signer, claims("apply", fmt.Sprintf("r%d", i)), manifest)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := f.verifier.Open("apply", fmt.Sprintf("r%d", i), envs[i]); err != nil {
			b.Fatal(err)
		}
	}
}
