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

func TestRunParallel(t *testing.T) {
	endpoint := containerd.Endpoint(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := RunParallel(ctx, endpoint, 3)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Start) != 3 || res.StartWall <= 0 || res.StopWall <= 0 {
		t.Fatalf("got %+v, want 3 start latencies and positive walls", res)
	}
	for i, l := range res.Start {
		if l <= 0 || l > res.StartWall {
			t.Fatalf("start %d is %v (wall %v)", i, l, res.StartWall)
		}
	}
	t.Logf("start wall %v, stop wall %v", res.StartWall, res.StopWall)
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
