// Package containerd gives tests the CRI endpoint of the test containerd
// started by test/env/containerd-up.sh.
package containerd

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/go-logr/logr"
	criclient "k8s.io/cri-client/pkg"
	"k8s.io/klog/v2"
)

// EnvEndpoint names the environment variable holding the CRI endpoint.
const EnvEndpoint = "MQLET_TEST_CRI_ENDPOINT"

// Images imported by test/env/containerd-up.sh.
const (
	BusyboxImage = "docker.io/mqlet/busybox:test"
	PauseImage   = "docker.io/mqlet/pause:test"
)

// Endpoint returns the CRI endpoint from MQLET_TEST_CRI_ENDPOINT and fails the
// test when it is unset or the runtime does not answer.
func Endpoint(t testing.TB) string {
	t.Helper()
	endpoint := os.Getenv(EnvEndpoint)
	if endpoint == "" {
		t.Fatalf("%s is not set: run test/env/containerd-up.sh and export %s=<the endpoint it prints>", EnvEndpoint, EnvEndpoint)
	}
	ctx, cancel := context.WithTimeout(klog.NewContext(context.Background(), logr.Discard()), 5*time.Second)
	defer cancel()
	rt, err := criclient.NewRemoteRuntimeServiceBuilder().
		WithEndpoint(endpoint).WithConnectionTimeout(5 * time.Second).WithTracerProvider(nil).Build(ctx)
	if err != nil {
		t.Fatalf("CRI endpoint %s (from %s) does not answer: %v; run test/env/containerd-up.sh", endpoint, EnvEndpoint, err)
	}
	_ = rt.Close(ctx)
	return endpoint
}
