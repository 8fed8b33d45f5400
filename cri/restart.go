package cri

import (
	"context"
	"fmt"
	"slices"
	"time"

	v1 "k8s.io/api/core/v1"
)

// A restart request kills what it names and starts it again whatever the
// pod's restartPolicy and crash-loop backoff say: the whole pod (every
// container and the sandbox, then a new sandbox attempt) or one app
// container. Restart counts go on as the kubelet's do after a kill.

// forced is what a restart request makes one sync start.
type forced struct {
	pod       bool   // every container in a new sandbox attempt
	container string // one app container
}

func (f forced) none() bool { return !f.pod && f.container == "" }

// apply turns act into one that starts what f names, and returns the
// backoff that lets those containers start at once.
func (f forced) apply(pod *v1.Pod, status *PodStatus, act *podActions, backoff RestartBackoff) RestartBackoff {
	if f.none() {
		return backoff
	}
	act.PodFailed = false
	if act.SandboxID == "" && !act.CreateSandbox {
		// A finished pod is given no sandbox of its own accord.
		act.CreateSandbox, act.KillPod = true, true
		if len(status.Sandboxes) > 0 {
			act.SandboxAttempt = status.Sandboxes[0].Attempt + 1
		}
		act.Reason = ReasonRestartRequested
		if len(pod.Spec.InitContainers) > 0 {
			// A new sandbox runs its init containers first.
			act.InitToStart = []int{0}
			return skipBackoff{next: backoff, pod: pod, only: f.container}
		}
		act.Initialized = true
	}
	if act.SandboxID != "" && act.KillPod && act.Reason == ReasonAllTerminated {
		act.KillPod = false // the restarted container keeps the sandbox
	}
	if !act.Initialized {
		return skipBackoff{next: backoff, pod: pod, only: f.container} // init containers run first
	}
	for i := range pod.Spec.Containers {
		if (f.pod || pod.Spec.Containers[i].Name == f.container) && !slices.Contains(act.ContainersToStart, i) {
			act.ContainersToStart = append(act.ContainersToStart, i)
		}
	}
	slices.Sort(act.ContainersToStart)
	return skipBackoff{next: backoff, pod: pod, only: f.container}
}

// skipBackoff is a crash-loop backoff that never holds back the restarted
// containers (all of the pod's unless only names one); the restart still
// counts.
type skipBackoff struct {
	next RestartBackoff
	pod  *v1.Pod
	only string
}

func (s skipBackoff) forced(key string) bool {
	if s.only == "" {
		return true
	}
	for i := range s.pod.Spec.Containers {
		if c := &s.pod.Spec.Containers[i]; c.Name == s.only {
			return key == BackoffKey(s.pod, c)
		}
	}
	return false
}

func (s skipBackoff) InBackoff(key string, finishedAt time.Time) (bool, time.Duration) {
	if s.forced(key) || s.next == nil {
		return false, 0
	}
	return s.next.InBackoff(key, finishedAt)
}

func (s skipBackoff) Delay(key string) time.Duration {
	if s.next == nil {
		return 0
	}
	return s.next.Delay(key)
}

func (s skipBackoff) Next(key string, finishedAt time.Time) {
	if s.next != nil {
		s.next.Next(key, finishedAt)
	}
}

// RestartPod kills the pod's containers and sandbox (or only its app
// container named container) with a Killing event saying why, and starts
// them again. status is the pod's runtime status before; the new one is
// read after the kill. It returns when the new containers were started.
func (m *Manager) RestartPod(ctx context.Context, pod *v1.Pod, status *PodStatus, container, why string, objects ObjectSource, backoff RestartBackoff, events EventRecorder) error {
	if events == nil {
		events = noEvents{}
	}
	if err := checkPodIdentity(string(pod.UID), pod.Name, pod.Namespace); err != nil {
		return fmt.Errorf("restart pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	if container != "" && !slices.ContainsFunc(pod.Spec.Containers, func(c v1.Container) bool { return c.Name == container }) {
		return fmt.Errorf("restart pod %s/%s: %w: no app container %q in its spec", pod.Namespace, pod.Name, ErrNoContainer, container)
	}
	svc, err := m.conn.await(ctx, m.cfg.ConnectTimeout)
	if err != nil {
		return err
	}
	qctx := quietContext(ctx)
	for _, c := range status.Containers {
		if !c.State.mayRun() {
			continue
		}
		if container != "" && (c.Name != container || c.Init) {
			continue
		}
		events.Event(pod, v1.EventTypeNormal, "Killing", fmt.Sprintf("Stopping container %s: %s", c.Name, why))
		if err := m.stopContainer(qctx, svc, c.ID, containerGrace(pod, c, nil)); err != nil {
			return fmt.Errorf("restart pod %s/%s: stop container %s: %w", pod.Namespace, pod.Name, c.Name, err)
		}
	}
	if container == "" {
		for _, sb := range status.Sandboxes {
			if !sb.Ready {
				continue
			}
			if err := svc.runtime.StopPodSandbox(qctx, sb.ID); err != nil && !isNotFound(err) {
				return fmt.Errorf("restart pod %s/%s: stop sandbox %s: %w", pod.Namespace, pod.Name, sb.ID, err)
			}
		}
	}
	after, err := m.GetPodStatus(ctx, string(pod.UID), pod.Name, pod.Namespace)
	if err != nil {
		return fmt.Errorf("restart pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	return m.syncPod(ctx, SyncInput{Pod: pod, Status: after, Objects: objects, Backoff: backoff, Events: events}, forced{pod: container == "", container: container})
}
