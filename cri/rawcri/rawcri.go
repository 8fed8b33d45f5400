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
	"sync"
	"time"

	"github.com/go-logr/logr"
	v1 "k8s.io/api/core/v1"
	internalapi "k8s.io/cri-api/pkg/apis"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	criclient "k8s.io/cri-client/pkg"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/securitycontext"
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
		start := time.Now()
		id, err := startPod(ctx, rt, logDir, fmt.Sprintf("rawcri-%s-%d", run, i), run, Bare)
		if id != "" {
			sandboxes = append(sandboxes, id)
		}
		if err != nil {
			return latencies, err
		}
		latencies = append(latencies, time.Since(start))
	}
	return latencies, nil
}

// Parallel is what RunParallel measured.
type Parallel struct {
	Start []time.Duration // per pod: its three calls, all pods started at once
	// StartWall is from the first call until the last pod's container started.
	StartWall time.Duration
	// StopWall is from the first StopPodSandbox until the last returned,
	// all made at once.
	StopWall time.Duration
}

// RunParallel starts n pods at once (each pod's three calls in order, the
// pods side by side), then stops their sandboxes at once, and returns the
// timings. Everything it created is removed before it returns.
func RunParallel(ctx context.Context, endpoint string, n int, conf Confinement) (res Parallel, err error) {
	ctx = klog.NewContext(ctx, logr.Discard())
	rt, err := criclient.NewRemoteRuntimeServiceBuilder().
		WithEndpoint(endpoint).WithConnectionTimeout(time.Minute).WithTracerProvider(nil).Build(ctx)
	if err != nil {
		return res, fmt.Errorf("connect %s: %w", endpoint, err)
	}
	defer rt.Close(ctx)
	logDir, err := os.MkdirTemp("", "rawcri-logs-")
	if err != nil {
		return res, err
	}
	defer os.RemoveAll(logDir)

	run := strconv.FormatInt(time.Now().UnixNano(), 36)
	sandboxes := make([]string, n)
	defer func() {
		cleanup := context.WithoutCancel(ctx)
		for _, id := range sandboxes {
			if id != "" {
				err = errors.Join(err, rt.StopPodSandbox(cleanup, id), rt.RemovePodSandbox(cleanup, id))
			}
		}
	}()
	res.Start = make([]time.Duration, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	begin := time.Now()
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			sandboxes[i], errs[i] = startPod(ctx, rt, logDir, fmt.Sprintf("rawcri-%s-%d", run, i), run, conf)
			res.Start[i] = time.Since(start)
		}()
	}
	wg.Wait()
	res.StartWall = time.Since(begin)
	if err := errors.Join(errs...); err != nil {
		return res, err
	}
	begin = time.Now()
	for i, id := range sandboxes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := rt.StopPodSandbox(ctx, id); err != nil {
				errs[i] = fmt.Errorf("stop sandbox %s: %w", id, err)
			}
		}()
	}
	wg.Wait()
	res.StopWall = time.Since(begin)
	return res, errors.Join(errs...)
}

// startPod makes one sandbox named name with a `sleep` container and starts
// it; it returns the sandbox id as soon as there is one, also with an error.
func startPod(ctx context.Context, rt internalapi.RuntimeService, logDir, name, run string, conf Confinement) (string, error) {
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
	if conf == AsMqlet {
		confine(sandbox, container)
	}
	id, err := rt.RunPodSandbox(ctx, sandbox, "")
	if err != nil {
		return "", fmt.Errorf("run sandbox %s: %w", name, err)
	}
	cid, err := rt.CreateContainer(ctx, id, container, sandbox)
	if err != nil {
		return id, fmt.Errorf("create container in %s: %w", name, err)
	}
	if err := rt.StartContainer(ctx, cid); err != nil {
		return id, fmt.Errorf("start container in %s: %w", name, err)
	}
	return id, nil
}

// Confinement is what the measured pods are confined with.
type Confinement int

const (
	// Bare pods carry no security context: the three calls' own cost.
	Bare Confinement = iota
	// AsMqlet pods are confined as mqlet confines a pod by default (issue
	// 5): seccomp RuntimeDefault for the sandbox and the container, and the
	// kubelet's masked and read-only /proc paths; runc applying them is
	// part of every start mqlet makes, so this is mqlet's own floor.
	AsMqlet
)

func confine(sandbox *runtimeapi.PodSandboxConfig, container *runtimeapi.ContainerConfig) {
	runtimeDefault := func() *runtimeapi.SecurityProfile {
		return &runtimeapi.SecurityProfile{ProfileType: runtimeapi.SecurityProfile_RuntimeDefault}
	}
	sandbox.Linux.SecurityContext = &runtimeapi.LinuxSandboxSecurityContext{Seccomp: runtimeDefault()}
	procMount := v1.DefaultProcMount
	container.Linux = &runtimeapi.LinuxContainerConfig{SecurityContext: &runtimeapi.LinuxContainerSecurityContext{
		Seccomp:       runtimeDefault(),
		MaskedPaths:   securitycontext.ConvertToRuntimeMaskedPaths(&procMount),
		ReadonlyPaths: securitycontext.ConvertToRuntimeReadonlyPaths(&procMount),
	}}
}
