package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"time"

	"github.com/go-logr/logr"
	internalapi "k8s.io/cri-api/pkg/apis"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	criclient "k8s.io/cri-client/pkg"
	"k8s.io/klog/v2"
)

const (
	labelPodName       = "io.kubernetes.pod.name"
	labelPodNamespace  = "io.kubernetes.pod.namespace"
	labelPodUID        = "io.kubernetes.pod.uid"
	labelContainerName = "io.kubernetes.container.name"
)

// runtime is the run's view of CRI: what really runs in its namespace.
type runtime struct {
	rt       internalapi.RuntimeService
	ns       string
	versions map[string]int // container id -> the v=N of its command
}

func connectRuntime(endpoint, ns string) (*runtime, error) {
	ctx, cancel := criCtx()
	defer cancel()
	rt, err := criclient.NewRemoteRuntimeServiceBuilder().WithEndpoint(endpoint).WithConnectionTimeout(5 * time.Second).WithTracerProvider(nil).Build(ctx)
	if err != nil {
		return nil, fmt.Errorf("connecting to CRI %s: %w", endpoint, err)
	}
	return &runtime{rt: rt, ns: ns, versions: map[string]int{}}, nil
}

func criCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(klog.NewContext(context.Background(), logr.Discard()), 20*time.Second)
}

// snapshot is what CRI holds of the namespace at one moment.
type snapshot struct {
	sandboxes  []*runtimeapi.PodSandbox
	containers []*runtimeapi.Container
}

func (r *runtime) snapshot() (snapshot, error) {
	ctx, cancel := criCtx()
	defer cancel()
	sel := map[string]string{labelPodNamespace: r.ns}
	sbs, err := r.rt.ListPodSandbox(ctx, &runtimeapi.PodSandboxFilter{LabelSelector: sel})
	if err != nil {
		return snapshot{}, fmt.Errorf("listing sandboxes: %w", err)
	}
	cts, err := r.rt.ListContainers(ctx, &runtimeapi.ContainerFilter{LabelSelector: sel})
	if err != nil {
		return snapshot{}, fmt.Errorf("listing containers: %w", err)
	}
	return snapshot{sandboxes: sbs, containers: cts}, nil
}

// readySandboxes lists the ready sandboxes of pod name.
func (s snapshot) readySandboxes(name string) []*runtimeapi.PodSandbox {
	var out []*runtimeapi.PodSandbox
	for _, sb := range s.sandboxes {
		if sb.Labels[labelPodName] == name && sb.State == runtimeapi.PodSandboxState_SANDBOX_READY {
			out = append(out, sb)
		}
	}
	return out
}

// running lists the running containers of pod name.
func (s snapshot) running(name string) []*runtimeapi.Container {
	var out []*runtimeapi.Container
	for _, c := range s.containers {
		if c.Labels[labelPodName] == name && c.State == runtimeapi.ContainerState_CONTAINER_RUNNING {
			out = append(out, c)
		}
	}
	return out
}

// any reports whether CRI holds anything (any state) of pod name.
func (s snapshot) holds(name string) bool {
	for _, sb := range s.sandboxes {
		if sb.Labels[labelPodName] == name {
			return true
		}
	}
	for _, c := range s.containers {
		if c.Labels[labelPodName] == name {
			return true
		}
	}
	return false
}

// ids returns the ids of every sandbox and container.
func (s snapshot) ids() map[string]bool {
	out := map[string]bool{}
	for _, sb := range s.sandboxes {
		out[sb.Id] = true
	}
	for _, c := range s.containers {
		out[c.Id] = true
	}
	return out
}

var versionMarker = regexp.MustCompile(`v=([0-9]+)`)

// version reads the v=N marker from the arguments of container id's
// process, as the runtime started it (its OCI spec).
func (r *runtime) version(id string) (int, error) {
	if v, ok := r.versions[id]; ok {
		return v, nil
	}
	ctx, cancel := criCtx()
	defer cancel()
	resp, err := r.rt.ContainerStatus(ctx, id, true)
	if err != nil {
		return 0, fmt.Errorf("container status of %s: %w", id, err)
	}
	var info struct {
		RuntimeSpec struct {
			Process struct {
				Args []string `json:"args"`
			} `json:"process"`
		} `json:"runtimeSpec"`
	}
	if err := json.Unmarshal([]byte(resp.GetInfo()["info"]), &info); err != nil {
		return 0, fmt.Errorf("decoding the verbose status of %s: %w", id, err)
	}
	for _, a := range info.RuntimeSpec.Process.Args {
		if m := versionMarker.FindStringSubmatch(a); m != nil {
			v, _ := strconv.Atoi(m[1])
			r.versions[id] = v
			return v, nil
		}
	}
	return 0, fmt.Errorf("no v=N marker in the arguments of %s: %q", id, info.RuntimeSpec.Process.Args)
}

// ranAfter reports whether container id was still running at t (ok false
// when the runtime no longer knows it).
func (r *runtime) ranAfter(id string, t time.Time) (ran, ok bool) {
	ctx, cancel := criCtx()
	defer cancel()
	resp, err := r.rt.ContainerStatus(ctx, id, false)
	if err != nil || resp.GetStatus() == nil {
		return false, false
	}
	st := resp.GetStatus()
	if st.State == runtimeapi.ContainerState_CONTAINER_RUNNING {
		return true, true
	}
	if st.FinishedAt == 0 {
		return false, true
	}
	return time.Unix(0, st.FinishedAt).After(t), true
}

// sweep removes whatever of the namespace is left, a few passes.
func (r *runtime) sweep() error {
	return r.sweepWhere(func(ns string) bool { return ns == r.ns })
}

// sweepWhere removes the sandboxes of the namespaces matching, a few passes.
func (r *runtime) sweepWhere(match func(ns string) bool) error {
	for pass := 0; pass < 4; pass++ {
		ctx, cancel := criCtx()
		all, err := r.rt.ListPodSandbox(ctx, nil)
		cancel()
		if err != nil {
			return fmt.Errorf("listing sandboxes: %w", err)
		}
		var sbs []*runtimeapi.PodSandbox
		for _, sb := range all {
			if match(sb.Labels[labelPodNamespace]) {
				sbs = append(sbs, sb)
			}
		}
		if len(sbs) == 0 {
			return nil
		}
		ctx, cancel = criCtx()
		for _, sb := range sbs {
			_ = r.rt.StopPodSandbox(ctx, sb.Id)
			_ = r.rt.RemovePodSandbox(ctx, sb.Id)
		}
		cancel()
	}
	return errors.New("sandboxes left after 4 passes")
}
