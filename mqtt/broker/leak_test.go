package broker

import (
	"context"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"go.uber.org/goleak"
)

// No goroutine of the broker (its own or mochi's) is left once it has
// stopped, whether by Close or by the end of its context, with a client
// having come and gone.
func TestNoGoroutineLeftAfterStop(t *testing.T) {
	for _, how := range []string{"Close", "context"} {
		t.Run(how, func(t *testing.T) {
			before := goleak.IgnoreCurrent()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			b, err := Start(ctx, Options{Listen: "127.0.0.1:0"}, zerolog.Nop())
			if err != nil {
				t.Fatal(err)
			}
			roundTrip(t, "tcp://"+b.Addr(), nil)
			if how == "Close" {
				if err := b.Close(); err != nil {
					t.Fatal(err)
				}
			} else {
				cancel()
			}
			select {
			case <-b.Done():
			case <-time.After(10 * time.Second):
				t.Fatal("broker did not stop")
			}
			goleak.VerifyNone(t, before)
		})
	}
}
