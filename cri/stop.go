package cri

import (
	"context"
	"fmt"

	v1 "k8s.io/api/core/v1"
)

// StopPod stops the pod's running containers (a Killing event each, the
// preStop hook, the pod's grace period) and then its sandbox, removing
// nothing: a pod failed for good (past its activeDeadlineSeconds) keeps its
// terminated containers, and their messages, in its status.
func (m *Manager) StopPod(ctx context.Context, pod *v1.Pod, events EventRecorder) error {
	if err := checkPodIdentity(string(pod.UID), pod.Name, pod.Namespace); err != nil {
		return fmt.Errorf("stop pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	svc, err := m.conn.get()
	if err != nil {
		return err
	}
	if events == nil {
		events = noEvents{}
	}
	events = scrubbingRecorder{next: events, s: m.scrubber(pod, nil)}
	done := m.terminating.begin(string(pod.UID))
	defer done()
	ctx = quietContext(ctx)
	status, err := m.GetPodStatus(ctx, string(pod.UID), pod.Name, pod.Namespace)
	if err != nil {
		return fmt.Errorf("stop pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	if err := m.stopPod(ctx, svc, pod, status, nil, events); err != nil {
		return fmt.Errorf("stop pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	return nil
}
