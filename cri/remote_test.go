package cri

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	utilexec "k8s.io/utils/exec"
)

// fakeCRI answers the calls the client tests make, as a runtime that
// misbehaves in the ways the client must catch.
type fakeCRI struct {
	runtimeapi.UnimplementedRuntimeServiceServer
	runtimeapi.UnimplementedImageServiceServer
	version *runtimeapi.VersionResponse
	noImage bool // ImageFsInfo fails
}

func (f *fakeCRI) Version(context.Context, *runtimeapi.VersionRequest) (*runtimeapi.VersionResponse, error) {
	return f.version, nil
}

func (f *fakeCRI) ImageFsInfo(context.Context, *runtimeapi.ImageFsInfoRequest) (*runtimeapi.ImageFsInfoResponse, error) {
	if f.noImage {
		return nil, status.Error(codes.Unimplemented, "no image service")
	}
	return &runtimeapi.ImageFsInfoResponse{}, nil
}

func (f *fakeCRI) RunPodSandbox(context.Context, *runtimeapi.RunPodSandboxRequest) (*runtimeapi.RunPodSandboxResponse, error) {
	return &runtimeapi.RunPodSandboxResponse{}, nil // no id
}

func (f *fakeCRI) ContainerStatus(_ context.Context, r *runtimeapi.ContainerStatusRequest) (*runtimeapi.ContainerStatusResponse, error) {
	s := &runtimeapi.ContainerStatus{Id: r.ContainerId, Metadata: &runtimeapi.ContainerMetadata{Name: "c"}, CreatedAt: 1,
		Image: &runtimeapi.ImageSpec{Image: "busybox"}, ImageRef: "sha256:1"}
	if r.ContainerId == "noref" {
		s.ImageRef = ""
	}
	return &runtimeapi.ContainerStatusResponse{Status: s}, nil
}

func (f *fakeCRI) ExecSync(_ context.Context, r *runtimeapi.ExecSyncRequest) (*runtimeapi.ExecSyncResponse, error) {
	switch r.Cmd[0] {
	case "fail":
		return &runtimeapi.ExecSyncResponse{Stdout: []byte("o"), Stderr: []byte("e"), ExitCode: 3}, nil
	case "slow":
		return nil, status.Error(codes.DeadlineExceeded, "timeout")
	}
	return &runtimeapi.ExecSyncResponse{Stdout: []byte("ok")}, nil
}

func (f *fakeCRI) Status(context.Context, *runtimeapi.StatusRequest) (*runtimeapi.StatusResponse, error) {
	return &runtimeapi.StatusResponse{Status: &runtimeapi.RuntimeStatus{}}, nil // no conditions
}

func (f *fakeCRI) PullImage(_ context.Context, r *runtimeapi.PullImageRequest) (*runtimeapi.PullImageResponse, error) {
	if r.Image.Image == "unknown" {
		return nil, status.Error(codes.Unknown, "failed to pull: not found")
	}
	return &runtimeapi.PullImageResponse{}, nil // no ref
}

func serveFake(t *testing.T, f *fakeCRI) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "cri.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	runtimeapi.RegisterRuntimeServiceServer(s, f)
	runtimeapi.RegisterImageServiceServer(s, f)
	go func() { _ = s.Serve(l) }()
	t.Cleanup(s.Stop)
	return "unix://" + sock
}

// noLeaks checks, after every cleanup of the test (the fake servers stop
// first), that no goroutine the test started is left.
func noLeaks(t *testing.T) {
	now := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, now) })
}

var goodVersion = &runtimeapi.VersionResponse{Version: "0.1.0", RuntimeName: "fake", RuntimeVersion: "1", RuntimeApiVersion: "v1"}

func TestRemoteChecksAnswers(t *testing.T) {
	noLeaks(t)
	ep := serveFake(t, &fakeCRI{version: goodVersion})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rt, img, err := dialRemote(ctx, ep, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close(ctx)
	defer img.Close(ctx) // the shared connection closes once

	if v, err := rt.Version(ctx, "v1"); err != nil || v.RuntimeName != "fake" {
		t.Fatalf("Version = %v, %v", v, err)
	}
	if _, err := rt.RunPodSandbox(ctx, &runtimeapi.PodSandboxConfig{}, ""); err == nil || !strings.Contains(err.Error(), "PodSandboxId is not set") {
		t.Errorf("RunPodSandbox without an id: err = %v", err)
	}
	if _, err := rt.ContainerStatus(ctx, "ok", false); err != nil {
		t.Errorf("ContainerStatus: %v", err)
	}
	if _, err := rt.ContainerStatus(ctx, "noref", false); err == nil || !strings.Contains(err.Error(), "ImageRef") {
		t.Errorf("ContainerStatus without an image ref: err = %v", err)
	}
	if _, err := rt.Status(ctx, false); err == nil {
		t.Error("Status without conditions: no error")
	}
	out, _, err := rt.ExecSync(ctx, "c", []string{"true"}, time.Second)
	if err != nil || string(out) != "ok" {
		t.Errorf("ExecSync = %q, %v", out, err)
	}
	out, errOut, err := rt.ExecSync(ctx, "c", []string{"fail"}, time.Second)
	var exit utilexec.CodeExitError
	if !errors.As(err, &exit) || exit.Code != 3 || string(out) != "o" || string(errOut) != "e" {
		t.Errorf("ExecSync exiting 3 = %q %q %v", out, errOut, err)
	}
	if _, _, err := rt.ExecSync(ctx, "c", []string{"slow"}, time.Second); !errors.Is(err, errCommandTimedOut) {
		t.Errorf("ExecSync timed out by the runtime: err = %v", err)
	}
	if _, err := img.PullImage(ctx, &runtimeapi.ImageSpec{Image: "busybox"}, nil, nil); err == nil || !strings.Contains(err.Error(), "imageRef") {
		t.Errorf("PullImage without a ref: err = %v", err)
	}
	if _, err := img.PullImage(ctx, &runtimeapi.ImageSpec{Image: "unknown"}, nil, nil); err == nil || err.Error() != "failed to pull: not found" {
		t.Errorf("PullImage failing Unknown: err = %v, want the runtime's message alone", err)
	}
}

// A handshake that fails closes the connection: nothing keeps redialling.
func TestRemoteDialFailureLeavesNothing(t *testing.T) {
	noLeaks(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for name, f := range map[string]*fakeCRI{
		"version without fields": {version: &runtimeapi.VersionResponse{}},
		"no image service":       {version: goodVersion, noImage: true},
	} {
		ep := serveFake(t, f)
		rt, img, err := dialRemote(ctx, ep, time.Second)
		if name == "version without fields" {
			// The dial's own check is the CRI v1 answer; the fields are
			// checked by Version, which the connection's handshake calls.
			if err != nil {
				t.Fatalf("%s: dial: %v", name, err)
			}
			if _, err := rt.Version(ctx, "v1"); err == nil || !strings.Contains(err.Error(), "missing Version, RuntimeName") {
				t.Errorf("%s: Version err = %v", name, err)
			}
			_ = rt.Close(ctx)
			_ = img.Close(ctx)
			continue
		}
		if err == nil {
			t.Fatalf("%s: dial succeeded", name)
		}
	}
	if _, _, err := dialRemote(ctx, "tcp://127.0.0.1:1", time.Second); err == nil {
		t.Error("a tcp endpoint was accepted")
	}
	if p, err := criSocket("/run/x.sock"); err != nil || p != "/run/x.sock" {
		t.Errorf("bare path: %q, %v", p, err)
	}
}
