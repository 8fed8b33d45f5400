package rawcri

import (
	"context"
	"slices"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

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
	for _, conf := range []Confinement{Bare, AsMqlet} {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		res, err := RunParallel(ctx, endpoint, 3, conf)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Start) != 3 || res.StartWall <= 0 || res.StopWall <= 0 {
			t.Fatalf("confinement %d: got %+v, want 3 start latencies and positive walls", conf, res)
		}
		for i, l := range res.Start {
			if l <= 0 || l > res.StartWall {
				t.Fatalf("confinement %d: start %d is %v (wall %v)", conf, i, l, res.StartWall)
			}
		}
		t.Logf("confinement %d: start wall %v, stop wall %v", conf, res.StartWall, res.StopWall)
	}
}

// AsMqlet asks for what mqlet's pods get by default: seccomp
// RuntimeDefault on both, and the kubelet's masked and read-only paths.
func TestConfine(t *testing.T) {
	sb := &runtimeapi.PodSandboxConfig{Linux: &runtimeapi.LinuxPodSandboxConfig{}}
	c := &runtimeapi.ContainerConfig{}
	confine(sb, c)
	if sb.GetLinux().GetSecurityContext().GetSeccomp().GetProfileType() != runtimeapi.SecurityProfile_RuntimeDefault {
		t.Errorf("sandbox seccomp %v", sb.GetLinux().GetSecurityContext().GetSeccomp())
	}
	sc := c.GetLinux().GetSecurityContext()
	if sc.GetSeccomp().GetProfileType() != runtimeapi.SecurityProfile_RuntimeDefault {
		t.Errorf("container seccomp %v", sc.GetSeccomp())
	}
	if !slices.Contains(sc.GetMaskedPaths(), "/proc/kcore") || !slices.Contains(sc.GetReadonlyPaths(), "/proc/sysrq-trigger") {
		t.Errorf("masked %v, read-only %v", sc.GetMaskedPaths(), sc.GetReadonlyPaths())
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
