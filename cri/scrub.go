package cri

import (
	"errors"

	v1 "k8s.io/api/core/v1"

	"github.com/mqlet/mqlet/internal/redact"
)

// Secret values must not leave the runtime in any message: a pod can make
// one part of a runtime error (command: ["$(PW)"] with PW from a Secret
// makes runc's "executable file not found" quote it). Events, returned
// errors and container state messages all pass through a Scrubber.

// scrubber is the scrubber of pod's text (Config.ScrubPod). Without one
// it is built from the secrets pod refers to through objects, so a sync
// never hands out its own pod's secret values.
func (m *Manager) scrubber(pod *v1.Pod, objects ObjectSource) *redact.Scrubber {
	if m.cfg.ScrubPod != nil {
		return m.cfg.ScrubPod(pod.Namespace, pod.Name)
	}
	var secrets []*v1.Secret
	if objects != nil {
		for _, name := range redact.PodSecretNames(pod) {
			if s, err := objects.Secret(pod.Namespace, name); err == nil && s != nil {
				secrets = append(secrets, s)
			}
		}
	}
	return redact.FromSecrets(secrets)
}

// scrubError returns err with secret values removed while keeping what
// callers inspect: joined errors stay joined, a *ContainerError keeps its
// container and reason, a *BackoffError (no values in it) stays as is, and
// errors.Is still matches sentinels.
func scrubError(s *redact.Scrubber, err error) error {
	if err == nil || s.Len() == 0 || !s.Contains(err.Error()) {
		return err
	}
	var ce *ContainerError
	switch e := err.(type) {
	case interface{ Unwrap() []error }:
		inner := e.Unwrap()
		out := make([]error, len(inner))
		for i, x := range inner {
			out[i] = scrubError(s, x)
		}
		return errors.Join(out...)
	case *ContainerError:
		return &ContainerError{Container: e.Container, Reason: e.Reason, Err: s.Error(e.Err), RetryAfter: e.RetryAfter, Definite: e.Definite}
	}
	if errors.As(err, &ce) {
		// A wrapped ContainerError: keep it reachable (the agent reads its
		// reason), with the outer context scrubbed into its message.
		return &ContainerError{Container: ce.Container, Reason: ce.Reason, Err: s.Error(err), RetryAfter: ce.RetryAfter, Definite: ce.Definite}
	}
	return s.Error(err)
}

// scrubbingRecorder scrubs event messages.
type scrubbingRecorder struct {
	next EventRecorder
	s    *redact.Scrubber
}

func (r scrubbingRecorder) Event(pod *v1.Pod, eventType, reason, message string) {
	r.next.Event(pod, eventType, reason, r.s.String(message))
}
