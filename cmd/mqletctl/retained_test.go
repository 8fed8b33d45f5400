package main

import (
	"context"
	"fmt"
	"testing"
	"time"

	apiv1 "github.com/mqlet/mqlet/api/v1"
	"github.com/mqlet/mqlet/internal/testutil/mosquitto"
	"github.com/mqlet/mqlet/mqtt/broker"
)

// The retained messages of a whole fleet are read up to the barrier, not
// until a quiet time or the whole --retained-wait: every one of 300 nodes
// is seen, and the read ends long before the (deliberately huge) wait.
func TestCollectRetainedEndsAtItsBarrierWithEverything(t *testing.T) {
	for _, b := range []struct {
		name string
		url  func(t *testing.T) string
	}{
		{"mosquitto", func(t *testing.T) string { return mosquitto.Start(t).URL() }},
		{"embedded", func(t *testing.T) string { return startBroker(t, broker.Options{}) }},
	} {
		t.Run(b.name, func(t *testing.T) {
			url := b.url(t)
			pub := testClient(t, url, "publisher")
			const nodes = 300
			for i := 0; i < nodes; i++ {
				s := apiv1.Scheme{Prefix: "mqlet/v1", Node: fmt.Sprintf("gw-%03d", i)}
				mustPublish(t, pub, s.State(), true, []byte(`{"state":"online"}`))
			}
			cfg := newGlobalConfig(func(string) string { return "" })
			cfg.Broker = url
			const wait = 2 * time.Minute
			ctx, cancel := context.WithTimeout(context.Background(), wait+time.Minute)
			defer cancel()
			c, err := dial(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer c.close()
			seen := map[string]bool{}
			start := time.Now()
			all := apiv1.Scheme{Prefix: "mqlet/v1", Node: "+"}
			if err := c.collectRetained(ctx, "mqlet/v1", wait, []string{all.State()}, func(m message) { seen[m.Topic] = true }); err != nil {
				t.Fatal(err)
			}
			took := time.Since(start)
			if len(seen) != nodes {
				t.Errorf("read %d retained states, want %d", len(seen), nodes)
			}
			if took >= wait {
				t.Errorf("the read took %v: it waited the whole wait, not for its barrier", took)
			}
			t.Logf("%d retained states in %v", len(seen), took)
		})
	}
}
