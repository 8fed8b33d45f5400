package rawcri

import (
	"context"
	"testing"
	"time"

	"github.com/mqlet/mqlet/internal/testutil/containerd"
)

func TestRun(t *testing.T) {
	endpoint := containerd.Endpoint(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	latencies, err := Run(ctx, endpoint, 3)
	if err != nil {
		t.Fatal(err)
	}
	if len(latencies) != 3 {
		t.Fatalf("%d latencies, want 3", len(latencies))
	}
	for i, l := range latencies {
		if l <= 0 {
			t.Fatalf("latency %d is %v", i, l)
		}
		t.Logf("pod %d: %v", i, l)
	}
}

func BenchmarkRawPodStart(b *testing.B) {
	endpoint := containerd.Endpoint(b)
	latencies, err := Run(context.Background(), endpoint, b.N)
	if err != nil {
		b.Fatal(err)
	}
	var total time.Duration
	for _, l := range latencies {
		total += l
	}
	b.ReportMetric(float64(total.Milliseconds())/float64(len(latencies)), "ms/pod")
}
