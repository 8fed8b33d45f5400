package cri

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

func (m *Manager) createPodDirs(pod *v1.Pod) error {
	podDir, err := m.podDir(string(pod.UID))
	if err != nil {
		return err
	}
	logDir, err := m.podLogDir(pod.Namespace, pod.Name, string(pod.UID))
	if err != nil {
		return err
	}
	for _, dir := range []string{filepath.Join(podDir, "volumes"), logDir} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("create pod directory %s: %w", dir, err)
		}
	}
	return nil
}

// stopPod stops every running container of the pod (each with the grace
// period; the app containers in parallel, then the sidecars in reverse
// order, see stopOrdered) and then its ready sandboxes. Nothing is removed.
func (m *Manager) stopPod(ctx context.Context, svc *services, pod *v1.Pod, status *PodStatus, override *int64, events EventRecorder) error {
	if status == nil {
		return nil
	}
	var stops []ContainerStatus
	for _, c := range status.Containers {
		if !c.State.mayRun() {
			continue
		}
		if pod != nil && c.State == ContainerRunning {
			events.Event(pod, v1.EventTypeNormal, "Killing", "Stopping container "+c.Name)
		}
		stops = append(stops, c)
	}
	if err := m.stopOrdered(ctx, svc, pod, stops, podIPOf(status), override, events); err != nil {
		return err
	}
	for _, sb := range status.Sandboxes {
		if !sb.Ready {
			continue
		}
		if err := svc.runtime.StopPodSandbox(ctx, sb.ID); err != nil && !isNotFound(err) {
			return fmt.Errorf("stop sandbox %s: %w", sb.ID, err)
		}
	}
	return nil
}

// podIPOf is the IP of the pod's live sandbox, or "".
func podIPOf(status *PodStatus) string {
	if status == nil || len(status.Sandboxes) == 0 || !status.Sandboxes[0].Ready {
		return ""
	}
	return status.Sandboxes[0].IP
}

// specOf is the container's spec in pod, or nil (a pod known by its
// runtime labels only).
func specOf(pod *v1.Pod, c ContainerStatus) *v1.Container {
	if pod == nil {
		return nil
	}
	list := pod.Spec.Containers
	if c.Init {
		list = pod.Spec.InitContainers
	}
	for i := range list {
		if list[i].Name == c.Name {
			return &list[i]
		}
	}
	return nil
}

// containerGrace is the grace period for stopping c: the override, else the
// pod spec's, else what the container recorded at creation, else the default.
func containerGrace(pod *v1.Pod, c ContainerStatus, override *int64) int64 {
	if override == nil && (pod == nil || pod.Spec.TerminationGracePeriodSeconds == nil) && c.GracePeriod != nil {
		return *c.GracePeriod
	}
	return gracePeriod(pod, override)
}

// KillPod stops the pod's containers (gracePeriod overrides the pod's
// terminationGracePeriodSeconds), removes its containers and sandboxes, and
// deletes its volume and log directories.
func (m *Manager) KillPod(ctx context.Context, pod *v1.Pod, gracePeriodOverride *int64) error {
	return m.killPod(ctx, pod, string(pod.UID), pod.Name, pod.Namespace, gracePeriodOverride)
}

// KillPodByRef is KillPod for a pod known only by its runtime labels (e.g. an
// orphan after an agent restart).
func (m *Manager) KillPodByRef(ctx context.Context, ref PodRef, gracePeriodOverride *int64) error {
	return m.killPod(ctx, nil, ref.UID, ref.Name, ref.Namespace, gracePeriodOverride)
}

func (m *Manager) killPod(ctx context.Context, pod *v1.Pod, uid, name, namespace string, override *int64) error {
	m.puller.forget(uid)
	svc, err := m.conn.get()
	if err != nil {
		return err
	}
	// While the pod terminates (possibly for a long grace period) the
	// garbage collector keeps its hands off it.
	done := m.terminating.begin(uid)
	defer done()
	ctx = quietContext(ctx)
	status, err := m.GetPodStatus(ctx, uid, name, namespace)
	if err != nil {
		return fmt.Errorf("kill pod %s/%s: %w", namespace, name, err)
	}
	eventPod := pod
	if eventPod == nil {
		eventPod = &v1.Pod{}
		eventPod.Name, eventPod.Namespace, eventPod.UID = name, namespace, types.UID(uid)
	}
	if err := m.stopPod(ctx, svc, eventPod, status, override, noEvents{}); err != nil {
		return fmt.Errorf("kill pod %s/%s: %w", namespace, name, err)
	}
	if err := m.removePodRuntimeObjects(ctx, svc, status); err != nil {
		return fmt.Errorf("kill pod %s/%s: %w", namespace, name, err)
	}
	if err := m.removePodDirs(uid, name, namespace); err != nil {
		return fmt.Errorf("kill pod %s/%s: %w", namespace, name, err)
	}
	if IsUID(uid) {
		if err := m.removePodCgroup(uid); err != nil {
			m.log.Warn().Err(err).Str("pod", namespace+"/"+name).Msg("removing the pod's cgroup")
		}
	}
	return nil
}

// removePodRuntimeObjects removes every container and sandbox in status.
func (m *Manager) removePodRuntimeObjects(ctx context.Context, svc *services, status *PodStatus) error {
	for _, c := range status.Containers {
		if err := svc.runtime.RemoveContainer(ctx, c.ID); err != nil && !isNotFound(err) {
			return fmt.Errorf("remove container %s: %w", c.Name, err)
		}
	}
	for _, sb := range status.Sandboxes {
		if err := m.removeSandbox(ctx, svc, sb.ID); err != nil {
			return err
		}
	}
	return nil
}

func (m *Manager) removeSandbox(ctx context.Context, svc *services, id string) error {
	if err := svc.runtime.StopPodSandbox(ctx, id); err != nil && !isNotFound(err) {
		return fmt.Errorf("stop sandbox %s: %w", id, err)
	}
	if err := svc.runtime.RemovePodSandbox(ctx, id); err != nil && !isNotFound(err) {
		return fmt.Errorf("remove sandbox %s: %w", id, err)
	}
	return nil
}

// removePodDirs unmounts the pod's subpath mounts and removes its pod and
// log directories. A pod whose identity is not safe to build paths from
// (a runtime object with hostile labels) has no directories of ours: none
// are touched.
func (m *Manager) removePodDirs(uid, name, namespace string) error {
	if uid == "" {
		return nil
	}
	podDir, err := m.podDir(uid)
	if err != nil {
		m.log.Warn().Str("pod", namespace+"/"+name).Err(err).Msg("not removing pod directories")
		return nil
	}
	if err := removeAllUnmounted(podDir); err != nil {
		return fmt.Errorf("remove %s: %w", podDir, err)
	}
	logDir, err := m.podLogDir(namespace, name, uid)
	if err != nil {
		m.log.Warn().Str("pod", namespace+"/"+name).Err(err).Msg("not removing pod log directory")
		return nil
	}
	if err := os.RemoveAll(logDir); err != nil {
		return fmt.Errorf("remove %s: %w", logDir, err)
	}
	return nil
}

// terminations tracks pods being killed, by uid, so the garbage collector
// never cuts a running termination short.
type terminations struct {
	mu   sync.Mutex
	uids map[string]int
}

func (t *terminations) begin(uid string) (end func()) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.uids == nil {
		t.uids = map[string]int{}
	}
	t.uids[uid]++
	return func() {
		t.mu.Lock()
		defer t.mu.Unlock()
		if t.uids[uid]--; t.uids[uid] <= 0 {
			delete(t.uids, uid)
		}
	}
}

func (t *terminations) active(uid string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.uids[uid] > 0
}
