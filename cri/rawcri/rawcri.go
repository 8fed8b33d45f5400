// Package rawcri measures the bare CRI cost of starting a pod
// (RunPodSandbox + CreateContainer + StartContainer) without any of mqlet's
// logic, as a baseline for benchmarks.
package rawcri

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/go-logr/logr"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	criclient "k8s.io/cri-client/pkg"
	"k8s.io/klog/v2"
)

// Image is the container image started in every measured pod; it must be
// present in the runtime (test/env/containerd-up.sh imports it).
const Image = "docker.io/mqlet/busybox:test"

// Run starts n pods one after another, each a sandbox with one `sleep`
// container, and returns the latency of each pod's three calls. Everything
// it created is removed before it returns.
func Run(ctx context.Context, endpoint string, n int) (latencies []time.Duration, err error) {
	ctx = klog.NewContext(ctx, logr.Discard())
	rt, err := criclient.NewRemoteRuntimeServiceBuilder().
		WithEndpoint(endpoint).WithConnectionTimeout(time.Minute).WithTracerProvider(nil).Build(ctx)
	if err != nil {
		return nil, fmt.Errorf("connect %s: %w", endpoint, err)
	}
	defer rt.Close(ctx)
	logDir, err := os.MkdirTemp("", "rawcri-logs-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(logDir)

	run := strconv.FormatInt(time.Now().UnixNano(), 36)
	var sandboxes []string
	defer func() {
		cleanup := context.WithoutCancel(ctx)
		for _, id := range sandboxes {
			err = errors.Join(err, rt.StopPodSandbox(cleanup, id), rt.RemovePodSandbox(cleanup, id))
		}
	}()
	for i := range n {
		name := fmt.Sprintf("rawcri-%s-%d", run, i)
		sandbox := &runtimeapi.PodSandboxConfig{
			Metadata:     &runtimeapi.PodSandboxMetadata{Name: name, Uid: name, Namespace: "rawcri"},
			Hostname:     name,
			LogDirectory: filepath.Join(logDir, name),
			Labels:       map[string]string{"io.mqlet.rawcri": run},
			Linux:        &runtimeapi.LinuxPodSandboxConfig{CgroupParent: "/mqlet-rawcri/pod" + name},
		}
		container := &runtimeapi.ContainerConfig{
			Metadata: &runtimeapi.ContainerMetadata{Name: "sleep"},
			Image:    &runtimeapi.ImageSpec{Image: Image},
			Command:  []string{"sleep", "3600"},
			LogPath:  "sleep/0.log",
		}
		start := time.Now()
		id, err := rt.RunPodSandbox(ctx, sandbox, "")
		if err != nil {
			return latencies, fmt.Errorf("run sandbox %s: %w", name, err)
		}
		sandboxes = append(sandboxes, id)
		cid, err := rt.CreateContainer(ctx, id, container, sandbox)
		if err != nil {
			return latencies, fmt.Errorf("create container in %s: %w", name, err)
		}
		if err := rt.StartContainer(ctx, cid); err != nil {
			return latencies, fmt.Errorf("start container in %s: %w", name, err)
		}
		latencies = append(latencies, time.Since(start))
	}
	return latencies, nil
}
