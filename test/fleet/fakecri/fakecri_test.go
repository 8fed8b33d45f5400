package fakecri

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-logr/logr"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	criclient "k8s.io/cri-client/pkg"
	"k8s.io/klog/v2"
)

// TestLifecycle drives the fake through cri-client, as cri.Manager does:
// a sandbox, a container that runs until stopped, one that exits 3 at
// once, listings by label, stats, and removal.
func TestLifecycle(t *testing.T) {
	ctx := klog.NewContext(context.Background(), logr.Discard())
	s := New()
	if err := s.Serve(filepath.Join(t.TempDir(), "cri.sock")); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	rt, err := criclient.NewRemoteRuntimeServiceBuilder().WithEndpoint(s.Endpoint()).WithConnectionTimeout(10 * time.Second).WithTracerProvider(nil).Build(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close(ctx)
	logDir := t.TempDir()
	sbCfg := &runtimeapi.PodSandboxConfig{Metadata: &runtimeapi.PodSandboxMetadata{Name: "web", Uid: "u1", Namespace: "default"},
		Labels: map[string]string{"pod": "u1"}, LogDirectory: logDir}
	sbID, err := rt.RunPodSandbox(ctx, sbCfg, "")
	if err != nil {
		t.Fatal(err)
	}
	st, err := rt.PodSandboxStatus(ctx, sbID, false)
	if err != nil || st.Status.State != runtimeapi.PodSandboxState_SANDBOX_READY || st.Status.Network.Ip == "" {
		t.Fatalf("sandbox status %v, %v", st, err)
	}
	mk := func(name string, args ...string) string {
		id, err := rt.CreateContainer(ctx, sbID, &runtimeapi.ContainerConfig{Metadata: &runtimeapi.ContainerMetadata{Name: name},
			Image: &runtimeapi.ImageSpec{Image: "busybox"}, Args: args, LogPath: name + "/0.log",
			Labels: map[string]string{"pod": "u1", "c": name}}, sbCfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := rt.StartContainer(ctx, id); err != nil {
			t.Fatal(err)
		}
		return id
	}
	web := mk("web", "sleep", "3600")
	job := mk("job", "sh", "-c", "exit 3")
	status := func(id string) *runtimeapi.ContainerStatus {
		r, err := rt.ContainerStatus(ctx, id, false)
		if err != nil {
			t.Fatal(err)
		}
		return r.Status
	}
	if s := status(web); s.State != runtimeapi.ContainerState_CONTAINER_RUNNING || s.StartedAt == 0 {
		t.Fatalf("web: %v", s)
	}
	if s := status(job); s.State != runtimeapi.ContainerState_CONTAINER_EXITED || s.ExitCode != 3 || s.Reason != "Error" {
		t.Fatalf("job: %v", s)
	}
	list, err := rt.ListContainers(ctx, &runtimeapi.ContainerFilter{LabelSelector: map[string]string{"c": "web"}})
	if err != nil || len(list) != 1 || list[0].Id != web {
		t.Fatalf("list by label: %v, %v", list, err)
	}
	stats, err := rt.ListContainerStats(ctx, &runtimeapi.ContainerStatsFilter{LabelSelector: map[string]string{"pod": "u1"}})
	if err != nil || len(stats) != 2 || stats[0].Memory.WorkingSetBytes.Value == 0 {
		t.Fatalf("stats: %v, %v", stats, err)
	}
	if _, running, started := s.Counts(); running != 1 || started != 2 {
		t.Fatalf("counts: running %d started %d", running, started)
	}
	if err := rt.StopPodSandbox(ctx, sbID); err != nil {
		t.Fatal(err)
	}
	if s := status(web); s.State != runtimeapi.ContainerState_CONTAINER_EXITED || s.ExitCode != 137 {
		t.Fatalf("web after the sandbox stopped: %v", s)
	}
	if err := rt.RemovePodSandbox(ctx, sbID); err != nil {
		t.Fatal(err)
	}
	if _, err := rt.ContainerStatus(ctx, web, false); err == nil {
		t.Fatal("a removed sandbox's container still has a status")
	}
	sbs, err := rt.ListPodSandbox(ctx, nil)
	if err != nil || len(sbs) != 0 {
		t.Fatalf("sandboxes after removal: %v, %v", sbs, err)
	}
}
