// Package cri speaks the Kubernetes CRI to a container runtime
// (containerd, CRI-O) and exposes just what the agent needs to run pods.
//
// This file is the contract between the agent and the runtime; the agent
// declares its own narrow interfaces over *Manager.
package cri

import (
	"errors"
	"time"

	v1 "k8s.io/api/core/v1"
)

// ErrUnavailable is returned (wrapped) when the CRI endpoint cannot be reached.
var ErrUnavailable = errors.New("container runtime unavailable")

// ErrCrashLoopBackOff is returned (wrapped, as *BackoffError) when a container
// must wait before it is started again.
var ErrCrashLoopBackOff = errors.New("CrashLoopBackOff")

// BackoffError says which container waits, for how long still (Wait), and
// the whole back-off it is in (Delay, 0 when not known).
type BackoffError struct {
	Container string
	Wait      time.Duration
	Delay     time.Duration
}

// Error names the whole back-off, as the kubelet's CrashLoopBackOff
// message does, so the steps (1 s, 2 s, 4 s, ... up to the cap) can be read
// from the status; the time left changes with every look and is not in it.
func (e *BackoffError) Error() string {
	d := e.Delay
	if d <= 0 {
		d = e.Wait
	}
	return "back-off " + d.Round(time.Second).String() + " restarting failed container " + e.Container
}

func (e *BackoffError) Unwrap() error { return ErrCrashLoopBackOff }

// ContainerState is the runtime state of one container attempt.
type ContainerState string

const (
	ContainerCreated ContainerState = "created"
	ContainerRunning ContainerState = "running"
	ContainerExited  ContainerState = "exited"
	ContainerUnknown ContainerState = "unknown"
)

// mayRun reports whether a container in state s may be running: one not
// known to have exited is to be stopped before its pod counts as down.
func (s ContainerState) mayRun() bool {
	return s == ContainerRunning || s == ContainerCreated || s == ContainerUnknown
}

// ContainerStatus is one attempt of one container as the runtime reports it.
type ContainerStatus struct {
	ID           string
	Name         string
	State        ContainerState
	CreatedAt    time.Time
	StartedAt    time.Time
	FinishedAt   time.Time
	ExitCode     int32
	Reason       string // e.g. "OOMKilled", "Error", "Completed"
	Message      string
	Image        string
	ImageRef     string
	RestartCount int    // the attempt number recorded when it was created
	SpecHash     string // hash of the v1.Container it was created from
	Init         bool   // an init container
	GracePeriod  *int64 // the pod's terminationGracePeriodSeconds when it was created
	// PreStop is the container's preStop handler as recorded when it was
	// created (named port resolved), or nil.
	PreStop *v1.LifecycleHandler
	// Sidecar is 1 + the container's index among the pod's init containers
	// when it is a sidecar (recorded when it was created), else 0.
	Sidecar int
}

// SandboxStatus is one pod sandbox attempt.
type SandboxStatus struct {
	ID        string
	Ready     bool
	Attempt   uint32
	CreatedAt time.Time
	IP        string
	IPs       []string
	SpecHash  string // hash of the sandbox-relevant part of the pod spec
}

// PodStatus is everything the runtime knows about one pod (by UID).
// Sandboxes and Containers are sorted newest first.
type PodStatus struct {
	UID        string
	Name       string
	Namespace  string
	Sandboxes  []SandboxStatus
	Containers []ContainerStatus
}

// Live reports whether anything of the pod still runs in the runtime: a
// ready sandbox, or a container not known to have exited.
func (s *PodStatus) Live() bool {
	if s == nil {
		return false
	}
	for _, sb := range s.Sandboxes {
		if sb.Ready {
			return true
		}
	}
	for _, c := range s.Containers {
		if c.State.mayRun() {
			return true
		}
	}
	return false
}

// PodRef names a pod that carries mqlet's labels in the runtime.
type PodRef struct {
	UID       string
	Name      string
	Namespace string
	// Running maps the ID of each of the pod's running containers to its
	// name, from the same listing (nil when none runs).
	Running map[string]string
}

// EventRecorder receives what happened to a pod, in Kubernetes event terms
// (eventType is v1.EventTypeNormal or v1.EventTypeWarning; reasons such as
// Pulling, Pulled, Created, Started, Killing, Failed, BackOff).
type EventRecorder interface {
	Event(pod *v1.Pod, eventType, reason, message string)
}

// RestartBackoff is the crash-loop policy the agent hands to SyncPod.
// key identifies one spec of one container of one pod (see BackoffKey).
type RestartBackoff interface {
	// InBackoff reports whether the container that last exited at finishedAt
	// must still wait, and how long.
	InBackoff(key string, finishedAt time.Time) (bool, time.Duration)
	// Delay is the whole back-off key is in (0: none).
	Delay(key string) time.Duration
	// Next records a restart of the container that exited at finishedAt.
	Next(key string, finishedAt time.Time)
}

// ObjectSource gives SyncPod the ConfigMaps and Secrets a pod refers to
// (env valueFrom, envFrom, volumes, imagePullSecrets).
type ObjectSource interface {
	ConfigMap(namespace, name string) (*v1.ConfigMap, error)
	Secret(namespace, name string) (*v1.Secret, error)
}

// PodLifecycleEventType says what PLEG saw.
type PodLifecycleEventType string

const (
	ContainerStarted PodLifecycleEventType = "ContainerStarted"
	ContainerDied    PodLifecycleEventType = "ContainerDied"
	ContainerRemoved PodLifecycleEventType = "ContainerRemoved"
	SandboxChanged   PodLifecycleEventType = "SandboxChanged"
)

// PodLifecycleEvent is one change PLEG saw for a pod.
type PodLifecycleEvent struct {
	PodUID      string
	Type        PodLifecycleEventType
	ContainerID string
}

// ErrImageNeverPull is returned (wrapped) when a container's image is missing
// and its imagePullPolicy is Never.
var ErrImageNeverPull = errors.New("ErrImageNeverPull")

// ErrImagePull is returned (wrapped) when pulling a container's image failed.
var ErrImagePull = errors.New("ErrImagePull")

// ContainerError says which container could not be started and why, in the
// kubelet's waiting-reason terms (ErrImageNeverPull, ErrImagePull, ImagePullBackOff,
// CreateContainerConfigError, CreateContainerError, RunContainerError).
type ContainerError struct {
	Container string
	Reason    string
	Err       error
	// RetryAfter, when set, is when the pod should be synced again (an
	// image pull in flight or in backoff) instead of the sync retry backoff.
	RetryAfter time.Duration
	// Definite says no retry cures it without a change by the operator
	// (the registry refused the credentials, or has no such image).
	Definite bool
}

func (e *ContainerError) Error() string { return e.Err.Error() }

func (e *ContainerError) Unwrap() error { return e.Err }
