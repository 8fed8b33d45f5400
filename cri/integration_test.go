package cri

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"
	v1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/mqlet/mqlet/internal/liveperiod"
	"github.com/mqlet/mqlet/internal/testutil/containerd"
)

// fixedBackoff makes every restart wait delay after the last exit.
type fixedBackoff struct {
	delay time.Duration
	mu    sync.Mutex
	nexts int
}

func (b *fixedBackoff) InBackoff(_ string, finishedAt time.Time) (bool, time.Duration) {
	if wait := time.Until(finishedAt.Add(b.delay)); wait > 0 {
		return true, wait
	}
	return false, 0
}

func (b *fixedBackoff) Delay(string) time.Duration { return b.delay }

func (b *fixedBackoff) Next(string, time.Time) {
	b.mu.Lock()
	b.nexts++
	b.mu.Unlock()
}

type recorder struct {
	mu     sync.Mutex
	events []string
}

func (r *recorder) Event(_ *v1.Pod, _, reason, message string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, reason+": "+message)
}

func (r *recorder) count(reason string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, e := range r.events {
		if strings.HasPrefix(e, reason+":") {
			n++
		}
	}
	return n
}

type env struct {
	t       *testing.T
	m       *Manager
	ctx     context.Context
	backoff *fixedBackoff
	events  *recorder
	objects fakeObjects
}

func newEnv(t *testing.T) *env { t.Helper(); return newEnvConfig(t, func(*Config) {}) }

// newEnvConfig is newEnv with the manager's config changed by tweak.
func newEnvConfig(t *testing.T, tweak func(*Config)) *env {
	t.Helper()
	endpoint := containerd.Endpoint(t)
	dir := t.TempDir()
	cfg := Config{
		Endpoint: endpoint, ExitEvents: true, PodLogDir: filepath.Join(dir, "logs"), PodDir: filepath.Join(dir, "pods"),
		RuntimeRetryMin: 50 * time.Millisecond, RuntimeRetryMax: 200 * time.Millisecond, HealthInterval: 200 * time.Millisecond,
		RequestTimeout: 30 * time.Second,
	}
	tweak(&cfg)
	m := NewManager(cfg, zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.InfoLevel))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); m.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	e := &env{t: t, m: m, ctx: ctx, backoff: &fixedBackoff{delay: time.Second}, events: &recorder{},
		objects: fakeObjects{configMaps: map[string]*v1.ConfigMap{}, secrets: map[string]*v1.Secret{}}}
	e.waitReady(true, 10*time.Second)
	return e
}

func (e *env) waitReady(want bool, timeout time.Duration) {
	e.t.Helper()
	deadline := time.After(timeout)
	for {
		changes := e.m.Changes()
		if e.m.Ready() == want {
			return
		}
		select {
		case <-changes:
		case <-deadline:
			e.t.Fatalf("runtime Ready() did not become %v within %s", want, timeout)
		}
	}
}

// newPod returns a unique pod that is killed when the test ends.
func (e *env) newPod(policy v1.RestartPolicy, containers ...v1.Container) *v1.Pod {
	e.t.Helper()
	id := strconv.FormatInt(time.Now().UnixNano(), 36)
	pod := &v1.Pod{}
	pod.Name = "t-" + strings.ToLower(strings.NewReplacer("/", "-", "_", "-").Replace(e.t.Name()))
	if len(pod.Name) > 40 {
		pod.Name = pod.Name[:40]
	}
	pod.Name = strings.TrimRight(pod.Name, "-") + "-" + id
	pod.Namespace = "rt-test"
	pod.UID = newTestUID()
	grace := int64(1)
	pod.Spec.TerminationGracePeriodSeconds = &grace
	pod.Spec.RestartPolicy = policy
	pod.Spec.DNSPolicy = v1.DNSDefault
	for i := range containers {
		if containers[i].Image == "" {
			containers[i].Image = containerd.BusyboxImage
		}
		containers[i].ImagePullPolicy = v1.PullNever
	}
	pod.Spec.Containers = containers
	e.t.Cleanup(func() {
		if err := e.m.KillPod(context.Background(), pod, nil); err != nil {
			e.t.Errorf("cleanup: %v", err)
		}
	})
	return pod
}

func (e *env) status(pod *v1.Pod) *PodStatus {
	e.t.Helper()
	st, err := e.m.GetPodStatus(e.ctx, string(pod.UID), pod.Name, pod.Namespace)
	if err != nil {
		e.t.Fatalf("GetPodStatus: %v", err)
	}
	return st
}

// sync runs one SyncPod on a fresh status and returns its error.
func (e *env) sync(pod *v1.Pod) error {
	return e.m.SyncPod(e.ctx, SyncInput{Pod: pod, Status: e.status(pod), Objects: e.objects, Backoff: e.backoff, Events: e.events})
}

// waitStatus polls the status (without syncing) until cond holds.
func (e *env) waitStatus(pod *v1.Pod, timeout time.Duration, what string, cond func(*PodStatus) bool) *PodStatus {
	e.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		st := e.status(pod)
		if cond(st) {
			return st
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("%s: not reached within %s; status %+v", what, timeout, st)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// syncUntil syncs every 100ms until cond holds; backoff errors are expected.
func (e *env) syncUntil(pod *v1.Pod, timeout time.Duration, what string, cond func(*PodStatus) bool) *PodStatus {
	e.t.Helper()
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		if err := e.sync(pod); err != nil && !errors.Is(err, ErrCrashLoopBackOff) {
			e.t.Fatalf("SyncPod: %v", err)
		}
		st := e.status(pod)
		if cond(st) {
			return st
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("%s: not reached within %s; status %+v; events %v", what, timeout, st, e.events.events)
		}
		<-tick.C
	}
}

// waitLogged polls the log of the running container until it holds text.
func (e *env) waitLogged(pod *v1.Pod, container, text string, timeout time.Duration) {
	e.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		var out bytes.Buffer
		err := e.m.ContainerLogs(e.ctx, LogRequest{Pod: PodKey{UID: string(pod.UID), Name: pod.Name, Namespace: pod.Namespace}, Container: container}, &out)
		if err == nil && strings.Contains(out.String(), text) {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("log of %s: no %q within %s (%q, %v)", container, text, timeout, out.String(), err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func latest(st *PodStatus, name string) *ContainerStatus {
	for i := range st.Containers {
		if st.Containers[i].Name == name {
			return &st.Containers[i]
		}
	}
	return nil
}

func isRunning(name string) func(*PodStatus) bool {
	return func(st *PodStatus) bool {
		c := latest(st, name)
		return c != nil && c.State == ContainerRunning
	}
}

func sleeper(name string) v1.Container {
	return v1.Container{Name: name, Command: []string{"sleep", "3600"}}
}

func TestPodLifecycle(t *testing.T) {
	e := newEnv(t)
	pod := e.newPod(v1.RestartPolicyAlways, sleeper("main"))
	st := e.syncUntil(pod, 30*time.Second, "container running", isRunning("main"))
	if len(st.Sandboxes) != 1 || !st.Sandboxes[0].Ready || st.Sandboxes[0].IP == "" {
		t.Fatalf("sandbox %+v, want one ready with an IP", st.Sandboxes)
	}
	first := latest(st, "main")
	if first.SpecHash != HashContainer(&pod.Spec.Containers[0]) || first.RestartCount != 0 {
		t.Fatalf("container %+v", first)
	}
	logDir, err := e.m.podLogDir(pod.Namespace, pod.Name, string(pod.UID))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(logDir, "main", "0.log")); err != nil {
		t.Fatalf("log file of attempt 0: %v", err)
	}
	refs, err := e.m.ListPods(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, r := range refs {
		if r.UID == string(pod.UID) && r.Name == pod.Name && r.Namespace == pod.Namespace {
			found = true
			// The listing also names the running containers (metrics use it).
			if len(r.Running) != 1 || r.Running[first.ID] != "main" {
				t.Fatalf("ListPods running containers %v, want %s: main", r.Running, first.ID)
			}
		}
	}
	if !found {
		t.Fatalf("ListPods %v lacks %s", refs, pod.UID)
	}

	// An identical re-sync restarts nothing.
	created := e.events.count("Created")
	if err := e.sync(pod); err != nil {
		t.Fatal(err)
	}
	if st := e.status(pod); len(st.Containers) != 1 || st.Containers[0].ID != first.ID || e.events.count("Created") != created {
		t.Fatalf("identical sync changed something: %+v", st.Containers)
	}

	// A spec change replaces the container.
	pod.Spec.Containers[0].Args = []string{"sleep", "3601"}
	pod.Spec.Containers[0].Command = nil
	st = e.syncUntil(pod, 30*time.Second, "replaced container running", func(st *PodStatus) bool {
		c := latest(st, "main")
		return c != nil && c.ID != first.ID && c.State == ContainerRunning
	})
	if c := latest(st, "main"); c.RestartCount != 1 || c.SpecHash != HashContainer(&pod.Spec.Containers[0]) {
		t.Fatalf("replacement %+v", c)
	}
	for _, c := range st.Containers {
		if c.ID == first.ID && c.State != ContainerExited {
			t.Fatalf("old container still %s", c.State)
		}
	}
	if st.Sandboxes[0].Attempt != 0 || len(st.Sandboxes) != 1 {
		t.Fatalf("container change touched the sandbox: %+v", st.Sandboxes)
	}

	// KillPod removes everything, the pod's cgroup too.
	if dirs := e.m.podCgroupDirs(string(pod.UID)); len(dirs) == 0 {
		t.Fatal("a running pod has no cgroup directories")
	}
	if err := e.m.KillPod(e.ctx, pod, nil); err != nil {
		t.Fatal(err)
	}
	if dirs := e.m.podCgroupDirs(string(pod.UID)); len(dirs) != 0 {
		t.Fatalf("pod cgroups survived KillPod: %v", dirs)
	}
	if st := e.status(pod); len(st.Sandboxes) != 0 || len(st.Containers) != 0 {
		t.Fatalf("after KillPod: %+v", st)
	}
	for _, dir := range []string{logDir, filepath.Join(e.m.cfg.PodDir, string(pod.UID))} {
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Fatalf("%s survived KillPod: %v", dir, err)
		}
	}
}

func TestSandboxSpecChangeRecreatesPod(t *testing.T) {
	e := newEnv(t)
	pod := e.newPod(v1.RestartPolicyAlways, sleeper("main"))
	e.syncUntil(pod, 30*time.Second, "running", isRunning("main"))
	pod.Spec.HostNetwork = true
	st := e.syncUntil(pod, 30*time.Second, "running in new sandbox", func(st *PodStatus) bool {
		return len(st.Sandboxes) > 0 && st.Sandboxes[0].Attempt == 1 && st.Sandboxes[0].Ready && isRunning("main")(st)
	})
	if len(st.Sandboxes) != 2 || st.Sandboxes[1].Ready {
		t.Fatalf("sandboxes %+v, want the old one stopped", st.Sandboxes)
	}
}

func TestRestartPolicies(t *testing.T) {
	e := newEnv(t)
	// Long enough that the sync right after the exit is still inside it on
	// a busy machine.
	e.backoff.delay = 5 * time.Second
	exitWith := func(code int) v1.Container {
		return v1.Container{Name: "job", Command: []string{"sh", "-c", fmt.Sprintf("sleep 0.2; exit %d", code)}}
	}
	exitedOnce := func(st *PodStatus) bool {
		c := latest(st, "job")
		return c != nil && c.State == ContainerExited
	}
	cases := []struct {
		policy  v1.RestartPolicy
		code    int
		restart bool
	}{
		{v1.RestartPolicyAlways, 1, true},
		{v1.RestartPolicyNever, 1, false},
		{v1.RestartPolicyOnFailure, 0, false},
		{v1.RestartPolicyOnFailure, 1, true},
	}
	for _, tc := range cases {
		t.Run(fmt.Sprintf("%s-exit%d", tc.policy, tc.code), func(t *testing.T) {
			e.t = t
			pod := e.newPod(tc.policy, exitWith(tc.code))
			st := e.syncUntil(pod, 30*time.Second, "first exit", exitedOnce)
			if c := latest(st, "job"); c.ExitCode != int32(tc.code) {
				t.Fatalf("exit code %d, want %d", c.ExitCode, tc.code)
			}
			err := e.sync(pod)
			if !tc.restart {
				if err != nil {
					t.Fatal(err)
				}
				st := e.status(pod)
				if len(st.Containers) != 1 || st.Sandboxes[0].Ready {
					t.Fatalf("finished pod: containers %d, sandbox ready %v; want 1 and stopped", len(st.Containers), st.Sandboxes[0].Ready)
				}
				return
			}
			var be *BackoffError
			if !errors.As(err, &be) || be.Container != "job" || !errors.Is(err, ErrCrashLoopBackOff) {
				t.Fatalf("sync right after exit: %v, want a BackoffError", err)
			}
			e.syncUntil(pod, 30*time.Second, "restarted", func(st *PodStatus) bool {
				c := latest(st, "job")
				return c != nil && c.RestartCount == 1
			})
			if e.events.count("BackOff") == 0 {
				t.Fatal("no BackOff event")
			}
		})
	}
}

func TestInitContainers(t *testing.T) {
	e := newEnv(t)
	t.Run("order", func(t *testing.T) {
		e.t = t
		pod := e.newPod(v1.RestartPolicyAlways, v1.Container{Name: "app", Command: []string{"sh", "-c", "cat /work/order; sleep 3600"},
			VolumeMounts: []v1.VolumeMount{{Name: "work", MountPath: "/work"}}})
		pod.Spec.Volumes = []v1.Volume{{Name: "work", VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}}}
		for _, n := range []string{"one", "two"} {
			pod.Spec.InitContainers = append(pod.Spec.InitContainers, v1.Container{Name: "init-" + n, Image: containerd.BusyboxImage,
				ImagePullPolicy: v1.PullNever, Command: []string{"sh", "-c", "echo " + n + " >> /work/order"},
				VolumeMounts: []v1.VolumeMount{{Name: "work", MountPath: "/work"}}})
		}
		e.syncUntil(pod, 30*time.Second, "app running", isRunning("app"))
		dir, err := e.m.podVolumeDir(string(pod.UID), "kubernetes.io~empty-dir", "work")
		if err != nil {
			t.Fatal(err)
		}
		data, err := os.ReadFile(filepath.Join(dir, "order"))
		if err != nil || string(data) != "one\ntwo\n" {
			t.Fatalf("init order file %q (%v), want one then two", data, err)
		}
	})
	for _, policy := range []v1.RestartPolicy{v1.RestartPolicyAlways, v1.RestartPolicyNever} {
		t.Run("failing-"+string(policy), func(t *testing.T) {
			e.t = t
			pod := e.newPod(policy, sleeper("app"))
			pod.Spec.InitContainers = []v1.Container{{Name: "init", Image: containerd.BusyboxImage, ImagePullPolicy: v1.PullNever, Command: []string{"sh", "-c", "exit 2"}}}
			e.syncUntil(pod, 30*time.Second, "init failed", func(st *PodStatus) bool {
				c := latest(st, "init")
				return c != nil && c.State == ContainerExited
			})
			if policy == v1.RestartPolicyAlways {
				e.syncUntil(pod, 30*time.Second, "init restarted", func(st *PodStatus) bool {
					c := latest(st, "init")
					return c != nil && c.RestartCount >= 1 && c.State == ContainerExited
				})
			} else if err := e.sync(pod); err != nil {
				t.Fatal(err)
			}
			st := e.status(pod)
			if latest(st, "app") != nil {
				t.Fatalf("app container created although init failed: %+v", st.Containers)
			}
			if policy == v1.RestartPolicyNever && (st.Sandboxes[0].Ready || latest(st, "init").RestartCount != 0) {
				t.Fatalf("failed Never pod: sandbox ready %v, init restarts %d", st.Sandboxes[0].Ready, latest(st, "init").RestartCount)
			}
		})
	}
}

func TestImageNeverPullMissing(t *testing.T) {
	e := newEnv(t)
	pod := e.newPod(v1.RestartPolicyAlways, v1.Container{Name: "x", Image: "docker.io/mqlet/absent:none", Command: []string{"true"}})
	err := e.sync(pod)
	if !errors.Is(err, ErrImageNeverPull) {
		t.Fatalf("sync: %v, want ErrImageNeverPull", err)
	}
}

func TestForeignSandboxUntouched(t *testing.T) {
	e := newEnv(t)
	svc, err := e.m.conn.get()
	if err != nil {
		t.Fatal(err)
	}
	name := "foreign-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	cfg := &runtimeapi.PodSandboxConfig{
		Metadata:     &runtimeapi.PodSandboxMetadata{Name: name, Uid: name, Namespace: "other-client"},
		Labels:       map[string]string{LabelPodUID: name, LabelPodName: name, LabelPodNamespace: "other-client"},
		LogDirectory: t.TempDir(),
		Linux:        &runtimeapi.LinuxPodSandboxConfig{CgroupParent: "/other/pod" + name},
	}
	id, err := svc.runtime.RunPodSandbox(quietContext(e.ctx), cfg, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := quietContext(context.Background())
		_ = svc.runtime.StopPodSandbox(ctx, id)
		_ = svc.runtime.RemovePodSandbox(ctx, id)
	})
	refs, err := e.m.ListPods(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range refs {
		if r.UID == name {
			t.Fatalf("ListPods returned a foreign sandbox: %v", r)
		}
	}
	if err := e.m.GarbageCollect(e.ctx, GCPolicy{}, func(string) bool { return false }); err != nil {
		t.Fatal(err)
	}
	resp, err := svc.runtime.PodSandboxStatus(quietContext(e.ctx), id, false)
	if err != nil || resp.GetStatus().GetState() != runtimeapi.PodSandboxState_SANDBOX_READY {
		t.Fatalf("foreign sandbox after GC: %v %v", resp.GetStatus().GetState(), err)
	}
}

func TestGarbageCollect(t *testing.T) {
	e := newEnv(t)
	kept := e.newPod(v1.RestartPolicyAlways, v1.Container{Name: "job", Command: []string{"sh", "-c", "exit 1"}})
	e.backoff.delay = 0
	// Three attempts made, then no more syncs: the last exits and stays so
	// (sampling "exited" between syncs that restart at once loses the race
	// on a busy machine).
	e.syncUntil(kept, 30*time.Second, "three attempts", func(st *PodStatus) bool {
		c := latest(st, "job")
		return c != nil && c.RestartCount >= 2
	})
	e.waitStatus(kept, 30*time.Second, "last attempt exited", func(st *PodStatus) bool {
		c := latest(st, "job")
		return c != nil && c.State == ContainerExited
	})
	gone := e.newPod(v1.RestartPolicyNever, v1.Container{Name: "main", Command: []string{"true"}})
	e.syncUntil(gone, 30*time.Second, "exited", func(st *PodStatus) bool {
		c := latest(st, "main")
		return c != nil && c.State == ContainerExited
	})
	// An undesired pod still running is the pod worker's to stop with its
	// grace period: GC leaves it alone.
	running := e.newPod(v1.RestartPolicyAlways, sleeper("main"))
	e.syncUntil(running, 30*time.Second, "running", isRunning("main"))
	desired := func(uid string) bool { return uid == string(kept.UID) }
	// Only UUID-named children of the pods and logs directories are GC's.
	foreign := []string{filepath.Join(e.m.cfg.PodDir, "not-a-uuid"), filepath.Join(e.m.cfg.PodLogDir, "ns_name_not-a-uuid")}
	for _, dir := range foreign {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.m.GarbageCollect(e.ctx, GCPolicy{MaxPerPodContainer: 1}, desired); err != nil {
		t.Fatal(err)
	}
	if st := e.status(kept); len(st.Containers) != 1 || len(st.Sandboxes) != 1 {
		t.Fatalf("kept pod after GC: %d containers %d sandboxes, want 1 and 1", len(st.Containers), len(st.Sandboxes))
	}
	if st := e.status(gone); len(st.Sandboxes) != 0 || len(st.Containers) != 0 {
		t.Fatalf("undesired pod after GC: %+v", st)
	}
	if _, err := os.Stat(filepath.Join(e.m.cfg.PodDir, string(gone.UID))); !os.IsNotExist(err) {
		t.Fatalf("pod dir of undesired pod survived GC: %v", err)
	}
	for _, dir := range foreign {
		if _, err := os.Stat(dir); err != nil {
			t.Fatalf("GC removed %s, which is not named by a pod uid: %v", dir, err)
		}
	}
	if st := e.status(running); !isRunning("main")(st) || len(st.Sandboxes) != 1 {
		t.Fatalf("GC stopped a running undesired pod: %+v", st)
	}
	// Image GC never takes the sandbox image, which an offline node could
	// not pull again.
	svc, err := e.m.conn.get()
	if err != nil {
		t.Fatal(err)
	}
	if got := e.m.sandboxImage(e.ctx, svc); NormalizeImage(got) != containerd.PauseImage {
		t.Fatalf("sandbox image reported as %q, want %s", got, containerd.PauseImage)
	}
}

// A pod being killed with a long grace period is not GC's to finish: the
// garbage collector must not remove its sandbox (which kills at once) nor
// its directories while the kill waits.
func TestGarbageCollectNeverCutsATerminationShort(t *testing.T) {
	e := newEnv(t)
	// The container ignores SIGTERM, so only the grace period ends it.
	pod := e.newPod(v1.RestartPolicyAlways, v1.Container{Name: "main", Command: []string{"sh", "-c", "trap '' TERM; while true; do sleep 1; done"}})
	grace := int64(120)
	pod.Spec.TerminationGracePeriodSeconds = &grace
	e.syncUntil(pod, 30*time.Second, "running", isRunning("main"))
	killCtx, cancelKill := context.WithCancel(e.ctx)
	killed := make(chan error, 1)
	go func() { killed <- e.m.KillPod(killCtx, pod, nil) }()
	defer func() {
		cancelKill()
		<-killed
		zero := int64(0)
		_ = e.m.KillPod(context.Background(), pod, &zero)
	}()
	deadline := time.Now().Add(10 * time.Second)
	for !e.m.terminating.active(string(pod.UID)) {
		if time.Now().After(deadline) {
			t.Fatal("the kill never registered as terminating")
		}
		time.Sleep(10 * time.Millisecond)
	}
	notDesired := func(string) bool { return false }
	for range 3 {
		if err := e.m.GarbageCollect(e.ctx, GCPolicy{MaxPerPodContainer: 0}, notDesired); err != nil {
			t.Fatal(err)
		}
	}
	st := e.status(pod)
	if !isRunning("main")(st) || len(st.Sandboxes) != 1 || !st.Sandboxes[0].Ready {
		t.Fatalf("GC cut the termination short: %+v", st)
	}
	if _, err := os.Stat(filepath.Join(e.m.cfg.PodDir, string(pod.UID))); err != nil {
		t.Fatalf("GC removed the pod directory of a terminating pod: %v", err)
	}
	select {
	case err := <-killed:
		t.Fatalf("the kill ended within its grace period: %v", err)
	default:
	}
}

func TestPLEG(t *testing.T) {
	e := newEnv(t)
	events := make(chan PodLifecycleEvent, 256)
	ctx, cancel := context.WithCancel(e.ctx)
	done := make(chan struct{})
	go func() { defer close(done); e.m.RunPLEG(ctx, liveperiod.Fixed(100*time.Millisecond), events) }()
	t.Cleanup(func() { cancel(); <-done })

	pod := e.newPod(v1.RestartPolicyNever, v1.Container{Name: "job", Command: []string{"sh", "-c", "sleep 1; exit 3"}})
	if err := e.sync(pod); err != nil {
		t.Fatal(err)
	}
	seen := map[PodLifecycleEventType]bool{}
	deadline := time.After(20 * time.Second)
	for !seen[ContainerStarted] || !seen[ContainerDied] {
		select {
		case ev := <-events:
			if ev.PodUID == string(pod.UID) {
				seen[ev.Type] = true
			}
		case <-deadline:
			t.Fatalf("PLEG events for the pod: %v, want ContainerStarted and ContainerDied", seen)
		}
	}
}

// A container's exit is reported at containerd's task exit event, not at
// the next relist: with a relist period of a minute, ContainerDied comes
// within seconds of the exit, and an exec in the container (what a probe
// runs) makes no early relist of its own.
func TestPLEGExitIsSeenAtTheTaskExitEvent(t *testing.T) {
	e := newEnv(t)
	events := make(chan PodLifecycleEvent, 256)
	ctx, cancel := context.WithCancel(e.ctx)
	done := make(chan struct{})
	go func() { defer close(done); e.m.RunPLEG(ctx, liveperiod.Fixed(time.Minute), events) }()
	t.Cleanup(func() { cancel(); <-done })

	pod := e.newPod(v1.RestartPolicyNever, v1.Container{Name: "job", Command: []string{"sh", "-c", "trap 'exit 0' TERM; touch /tmp/go; while [ -e /tmp/go ]; do sleep 0.1; done; exit 3"}})
	if err := e.sync(pod); err != nil {
		t.Fatal(err)
	}
	running := e.waitStatus(pod, 20*time.Second, "job running", isRunning("job"))
	id := latest(running, "job").ID
	// The first relist (at the start) may come before the container runs;
	// its start is then seen at the next relist, a minute on. An exec's
	// exit is no container's: nothing may be reported for it.
	if _, _, _, err := e.m.ExecSync(e.ctx, id, []string{"true"}, 10*time.Second); err != nil {
		t.Fatalf("exec in the container: %v", err)
	}
	quiet := time.After(500 * time.Millisecond)
	for waiting := true; waiting; {
		select {
		case ev := <-events:
			if ev.PodUID == string(pod.UID) && ev.Type == ContainerDied {
				t.Fatalf("ContainerDied reported after an exec: %+v", ev)
			}
		case <-quiet:
			waiting = false
		}
	}
	if _, _, _, err := e.m.ExecSync(e.ctx, id, []string{"rm", "/tmp/go"}, 10*time.Second); err != nil {
		t.Fatalf("exec in the container: %v", err)
	}
	told := time.Now()
	deadline := time.After(10 * time.Second)
wait:
	for {
		select {
		case ev := <-events:
			if ev.PodUID == string(pod.UID) && ev.Type == ContainerDied && ev.ContainerID == id {
				t.Logf("ContainerDied %v after the container was told to exit", time.Since(told).Round(time.Millisecond))
				break wait
			}
		case <-deadline:
			t.Fatal("no ContainerDied within 10 s of the exit with a relist period of a minute")
		}
	}
	// A container removed behind mqlet's back is seen at containerd's
	// container delete event, not a minute on.
	svc, err := e.m.conn.get()
	if err != nil {
		t.Fatal(err)
	}
	if err := svc.runtime.RemoveContainer(e.ctx, id); err != nil {
		t.Fatalf("remove the exited container: %v", err)
	}
	removed := time.Now()
	deadline = time.After(10 * time.Second)
	for {
		select {
		case ev := <-events:
			if ev.PodUID == string(pod.UID) && ev.Type == ContainerRemoved && ev.ContainerID == id {
				t.Logf("ContainerRemoved %v after the removal", time.Since(removed).Round(time.Millisecond))
				return
			}
		case <-deadline:
			t.Fatal("no ContainerRemoved within 10 s of the removal with a relist period of a minute")
		}
	}
}

// TestRecoversAfterRuntimeRestart stops the test containerd (the process in
// its PID file) and starts it again with test/env/containerd-up.sh.
func TestRecoversAfterRuntimeRestart(t *testing.T) {
	e := newEnv(t)
	dir := filepath.Dir(strings.TrimPrefix(e.m.cfg.Endpoint, "unix://"))
	pidData, err := os.ReadFile(filepath.Join(dir, "containerd.pid"))
	if err != nil {
		t.Fatalf("read PID file of the test containerd (started by test/env/containerd-up.sh): %v", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(pidData)))
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		t.Fatalf("stop containerd %d: %v", pid, err)
	}
	e.waitReady(false, 20*time.Second)
	if _, err := e.m.ListPods(e.ctx); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("ListPods while down: %v, want ErrUnavailable", err)
	}
	script, _ := filepath.Abs("../test/env/containerd-up.sh")
	cmd := exec.CommandContext(e.ctx, script)
	cmd.Env = append(os.Environ(), "MQLET_TEST_DIR="+dir)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("restart containerd: %v\n%s", err, out)
	}
	e.waitReady(true, 30*time.Second)
	if _, err := e.m.ListPods(e.ctx); err != nil {
		t.Fatalf("ListPods after restart: %v", err)
	}
	if name, version := e.m.RuntimeInfo(); name != "containerd" || version == "" {
		t.Fatalf("RuntimeInfo %q %q", name, version)
	}
}

func TestContainerFilesystems(t *testing.T) {
	e := newEnv(t)
	pod := e.newPod(v1.RestartPolicyAlways, v1.Container{Name: "writer",
		Command: []string{"sh", "-c", "echo hello from the writer; dd if=/dev/zero of=/tmp/blob bs=1k count=256 2>/dev/null; sleep 3600"}})
	st := e.syncUntil(pod, 30*time.Second, "container running", isRunning("writer"))
	id := latest(st, "writer").ID
	deadline := time.Now().Add(20 * time.Second)
	var use ContainerFs
	for {
		all, err := e.m.ContainerFilesystems(e.ctx)
		if err != nil {
			t.Fatal(err)
		}
		use = all[id]
		if use.LogsUsedBytes > 0 && use.RootfsUsedBytes >= 256<<10 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("disk use of the writer never showed its log and its 256 KiB file: %+v", use)
		}
		<-time.After(200 * time.Millisecond) // polling the runtime with a deadline
	}
	if !strings.HasSuffix(use.LogsDir, "/writer") || use.RootfsMount == "" {
		t.Fatalf("locations not reported: %+v", use)
	}
}

// A failed liveness result kills the running container and starts the next
// attempt in the same sync (restartPolicy Always), on a real runtime; the
// new attempt has a new ID, so the old result no longer touches it.
func TestLivenessFailureRestartsContainer(t *testing.T) {
	e := newEnv(t)
	c := sleeper("main")
	c.LivenessProbe = &v1.Probe{ProbeHandler: v1.ProbeHandler{Exec: &v1.ExecAction{Command: []string{"true"}}}}
	pod := e.newPod(v1.RestartPolicyAlways, c)
	st := e.syncUntil(pod, 30*time.Second, "running", isRunning("main"))
	first := latest(st, "main")

	probes := ProbeResultMap{{ContainerID: first.ID, Probe: ProbeLiveness}: ProbeFailure}
	if err := e.m.SyncPod(e.ctx, SyncInput{Pod: pod, Status: st, Probes: probes, Objects: e.objects, Backoff: e.backoff, Events: e.events}); err != nil {
		t.Fatalf("sync with a failed liveness probe: %v", err)
	}
	st = e.status(pod)
	now := latest(st, "main")
	if now == nil || now.ID == first.ID || now.RestartCount != 1 || now.State != ContainerRunning {
		t.Fatalf("after the liveness failure: %+v, want a new running attempt with restartCount 1", now)
	}
	var old *ContainerStatus
	for i := range st.Containers {
		if st.Containers[i].ID == first.ID {
			old = &st.Containers[i]
		}
	}
	if old == nil || old.State != ContainerExited {
		t.Fatalf("the failed attempt is %+v, want exited", old)
	}
	if e.events.count("Killing") != 1 || !slices.Contains(e.events.events, "Killing: Stopping container main: container main failed liveness probe, will be restarted") {
		t.Fatalf("Killing events: %d, want 1 saying the liveness probe failed (events %v)", e.events.count("Killing"), e.events.events)
	}
	// The stale result names the old ID only: the next sync keeps the new attempt.
	if err := e.m.SyncPod(e.ctx, SyncInput{Pod: pod, Status: st, Probes: probes, Objects: e.objects, Backoff: e.backoff, Events: e.events}); err != nil {
		t.Fatal(err)
	}
	if again := latest(e.status(pod), "main"); again.ID != now.ID || again.State != ContainerRunning {
		t.Fatalf("a stale result restarted the new attempt: %+v", again)
	}
}

// Sidecars start in order before the app and are stopped after it, the
// later sidecar first; a pod known only by its runtime labels (a delete)
// keeps that order.
func TestSidecarsStartInOrderAndStopAfterApps(t *testing.T) {
	e := newEnv(t)
	for _, byRef := range []bool{false, true} {
		t.Run(fmt.Sprintf("byRef=%v", byRef), func(t *testing.T) {
			e.t = t
			// The app takes 2 s to stop; each sidecar stops at once.
			// Each says "trapped" once its TERM handler is set: a TERM before
			// it would be dropped (the shell is its container's PID 1) and
			// the runtime would kill at the end of the grace period.
			pod := e.newPod(v1.RestartPolicyAlways, v1.Container{Name: "app", Command: []string{"sh", "-c", "trap 'sleep 2; exit 0' TERM; echo trapped; while true; do sleep 0.2; done"}})
			grace := int64(10)
			pod.Spec.TerminationGracePeriodSeconds = &grace
			always := v1.ContainerRestartPolicyAlways
			for _, n := range []string{"s1", "s2"} {
				pod.Spec.InitContainers = append(pod.Spec.InitContainers, v1.Container{Name: n, Image: containerd.BusyboxImage,
					ImagePullPolicy: v1.PullNever, RestartPolicy: &always, Command: []string{"sh", "-c", "trap 'exit 0' TERM; echo trapped; while true; do sleep 0.2; done"}})
			}
			st := e.syncUntil(pod, 30*time.Second, "app running", isRunning("app"))
			for _, c := range []string{"s1", "s2", "app"} {
				e.waitLogged(pod, c, "trapped", 30*time.Second)
			}
			s1, s2, app := latest(st, "s1"), latest(st, "s2"), latest(st, "app")
			if s1 == nil || s2 == nil || s1.State != ContainerRunning || s2.State != ContainerRunning || s1.Sidecar != 1 || s2.Sidecar != 2 {
				t.Fatalf("sidecars %+v %+v, want both running, recorded as sidecars 1 and 2", s1, s2)
			}
			if app == nil {
				t.Fatalf("app has no status though it was reported running")
			}
			if s2.StartedAt.Before(s1.StartedAt) || app.StartedAt.Before(s2.StartedAt) {
				t.Fatalf("started s1 %v, s2 %v, app %v: want in that order", s1.StartedAt, s2.StartedAt, app.StartedAt)
			}
			svc, err := e.m.conn.get()
			if err != nil {
				t.Fatal(err)
			}
			stopFor := pod
			if byRef {
				stopFor = &v1.Pod{}
				stopFor.Name, stopFor.Namespace, stopFor.UID = pod.Name, pod.Namespace, pod.UID
			}
			stopBegan := time.Now()
			if err := e.m.stopPod(context.Background(), svc, stopFor, st, nil, noEvents{}); err != nil {
				t.Fatal(err)
			}
			st = e.status(pod)
			s1, s2, app = latest(st, "s1"), latest(st, "s2"), latest(st, "app")
			for i, c := range []*ContainerStatus{s1, s2, app} {
				if c == nil {
					t.Fatalf("container %s has no status after the pod was stopped", []string{"s1", "s2", "app"}[i])
				}
				if c.State != ContainerExited || c.ExitCode != 0 {
					// Everything known, so a failure under load says whether
					// the stop ran out of grace or the attempt was another one.
					t.Fatalf("%s: %s exit %d, want stopped by its own TERM handler (reason %q, attempt %d, recorded grace %v, started %v, finished %v after the stop began, stop took %v, all: %+v)",
						c.Name, c.State, c.ExitCode, c.Reason, c.RestartCount, ptrValue(c.GracePeriod), c.StartedAt, c.FinishedAt.Sub(stopBegan), time.Since(stopBegan), st.Containers)
				}
			}
			if s2.FinishedAt.Before(app.FinishedAt) || s1.FinishedAt.Before(s2.FinishedAt) {
				t.Fatalf("finished app %v, s2 %v, s1 %v: want in that order", app.FinishedAt, s2.FinishedAt, s1.FinishedAt)
			}
			t.Logf("app stopped %v before s2, s2 %v before s1", s2.FinishedAt.Sub(app.FinishedAt), s1.FinishedAt.Sub(s2.FinishedAt))
		})
	}
}

// ptrValue is *p, or "nil".
func ptrValue(p *int64) string {
	if p == nil {
		return "nil"
	}
	return strconv.FormatInt(*p, 10)
}
