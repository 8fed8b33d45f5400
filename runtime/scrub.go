package runtime

import (
	"errors"

	v1 "k8s.io/api/core/v1"

	"github.com/mqlet/mqlet/internal/redact"
)

// Secret values must not leave the runtime in any message: a pod can make
// one part of a runtime error (command: ["$(PW)"] with PW from a Secret
// makes runc's "executable file not found" quote it). Events, returned
// errors and container state messages all pass through a Scrubber.

// scrubber knows every secret value the node holds (Config.Secrets) plus
// those of the secrets pod refers to through objects (so it works even
// without a lister).
func (m *Manager) scrubber(pod *v1.Pod, objects ObjectSource) *redact.Scrubber {
	var secrets []*v1.Secret
	if m.cfg.Secrets != nil {
		list, err := m.cfg.Secrets.ListSecrets()
		if err != nil {
			m.log.Warn().Err(err).Msg("listing secrets to scrub messages; only the pod's own are scrubbed")
		}
		secrets = list
	}
	if pod != nil && objects != nil {
		for _, name := range podSecretNames(pod) {
			if s, err := objects.Secret(pod.Namespace, name); err == nil && s != nil {
				secrets = append(secrets, s)
			}
		}
	}
	return redact.FromSecrets(secrets)
}

// Scrubber returns a scrubber for every secret value the node knows now
// (Config.Secrets). The agent scrubs what it publishes (events, statuses,
// replies) and logs with it, the same way the runtime does.
func (m *Manager) Scrubber() *redact.Scrubber { return m.scrubber(nil, nil) }

// podSecretNames lists the secrets pod refers to.
func podSecretNames(pod *v1.Pod) []string {
	var names []string
	for _, r := range pod.Spec.ImagePullSecrets {
		names = append(names, r.Name)
	}
	for _, vol := range pod.Spec.Volumes {
		if vol.Secret != nil {
			names = append(names, vol.Secret.SecretName)
		}
	}
	for _, list := range [][]v1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for _, c := range list {
			for _, from := range c.EnvFrom {
				if from.SecretRef != nil {
					names = append(names, from.SecretRef.Name)
				}
			}
			for _, e := range c.Env {
				if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
					names = append(names, e.ValueFrom.SecretKeyRef.Name)
				}
			}
		}
	}
	return names
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
		return &ContainerError{Container: e.Container, Reason: e.Reason, Err: s.Error(e.Err)}
	}
	if errors.As(err, &ce) {
		// A wrapped ContainerError: keep it reachable (the agent reads its
		// reason), with the outer context scrubbed into its message.
		return &ContainerError{Container: ce.Container, Reason: ce.Reason, Err: s.Error(err)}
	}
	return s.Error(err)
}

// scrubbingRecorder scrubs event messages.
type scrubbingRecorder struct {
	next EventRecorder
	s    *redact.Scrubber
}

func (r scrubbingRecorder) Event(pod *v1.Pod, eventType, reason, message string) {
	r.next.Event(pod, eventType, r.s.String(reason), r.s.String(message))
}
