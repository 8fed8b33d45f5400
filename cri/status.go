package cri

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/mqlet/mqlet/internal/redact"
)

// GetPodStatus reads the sandboxes and containers of pod uid from the
// runtime. A pod the runtime does not know has an empty status, not an error.
func (m *Manager) GetPodStatus(ctx context.Context, uid, name, namespace string) (*PodStatus, error) {
	svc, err := m.conn.get()
	if err != nil {
		return nil, err
	}
	qctx := quietContext(ctx)
	sandboxes, err := svc.runtime.ListPodSandbox(qctx, &runtimeapi.PodSandboxFilter{LabelSelector: podSelector(uid)})
	if err != nil {
		return nil, fmt.Errorf("list sandboxes of pod %s/%s: %w", namespace, name, err)
	}
	containers, err := svc.runtime.ListContainers(qctx, &runtimeapi.ContainerFilter{LabelSelector: podSelector(uid)})
	if err != nil {
		return nil, fmt.Errorf("list containers of pod %s/%s: %w", namespace, name, err)
	}
	st := &PodStatus{UID: uid, Name: name, Namespace: namespace}
	for _, sb := range sandboxes {
		s := SandboxStatus{
			ID:        sb.Id,
			Ready:     sb.State == runtimeapi.PodSandboxState_SANDBOX_READY,
			Attempt:   sb.GetMetadata().GetAttempt(),
			CreatedAt: time.Unix(0, sb.CreatedAt),
			SpecHash:  sb.Annotations[AnnotationSandboxHash],
		}
		if s.Ready {
			resp, err := svc.runtime.PodSandboxStatus(qctx, sb.Id, false)
			if isNotFound(err) {
				continue // removed since the listing
			}
			if err != nil {
				return nil, fmt.Errorf("status of sandbox %s of pod %s/%s: %w", sb.Id, namespace, name, err)
			}
			if n := resp.GetStatus().GetNetwork(); n != nil {
				s.IP = n.Ip
				if n.Ip != "" {
					s.IPs = append(s.IPs, n.Ip)
				}
				for _, ip := range n.AdditionalIps {
					s.IPs = append(s.IPs, ip.Ip)
				}
			}
		}
		st.Sandboxes = append(st.Sandboxes, s)
	}
	sort.SliceStable(st.Sandboxes, func(i, j int) bool {
		a, b := st.Sandboxes[i], st.Sandboxes[j]
		if a.Attempt != b.Attempt {
			return a.Attempt > b.Attempt
		}
		return a.CreatedAt.After(b.CreatedAt)
	})
	var scrub *redact.Scrubber
	for _, c := range containers {
		cs, err := m.containerStatus(qctx, svc, c)
		if err == nil && cs != nil && cs.State == ContainerExited {
			if msg := m.terminationMessage(qctx, svc, uid, namespace, name, c, cs); msg != "" {
				if cs.Message != "" {
					cs.Message += ": "
				}
				cs.Message += msg
			}
		}
		if err != nil {
			return nil, fmt.Errorf("status of container %s of pod %s/%s: %w", c.GetMetadata().GetName(), namespace, name, err)
		}
		if cs != nil && (cs.Message != "" || cs.Reason != "") {
			// The runtime's messages can quote a secret value (a command
			// expanded from one); they leave the node in the pod status.
			// Reasons are the runtime's words, not the container's: kept.
			if scrub == nil {
				scrub = m.scrubber(&v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}}, nil)
			}
			cs.Message = scrub.String(cs.Message)
		}
		if cs != nil {
			st.Containers = append(st.Containers, *cs)
		}
	}
	sort.SliceStable(st.Containers, func(i, j int) bool {
		return st.Containers[i].CreatedAt.After(st.Containers[j].CreatedAt)
	})
	return st, nil
}

// containerStatus converts one listed container, asking the runtime for the
// details a listing lacks. A container removed meanwhile yields nil.
func (m *Manager) containerStatus(ctx context.Context, svc *services, c *runtimeapi.Container) (*ContainerStatus, error) {
	resp, err := svc.runtime.ContainerStatus(ctx, c.Id, false)
	if err != nil {
		if isNotFound(err) {
			return nil, nil
		}
		return nil, err
	}
	s := resp.GetStatus()
	if s == nil {
		return nil, nil
	}
	restarts, _ := strconv.Atoi(c.Annotations[AnnotationRestartCount])
	if restarts == 0 {
		restarts = int(c.GetMetadata().GetAttempt())
	}
	cs := &ContainerStatus{
		ID:           c.Id,
		Name:         c.GetMetadata().GetName(),
		State:        toContainerState(s.State),
		CreatedAt:    nanos(s.CreatedAt),
		StartedAt:    nanos(s.StartedAt),
		FinishedAt:   nanos(s.FinishedAt),
		ExitCode:     s.ExitCode,
		Reason:       s.Reason,
		Message:      s.Message,
		Image:        c.GetImage().GetImage(),
		ImageRef:     s.ImageRef,
		RestartCount: restarts,
		SpecHash:     c.Annotations[AnnotationContainerHash],
		GracePeriod:  parseGrace(c.Annotations[AnnotationGracePeriod]),
		PreStop:      parsePreStop(c.Annotations[AnnotationPreStop]),
		Init:         c.Labels[LabelInitContainer] == "true",
	}
	if cs.Init {
		cs.Sidecar = parseSidecar(c.Annotations[AnnotationSidecar])
	}
	if img := s.GetImage().GetImage(); img != "" {
		cs.Image = img
	}
	if m.startInterrupted(c.Labels[LabelPodUID], cs) {
		// Never started: its exit is the agent's death, not the container's.
		cs.State, cs.ExitCode, cs.Reason, cs.FinishedAt = ContainerCreated, 0, "", time.Time{}
		cs.Message = "start interrupted when mqlet stopped; created again"
	}
	if cs.State == ContainerExited && cs.Reason == "" {
		cs.Reason = "Error"
		if cs.ExitCode == 0 {
			cs.Reason = "Completed"
		}
	}
	return cs, nil
}

func nanos(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n)
}

func toContainerState(s runtimeapi.ContainerState) ContainerState {
	switch s {
	case runtimeapi.ContainerState_CONTAINER_CREATED:
		return ContainerCreated
	case runtimeapi.ContainerState_CONTAINER_RUNNING:
		return ContainerRunning
	case runtimeapi.ContainerState_CONTAINER_EXITED:
		return ContainerExited
	default:
		return ContainerUnknown
	}
}

// ListPods names every pod that has an mqlet-labelled sandbox or container.
func (m *Manager) ListPods(ctx context.Context) ([]PodRef, error) {
	svc, err := m.conn.get()
	if err != nil {
		return nil, err
	}
	qctx := quietContext(ctx)
	sandboxes, err := svc.runtime.ListPodSandbox(qctx, &runtimeapi.PodSandboxFilter{LabelSelector: managedSelector()})
	if err != nil {
		return nil, fmt.Errorf("list mqlet sandboxes: %w", err)
	}
	containers, err := svc.runtime.ListContainers(qctx, &runtimeapi.ContainerFilter{LabelSelector: managedSelector()})
	if err != nil {
		return nil, fmt.Errorf("list mqlet containers: %w", err)
	}
	index := map[string]int{} // uid → position in refs
	var refs []PodRef
	add := func(labels map[string]string) *PodRef {
		uid := labels[LabelPodUID]
		if uid == "" {
			return nil
		}
		i, seen := index[uid]
		if !seen {
			i = len(refs)
			index[uid] = i
			refs = append(refs, PodRef{UID: uid, Name: labels[LabelPodName], Namespace: labels[LabelPodNamespace]})
		}
		return &refs[i]
	}
	for _, sb := range sandboxes {
		add(sb.Labels)
	}
	for _, c := range containers {
		ref := add(c.Labels)
		if ref == nil || c.State != runtimeapi.ContainerState_CONTAINER_RUNNING {
			continue
		}
		if ref.Running == nil {
			ref.Running = map[string]string{}
		}
		ref.Running[c.Id] = c.GetMetadata().GetName()
	}
	sort.Slice(refs, func(i, j int) bool {
		if refs[i].Namespace != refs[j].Namespace {
			return refs[i].Namespace < refs[j].Namespace
		}
		return refs[i].Name < refs[j].Name
	})
	return refs, nil
}

// parseGrace reads a grace period annotation; nil when absent or invalid.
func parseGrace(v string) *int64 {
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 {
		return nil
	}
	return &n
}
