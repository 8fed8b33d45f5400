package cri

import (
	"context"
	"errors"
	"fmt"
	"time"

	v1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/mqlet/mqlet/internal/faultpoint"
)

type noEvents struct{}

func (noEvents) Event(*v1.Pod, string, string, string) {}

// SyncInput is everything one sync of one pod acts on.
type SyncInput struct {
	Pod *v1.Pod
	// Status is the pod's runtime status (from GetPodStatus).
	Status *PodStatus
	// Probes are the latest probe results by container ID; nil means none
	// known. A failed liveness or startup result kills the container.
	Probes  ProbeResults
	Objects ObjectSource
	Backoff RestartBackoff
	Events  EventRecorder
	// Finished says the pod's current spec has finished: its status last
	// published for this generation is Succeeded or Failed. Such a pod gets
	// no new sandbox, whatever the runtime lists: its exited containers may
	// be gone (GC, an operator, another agent's GC on a shared runtime), and
	// a stopped sandbox alone does not show that the pod ran.
	Finished bool
}

// SyncPod moves the pod towards its spec given its runtime status and probe
// results: it (re)creates the sandbox, kills changed or failing containers,
// runs init containers in order and starts app containers per restart
// policy, gated by backoff. A container waiting in backoff yields a
// *BackoffError.
func (m *Manager) SyncPod(ctx context.Context, in SyncInput) error {
	return m.syncPod(ctx, in, forced{})
}

// syncPod is SyncPod that also starts what a restart request forces.
// A sidecar without a startup probe counts as started once it runs, so
// the containers after it are started at once, in a step of their own on
// a fresh runtime status, instead of on the next sync.
func (m *Manager) syncPod(ctx context.Context, in SyncInput, force forced) error {
	defer m.syncing.begin(string(in.Pod.UID))()
	for step := 0; ; step++ {
		more := false
		err := m.syncStep(ctx, in, force, &more)
		if err != nil || !more || step >= len(in.Pod.Spec.InitContainers) || ctx.Err() != nil {
			return err
		}
		status, err := m.GetPodStatus(ctx, string(in.Pod.UID), in.Pod.Name, in.Pod.Namespace)
		if err != nil {
			return nil // the next sync goes on from what the runtime says then
		}
		in.Status, force = status, forced{}
	}
}

// syncStep carries out one plan; more says a sidecar started that lets
// initialization go on.
func (m *Manager) syncStep(ctx context.Context, in SyncInput, force forced, more *bool) (err error) {
	pod, status, objects, backoff, events := in.Pod, in.Status, in.Objects, in.Backoff, in.Events
	if events == nil {
		events = noEvents{}
	}
	scrub := m.scrubber(pod, objects)
	events = scrubbingRecorder{next: events, s: scrub}
	defer func() { err = scrubError(scrub, err) }()
	if err := checkPodIdentity(string(pod.UID), pod.Name, pod.Namespace); err != nil {
		events.Event(pod, v1.EventTypeWarning, "FailedCreatePodSandBox", "Failed to create pod sandbox: "+err.Error())
		return podConfigErrors(pod, fmt.Errorf("sync pod %s/%s: %w", pod.Namespace, pod.Name, err))
	}
	svc, err := m.conn.get()
	if err != nil {
		return err
	}
	ctx = quietContext(ctx)
	act := computePodActions(pod, status, in.Probes, in.Finished)
	backoff = force.apply(pod, status, &act, backoff)
	log := m.log.With().Str("pod", pod.Namespace+"/"+pod.Name).Str("uid", string(pod.UID)).Logger()

	if act.KillPod {
		log.Info().Str("reason", act.reasonText()).Msg("stopping pod")
		if err := m.stopPod(ctx, svc, pod, status, nil, events); err != nil {
			return fmt.Errorf("stop pod %s/%s (%s): %w", pod.Namespace, pod.Name, act.reasonText(), err)
		}
	}
	if act.PodFailed {
		return nil
	}
	for id, why := range act.ContainersToKill {
		events.Event(pod, v1.EventTypeNormal, "Killing", fmt.Sprintf("Stopping container %s: %s", why.Name, why.Message()))
		cs := ContainerStatus{ID: id, Name: why.Name, Init: why.Init}
		for _, c := range status.Containers {
			if c.ID == id {
				cs = c
			}
		}
		if err := m.stopWithPreStop(ctx, svc, pod, cs, podIPOf(status), killGrace(pod, why), specOf(pod, cs), events); err != nil {
			return fmt.Errorf("stop container %s of pod %s/%s: %w", why.Name, pod.Namespace, pod.Name, err)
		}
		if why.Reason == ReasonContainerSpecChanged {
			// cri.after-kill-changed: the old container of a changed spec is
			// stopped and the new one not yet created.
			faultpoint.Hit("cri.after-kill-changed")
		}
	}
	if !act.CreateSandbox && act.SandboxID == "" {
		return nil
	}
	if len(act.InitToStart) == 0 && len(act.ContainersToStart) == 0 {
		m.refreshVolumes(pod, objects, events)
		return nil
	}

	if err := checkHostUsers(pod); err != nil {
		events.Event(pod, v1.EventTypeWarning, "FailedCreatePodSandBox", "Failed to create pod sandbox: "+err.Error())
		return podConfigErrors(pod, fmt.Errorf("sync pod %s/%s: %w", pod.Namespace, pod.Name, err))
	}
	sandboxCfg, err := m.buildSandboxConfig(pod, act.SandboxAttempt)
	if err != nil {
		return fmt.Errorf("build sandbox config of pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	// Before a new sandbox, and again for a live one (made before the
	// limit was set, or with another) whenever containers are started.
	if err := m.limitPodPids(string(pod.UID)); err != nil {
		return fmt.Errorf("limit processes of pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	if err := m.limitPodResources(pod); err != nil {
		return fmt.Errorf("limit cpu and memory of pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	sandboxID := act.SandboxID
	if act.CreateSandbox {
		if err := checkHostPorts(pod, hostProcNet); err != nil {
			events.Event(pod, v1.EventTypeWarning, "FailedCreatePodSandBox", "Failed to create pod sandbox: "+err.Error())
			return hostPortErrors(pod, err)
		}
		if err := m.createPodDirs(pod); err != nil {
			return err
		}
		// cri.after-pod-cgroups: the pod's cgroups and directories exist,
		// its sandbox does not (nothing a delete would find to kill).
		faultpoint.Hit("cri.after-pod-cgroups")
		log.Info().Str("reason", act.reasonText()).Uint32("attempt", act.SandboxAttempt).Msg("creating sandbox")
		handler, err := m.cfg.RuntimeClasses.Handler(pod)
		if err != nil {
			events.Event(pod, v1.EventTypeWarning, "FailedCreatePodSandBox", "Failed to create pod sandbox: "+err.Error())
			return podConfigErrors(pod, fmt.Errorf("sync pod %s/%s: %w", pod.Namespace, pod.Name, err))
		}
		sandboxID, err = svc.runtime.RunPodSandbox(ctx, sandboxCfg, handler)
		if err != nil {
			events.Event(pod, v1.EventTypeWarning, "FailedCreatePodSandBox", fmt.Sprintf("Failed to create pod sandbox: %v", err))
			return fmt.Errorf("create sandbox of pod %s/%s: %w", pod.Namespace, pod.Name, err)
		}
		// cri.after-run-sandbox: the pod's new sandbox runs, none of its
		// containers is created yet.
		faultpoint.Hit("cri.after-run-sandbox")
	} else {
		// Reuse the attempt of the live sandbox so the config matches it.
		sandboxCfg.Metadata.Attempt = status.Sandboxes[0].Attempt
	}
	podIP, err := m.sandboxIP(ctx, svc, sandboxID)
	if err != nil {
		return fmt.Errorf("read sandbox of pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	if err := m.pruneMounts(pod); err != nil {
		log.Warn().Err(err).Msg("removing mounts the spec no longer uses")
	}
	volumes, err := m.prepareVolumes(pod, objects)
	if err != nil {
		events.Event(pod, v1.EventTypeWarning, "FailedMount", err.Error())
		err = fmt.Errorf("set up volumes of pod %s/%s: %w", pod.Namespace, pod.Name, err)
		if errors.Is(err, errRefused) {
			return podConfigErrors(pod, err)
		}
		return err
	}

	if err := m.writeEtcHosts(pod, podIP); err != nil {
		return fmt.Errorf("write /etc/hosts of pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}

	start := func(c *v1.Container, init bool) error {
		return m.startContainer(ctx, svc, startRequest{
			pod: pod, container: c, init: init, status: status, sandboxID: sandboxID,
			sandbox: sandboxCfg, podIP: podIP, volumes: volumes,
			objects: objects, backoff: backoff, events: events,
		})
	}
	// Init containers in order: a regular one is waited for (it is the
	// last of the list); a sidecar that fails to start holds back only
	// what comes after it in the next syncs (as in the kubelet).
	var errs []error
	for _, i := range act.InitToStart {
		c := &pod.Spec.InitContainers[i]
		if err := start(c, true); err != nil {
			errs = append(errs, err)
			if !IsSidecar(c) {
				return joinSyncErrors(errs)
			}
			continue
		}
		if IsSidecar(c) && c.StartupProbe == nil && !act.Initialized {
			*more = true
		}
	}
	for _, i := range act.ContainersToStart {
		if err := start(&pod.Spec.Containers[i], false); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		*more = false
	}
	return joinSyncErrors(errs)
}

// joinSyncErrors keeps a lone *BackoffError as is, so callers see it directly.
func joinSyncErrors(errs []error) error {
	if len(errs) == 1 {
		return errs[0]
	}
	return errors.Join(errs...)
}

// killGrace is the grace period of one container kill: a failed probe's
// own terminationGracePeriodSeconds when it sets one, else the pod's.
func killGrace(pod *v1.Pod, why killReason) int64 {
	list := pod.Spec.Containers
	if why.Init {
		list = pod.Spec.InitContainers
	}
	for _, c := range list {
		if c.Name != why.Name {
			continue
		}
		var probe *v1.Probe
		switch why.Reason {
		case ReasonLivenessFailed:
			probe = c.LivenessProbe
		case ReasonStartupFailed:
			probe = c.StartupProbe
		}
		if probe != nil && probe.TerminationGracePeriodSeconds != nil {
			return *probe.TerminationGracePeriodSeconds
		}
	}
	return gracePeriod(pod, nil)
}

func gracePeriod(pod *v1.Pod, override *int64) int64 {
	switch {
	case override != nil:
		return *override
	case pod != nil && pod.Spec.TerminationGracePeriodSeconds != nil:
		return *pod.Spec.TerminationGracePeriodSeconds
	default:
		return defaultStopGracePeriod
	}
}

func (m *Manager) sandboxIP(ctx context.Context, svc *services, id string) (string, error) {
	resp, err := svc.runtime.PodSandboxStatus(ctx, id, false)
	if err != nil {
		return "", fmt.Errorf("status of sandbox %s: %w", id, err)
	}
	return resp.GetStatus().GetNetwork().GetIp(), nil
}

type startRequest struct {
	pod       *v1.Pod
	container *v1.Container
	init      bool
	status    *PodStatus
	sandboxID string
	sandbox   *runtimeapi.PodSandboxConfig
	podIP     string
	volumes   map[string]string
	objects   ObjectSource
	backoff   RestartBackoff
	events    EventRecorder
}

// startContainer creates and starts the next attempt of one container,
// unless its crash-loop backoff says to wait.
func (m *Manager) startContainer(ctx context.Context, svc *services, r startRequest) error {
	pod, c := r.pod, r.container
	restartCount := 0
	if prev := latestByName(r.status, r.init)[c.Name]; prev != nil {
		restartCount = prev.RestartCount + 1
	}
	base, be := crashLoopGate(pod, c, r.init, r.status, r.backoff)
	if be != nil {
		// The wait stays out of the event message (as in kubelet), so each
		// crash counts into the same event instead of a new one per delay.
		r.events.Event(pod, v1.EventTypeWarning, "BackOff",
			fmt.Sprintf("Back-off restarting failed container %s in pod %s/%s", c.Name, pod.Namespace, pod.Name))
		return be
	}
	what := fmt.Sprintf("container %s of pod %s/%s", c.Name, pod.Namespace, pod.Name)
	fail := func(reason string, err error) error {
		return &ContainerError{Container: c.Name, Reason: reason, Err: err}
	}
	imageRef, err := m.ensureImage(ctx, svc, pod, c, r.sandbox, r.objects, r.events)
	if err != nil {
		var ce *ContainerError
		if errors.As(err, &ce) {
			ce.Err = fmt.Errorf("%s: %w", what, ce.Err)
			return ce
		}
		reason := "ErrImagePull"
		switch {
		case errors.Is(err, ErrImageNeverPull):
			reason = "ErrImageNeverPull"
		case errors.Is(err, ErrUnavailable):
			reason = "ContainerCreating"
		}
		return fail(reason, fmt.Errorf("%s: %w", what, err))
	}
	m.imageUse.record(imageRef, time.Now())
	// The restart counts once the image is there: a pull in flight or in
	// backoff does not use up a crash-loop step.
	if base != nil && r.backoff != nil {
		r.backoff.Next(BackoffKey(pod, c), base.FinishedAt)
	}
	configError := func(err error) error {
		r.events.Event(pod, v1.EventTypeWarning, "Failed", fmt.Sprintf("Error: %v", err))
		return fail("CreateContainerConfigError", fmt.Errorf("%s: %w", what, err))
	}
	dv := m.downward(pod, r.podIP)
	dv.volumes = r.volumes
	env, err := resolveEnv(pod, c, dv, r.objects)
	if err != nil {
		return configError(fmt.Errorf("resolve environment: %w", err))
	}
	imageUID, imageUser, err := m.imageUser(ctx, svc, imageRef)
	if err != nil {
		return fail("CreateContainerConfigError", fmt.Errorf("%s: %w", what, err))
	}
	if err := checkRunAsNonRoot(pod, c, imageUID, imageUser); err != nil {
		return configError(err)
	}
	mounts, err := m.containerMounts(pod, c, r.volumes, env)
	if err != nil {
		return configError(err)
	}
	messageMount, messageFile, err := m.terminationMessageMount(pod, c)
	if err != nil {
		return configError(err)
	}
	if messageMount != nil {
		mounts = append(mounts, messageMount)
	}
	cfg, err := m.buildContainerConfig(pod, c, containerParams{
		restartCount: restartCount, init: r.init, podIP: r.podIP, imageRef: imageRef, mounts: mounts, env: env,
	}, r.objects)
	if err != nil {
		r.events.Event(pod, v1.EventTypeWarning, "Failed", fmt.Sprintf("Error: %v", err))
		return fail("CreateContainerConfigError", fmt.Errorf("build config of %s: %w", what, err))
	}
	if messageFile != "" {
		cfg.Annotations[AnnotationTerminationFile] = messageFile
	}
	id, err := svc.runtime.CreateContainer(ctx, r.sandboxID, cfg, r.sandbox)
	if err != nil {
		r.events.Event(pod, v1.EventTypeWarning, "Failed", fmt.Sprintf("Error: %v", err))
		return fail("CreateContainerError", fmt.Errorf("create %s: %w", what, err))
	}
	r.events.Event(pod, v1.EventTypeNormal, "Created", "Created container "+c.Name)
	// cri.after-create-container: a container is created, not started.
	faultpoint.Hit("cri.after-create-container")
	clearMark, err := m.markStarting(string(pod.UID), id)
	if err != nil {
		return fail("RunContainerError", fmt.Errorf("start %s: %w", what, err))
	}
	err = svc.runtime.StartContainer(ctx, id)
	clearMark()
	if err != nil {
		r.events.Event(pod, v1.EventTypeWarning, "Failed", fmt.Sprintf("Error: %v", err))
		return fail("RunContainerError", fmt.Errorf("start %s: %w", what, err))
	}
	r.events.Event(pod, v1.EventTypeNormal, "Started", "Started container "+c.Name)
	if c.Lifecycle != nil && c.Lifecycle.PostStart != nil {
		hctx, cancel := context.WithTimeout(ctx, maxPostStart)
		err := m.runHook(hctx, svc, id, r.podIP, c.Lifecycle.PostStart, c)
		cancel()
		if err != nil {
			// As the kubelet: the container is killed, and restarted under
			// the restart policy.
			msg := fmt.Sprintf("PostStartHook failed: %v", err)
			r.events.Event(pod, v1.EventTypeWarning, "FailedPostStartHook", "container "+c.Name+": "+msg)
			stopped := ContainerStatus{ID: id, Name: c.Name, Init: r.init, State: ContainerRunning}
			if p, err := preStopAnnotation(c); err == nil {
				stopped.PreStop = parsePreStop(p)
			}
			if err := m.stopWithPreStop(ctx, svc, pod, stopped, r.podIP, gracePeriod(pod, nil), c, r.events); err != nil {
				m.log.Warn().Err(err).Str("pod", pod.Namespace+"/"+pod.Name).Str("container", c.Name).Msg("stopping a container whose postStart hook failed")
			}
			return fail("PostStartHookError", fmt.Errorf("%s: %s", what, msg))
		}
	}
	m.log.Debug().Str("pod", pod.Namespace+"/"+pod.Name).Str("container", c.Name).Int("restartCount", restartCount).Msg("container started")
	return nil
}

// crashLoopBase is the attempt of a container whose exit its crash-loop
// backoff counts from, as the kubelet's doBackOff: the newest exited one
// (statuses are newest first). A container killed in this same sync (a
// failed liveness or startup probe) still runs in status, so the attempt
// before it counts, and repeated probe kills back off as crashes do; a
// first attempt has none and starts at once. Only attempts of c's current
// spec count: the first start of a changed spec replaces a container, it
// does not restart a crashed one, so it is neither held back nor counted.
func crashLoopBase(status *PodStatus, c *v1.Container, init bool) *ContainerStatus {
	if status == nil {
		return nil
	}
	for i := range status.Containers {
		s := &status.Containers[i]
		if s.Name != c.Name || s.Init != init {
			continue
		}
		if OfOlderSpec(c, s) {
			return nil // the current spec has not exited before
		}
		if s.State == ContainerExited {
			return s
		}
	}
	return nil
}

// crashLoopGate asks backoff whether container c may start now: it
// returns the attempt its restart counts from (nil: none), or a
// *BackoffError when it must wait.
func crashLoopGate(pod *v1.Pod, c *v1.Container, init bool, status *PodStatus, backoff RestartBackoff) (*ContainerStatus, *BackoffError) {
	base := crashLoopBase(status, c, init)
	if base == nil || backoff == nil {
		return base, nil
	}
	if wait, d := backoff.InBackoff(BackoffKey(pod, c), base.FinishedAt); wait {
		return base, &BackoffError{Container: c.Name, Wait: d, Delay: backoff.Delay(BackoffKey(pod, c))}
	}
	return base, nil
}

// imageUser is the user the image runs as: a uid, or a name the image
// does not map to one; neither set means root.
func (m *Manager) imageUser(ctx context.Context, svc *services, imageRef string) (*int64, string, error) {
	resp, err := svc.image.ImageStatus(ctx, &runtimeapi.ImageSpec{Image: imageRef}, false)
	if err != nil {
		return nil, "", fmt.Errorf("read the user of image %s: %w", imageRef, err)
	}
	img := resp.GetImage()
	if img == nil {
		return nil, "", fmt.Errorf("read the user of image %s: image not found", imageRef)
	}
	if uid := img.GetUid(); uid != nil {
		v := uid.GetValue()
		return &v, "", nil
	}
	return nil, img.GetUsername(), nil
}

// hostPortErrors reports a refused hostPort on each container declaring
// it, so each container's waiting state names the port.
func hostPortErrors(pod *v1.Pod, err error) error {
	var inUse *HostPortInUseError
	if !errors.As(err, &inUse) {
		return fmt.Errorf("check hostPorts of pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	var errs []error
	for _, c := range pod.Spec.Containers {
		for _, p := range c.Ports {
			proto := string(p.Protocol)
			if proto == "" {
				proto = string(v1.ProtocolTCP)
			}
			if p.HostPort == inUse.Port && proto == inUse.Protocol {
				errs = append(errs, &ContainerError{Container: c.Name, Reason: "CreateContainerConfigError",
					Err: fmt.Errorf("container %s of pod %s/%s: %w", c.Name, pod.Namespace, pod.Name, err)})
			}
		}
	}
	return joinSyncErrors(errs)
}

// podConfigErrors reports err on every container of the pod (the next to
// run), so each waiting state says why none can start.
func podConfigErrors(pod *v1.Pod, err error) error {
	var errs []error
	for _, list := range [][]v1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for _, c := range list {
			errs = append(errs, &ContainerError{Container: c.Name, Reason: "CreateContainerConfigError", Err: err})
		}
	}
	return joinSyncErrors(errs)
}

// stopContainer stops one container, giving it grace seconds after SIGTERM
// (the call's deadline grows by as much: see instrumentedRuntime).
func (m *Manager) stopContainer(ctx context.Context, svc *services, id string, grace int64) error {
	if err := svc.runtime.StopContainer(ctx, id, grace); err != nil && !isNotFound(err) {
		return err
	}
	return nil
}

// checkHostUsers refuses a pod that asks for a user namespace: the CRI
// config mqlet sends has none, so its containers would run with the
// host's uids while admission (the Pod Security Standards) relaxed
// runAsNonRoot, runAsUser and procMount for it.
func checkHostUsers(pod *v1.Pod) error {
	if pod.Spec.HostUsers != nil && !*pod.Spec.HostUsers {
		return fmt.Errorf("hostUsers: false is not supported: this node runs no pod in a user namespace: %w", errRefused)
	}
	return nil
}
