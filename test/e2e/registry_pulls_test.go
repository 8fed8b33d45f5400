package e2e

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	criclient "k8s.io/cri-client/pkg"

	"github.com/mqlet/mqlet/internal/testutil/containerd"
)

// Short pull backoffs, so growing delays show within a test; the test
// registries are on loopback, which only an explicit allow list admits.
const pullTestConfig = `images:
  pullBackoffBase: 2s
  pullBackoffMax: 8s
` + allowLocalRegistries

// regPod is a pod running image under pull policy with the given pull secrets.
func regPod(name, namespace, image, policy string, secrets ...string) string {
	var refs []string
	for _, s := range secrets {
		refs = append(refs, fmt.Sprintf(`{"name":%q}`, s))
	}
	return fmt.Sprintf(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":%q,"namespace":%q},"spec":{
	  "terminationGracePeriodSeconds":1,"imagePullSecrets":[%s],
	  "containers":[{"name":"main","image":%q,"imagePullPolicy":%q,"command":["sh","-c","sleep 3600"]}]}}`,
		name, namespace, strings.Join(refs, ","), image, policy)
}

func dockerConfigJSON(server, user, pass string) string {
	b, _ := json.Marshal(map[string]any{"auths": map[string]any{server: map[string]string{"username": user, "password": pass}}})
	return string(b)
}

func list(items ...string) []byte {
	return []byte(`{"apiVersion":"v1","kind":"List","items":[` + strings.Join(items, ",") + `]}`)
}

// waitingOf returns the waiting reason and message of the pod's container main.
func waitingOf(p *v1.Pod) (string, string) {
	cs, ok := containerStatus(p, "main", false)
	if !ok || cs.State.Waiting == nil {
		return "", ""
	}
	return cs.State.Waiting.Reason, cs.State.Waiting.Message
}

func (e *podEnv) eventsFor(from int, pod, reason string) []v1.Event {
	var out []v1.Event
	for _, ev := range e.events(from) {
		if ev.InvolvedObject.Name == pod && ev.Reason == reason {
			out = append(out, ev)
		}
	}
	return out
}

// TestRegistryPullSecretAuth: a pod whose image is in the registry with
// htpasswd auth fails at once with the registry's 401 and backs off
// (ImagePullBackOff) without credentials; the secret applied afterwards makes
// it run on the next retry without re-applying the pod. A legacy dockercfg
// secret works too.
func TestRegistryPullSecretAuth(t *testing.T) {
	reg := StartRegistry(t, true)
	image := reg.Push(containerd.BusyboxImage, "private/app:1")
	e := newPodEnv(t, pullTestConfig)
	e.cleanupPods("auth", "legacy")
	mark := e.mq.Mark()

	r := e.apply([]byte(regPod("auth", e.ns, image, "IfNotPresent", "regcred")), "failed", 60*time.Second)
	if !strings.Contains(r.Message, "401 Unauthorized") || !strings.Contains(r.Message, "ErrImagePull") {
		t.Fatalf("apply without credentials: want ErrImagePull with the registry's 401, got %q", r.Message)
	}
	e.waitStatus("auth", 30*time.Second, "in ImagePullBackOff with the 401", func(p *v1.Pod) bool {
		reason, msg := waitingOf(p)
		return reason == "ImagePullBackOff" && strings.Contains(msg, "401 Unauthorized")
	})
	failed := e.eventsFor(mark, "auth", "Failed")
	if len(failed) == 0 || !strings.Contains(failed[0].Message, "401 Unauthorized") {
		t.Fatalf("Failed events %v", failed)
	}
	if len(e.eventsFor(mark, "auth", "BackOff")) == 0 {
		t.Fatal("no BackOff event")
	}
	if len(e.cri.Running(e.ns, "auth")) != 0 {
		t.Fatal("running without credentials")
	}

	secret := fmt.Sprintf(`{"apiVersion":"v1","kind":"Secret","type":"kubernetes.io/dockerconfigjson","metadata":{"name":"regcred","namespace":%q},"stringData":{".dockerconfigjson":%q}}`,
		e.ns, dockerConfigJSON("https://"+reg.Host, reg.User, reg.Pass))
	e.apply(list(secret), "succeeded", 30*time.Second)
	Eventually(t, 30*time.Second, "pod running on the next retry after the secret came", func() bool {
		return len(e.cri.Running(e.ns, "auth")) == 1
	})
	pulled := e.eventsFor(mark, "auth", "Pulled")
	if len(pulled) == 0 || !strings.Contains(pulled[len(pulled)-1].Message, "Image size:") || !strings.Contains(pulled[len(pulled)-1].Message, "Successfully pulled") {
		t.Fatalf("Pulled events %v", pulled)
	}

	legacy := fmt.Sprintf(`{"apiVersion":"v1","kind":"Secret","type":"kubernetes.io/dockercfg","metadata":{"name":"oldcred","namespace":%q},"stringData":{".dockercfg":%q}}`,
		e.ns, fmt.Sprintf(`{%q:{"auth":%q}}`, reg.Host, base64.StdEncoding.EncodeToString([]byte(reg.User+":"+reg.Pass))))
	e.apply(list(legacy, regPod("legacy", e.ns, image, "Always", "oldcred")), "succeeded", podReadyTimeout)
	if strings.Contains(e.agent.Logs(), reg.Pass) {
		t.Fatal("the registry password is in mqlet's log")
	}
	for _, m := range e.mq.Messages() {
		if !strings.Contains(m.Topic, "/cmd/") && strings.Contains(string(m.Payload), reg.Pass) {
			t.Fatalf("the registry password was published on %s", m.Topic)
		}
	}
}

// TestRegistryNodeCredentials: the node's own docker config.json alone
// makes the pod run; a missing tag fails the apply at once.
func TestRegistryNodeCredentials(t *testing.T) {
	reg := StartRegistry(t, true)
	image := reg.Push(containerd.BusyboxImage, "nodeonly/app:1")
	creds := filepath.Join(t.TempDir(), "config.json")
	if err := os.WriteFile(creds, []byte(dockerConfigJSON(reg.Host, reg.User, reg.Pass)), 0o600); err != nil {
		t.Fatal(err)
	}
	e := newPodEnv(t, pullTestConfig+"  credentialsFile: "+creds+"\n")
	e.cleanupPods("node-creds")
	e.apply([]byte(regPod("node-creds", e.ns, image, "Always")), "succeeded", podReadyTimeout)
	// A tag the registry does not have is a definite failure too.
	e.cleanupPods("no-such-tag")
	r := e.apply([]byte(regPod("no-such-tag", e.ns, reg.Host+"/nodeonly/app:nope", "IfNotPresent")), "failed", 60*time.Second)
	if !strings.Contains(r.Message, "not found") {
		t.Fatalf("apply of a missing tag: want the registry's not found, got %q", r.Message)
	}
	if strings.Contains(e.agent.Logs(), reg.Pass) {
		t.Fatal("the registry password is in mqlet's log")
	}
}

// TestRegistryUnreachableBacksOff: with the registry stopped a new pod
// retries with growing delays, one Pulling and one Failed event per retry;
// the apply waits (a transient error); once the registry is back the pod
// runs within one backoff period and the apply succeeds.
func TestRegistryUnreachableBacksOff(t *testing.T) {
	reg := StartRegistry(t, false)
	image := reg.Push(containerd.BusyboxImage, "flaky/app:1")
	reg.Stop()
	e := newPodEnv(t, pullTestConfig)
	e.cleanupPods("flaky")
	mark := e.mq.Mark()
	id := e.nextID("apply")
	e.mq.Command(e.node, "apply", id, []byte(regPod("flaky", e.ns, image, "IfNotPresent")))

	var pulls []time.Time
	Eventually(t, 60*time.Second, "four pull attempts", func() bool {
		pulls = nil
		for _, ev := range e.eventsFor(mark, "flaky", "Pulling") {
			pulls = append(pulls, ev.LastTimestamp.Time)
		}
		return len(pulls) >= 4
	})
	t.Logf("pull attempts at %v", pulls)
	for i := 2; i < len(pulls); i++ {
		if pulls[i].Sub(pulls[i-1]) <= pulls[i-1].Sub(pulls[i-2]) && pulls[i].Sub(pulls[i-1]) < 8*time.Second {
			t.Fatalf("retry delays do not grow: attempts at %v", pulls)
		}
	}
	failed := e.eventsFor(mark, "flaky", "Failed")
	if len(failed) == 0 || !strings.Contains(failed[len(failed)-1].Message, "connection refused") {
		t.Fatalf("Failed events %v", failed)
	}
	// One event per retry: the counts follow the attempts, nothing more.
	if n, last := len(failed), failed[len(failed)-1].Count; n > len(pulls)+1 || last > int32(len(pulls)+1) {
		t.Fatalf("%d Failed events (last count %d) for %d attempts", n, last, len(pulls))
	}
	backoffs := e.eventsFor(mark, "flaky", "BackOff")
	if len(backoffs) == 0 || len(backoffs) > len(pulls)+1 {
		t.Fatalf("%d BackOff events for %d attempts", len(backoffs), len(pulls))
	}
	if rs := e.mq.Replies(e.node, id); len(rs) > 0 && rs[len(rs)-1].Final() {
		t.Fatalf("a transient failure answered the apply: %+v", rs[len(rs)-1])
	}
	reg.Start()
	back := time.Now()
	Eventually(t, 30*time.Second, "pod running after the registry is back", func() bool {
		return len(e.cri.Running(e.ns, "flaky")) == 1
	})
	if d := time.Since(back); d > 8*time.Second+10*time.Second {
		t.Fatalf("running %v after the registry came back; backoff max is 8s", d)
	}
	e.waitFinal(id, "succeeded", 30*time.Second)
}

// TestRegistryMirrorBeforeUpstream: a mirror configured in containerd's
// hosts.d serves the image while the upstream registry is down.
func TestRegistryMirrorBeforeUpstream(t *testing.T) {
	upstream := StartRegistry(t, false)
	mirror := StartRegistry(t, false)
	mirror.Push(containerd.BusyboxImage, "mirrored/app:1")
	upstream.Stop()
	upstream.UseMirrors(mirror)
	e := newPodEnv(t, pullTestConfig)
	e.cleanupPods("mirrored")
	e.apply([]byte(regPod("mirrored", e.ns, upstream.Host+"/mirrored/app:1", "Always")), "succeeded", podReadyTimeout)
}

// TestRegistryAlwaysMovedTag: with imagePullPolicy Always, a restart of the
// pod's container after the tag moved runs the new digest; with the registry
// gone the container is not started from the cached image (as the kubelet).
func TestRegistryAlwaysMovedTag(t *testing.T) {
	reg := StartRegistry(t, false)
	reg.Push(containerd.BusyboxImage, "moving/base:1")
	first := reg.Derive("moving/base:1", "moving/app:v", "1", 0)
	image := reg.Host + "/moving/app:v"
	e := newPodEnv(t, pullTestConfig)
	e.cleanupPods("moving")
	pod := fmt.Sprintf(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"moving","namespace":%q},"spec":{
	  "terminationGracePeriodSeconds":1,"restartPolicy":"Always",
	  "containers":[{"name":"main","image":%q,"imagePullPolicy":"Always","command":["sh","-c","sleep 4"]}]}}`, e.ns, image)
	e.apply([]byte(pod), "succeeded", podReadyTimeout)
	img := imageService(t)
	digestOfRunning := func() string {
		for _, c := range e.cri.Running(e.ns, "moving") {
			ctx, cancel := criCtx()
			resp, err := img.ImageStatus(ctx, &runtimeapi.ImageSpec{Image: c.ImageRef}, false)
			cancel()
			if err != nil || resp.GetImage() == nil {
				continue
			}
			for _, d := range resp.GetImage().RepoDigests {
				if strings.HasPrefix(d, reg.Host+"/moving/app@") {
					return strings.TrimPrefix(d, reg.Host+"/moving/app@")
				}
			}
		}
		return ""
	}
	Eventually(t, 30*time.Second, "the first digest running", func() bool { return digestOfRunning() == first })
	second := reg.Derive("moving/base:1", "moving/app:v", "2", 0)
	if second == first {
		t.Fatal("the new image has the old digest")
	}
	Eventually(t, 60*time.Second, "the moved tag's digest running after a restart", func() bool { return digestOfRunning() == second })

	// Registry gone: as the kubelet, Always does not fall back to the
	// cached image; the next start waits in ErrImagePull/ImagePullBackOff.
	reg.Stop()
	e.waitStatus("moving", 60*time.Second, "waiting on the unreachable registry", func(p *v1.Pod) bool {
		reason, msg := waitingOf(p)
		return (reason == "ImagePullBackOff" || reason == "ErrImagePull") && strings.Contains(msg, "connection refused")
	})
	if n := len(e.cri.Running(e.ns, "moving")); n != 0 {
		t.Fatalf("%d containers running from the cached image with Always and no registry", n)
	}
}

func imageService(t testing.TB) interface {
	ImageStatus(ctx context.Context, image *runtimeapi.ImageSpec, verbose bool) (*runtimeapi.ImageStatusResponse, error)
	RemoveImage(ctx context.Context, image *runtimeapi.ImageSpec) error
} {
	t.Helper()
	ctx, cancel := criCtx()
	defer cancel()
	svc, err := criclient.NewRemoteImageService(ctx, containerd.Endpoint(t), 30*time.Second, nil, false)
	if err != nil {
		t.Fatal(err)
	}
	return svc
}

// TestRegistryBigPullDoesNotDelayOthers pulls a ~200 MB image through mqlet
// and, while it runs, starts a pod whose image is present: that pod starts
// before the pull ends and about as fast as alone. It logs the pull time
// through mqlet against `ctr images pull` of the same image
// (BenchmarkRegistryBigPull reports the same as metrics).
func TestRegistryBigPullDoesNotDelayOthers(t *testing.T) {
	_, image := bigImage(t)
	e := newPodEnv(t, pullTestConfig)
	r := bigPullRound(t, e, image, 1)
	t.Logf("200 MB pull: ctr images pull %v, through mqlet (apply to running) %v, ratio %.2f; %s",
		r.direct.Round(time.Millisecond), r.viaMqlet.Round(time.Millisecond), r.viaMqlet.Seconds()/r.direct.Seconds(), r.pulled)
	t.Logf("present-image pod start: alone %v, during the big pull %v", r.alone.Round(time.Millisecond), r.during.Round(time.Millisecond))
	if r.during > 3*r.alone+5*time.Second {
		t.Fatalf("a present-image pod took %v to start during the pull, %v alone", r.during, r.alone)
	}
}

// BenchmarkRegistryBigPull: per round, a 200 MB pull by `ctr images pull`
// and through mqlet, and the start of a present-image pod alone and during
// mqlet's pull. Run with -benchtime=3x (each round takes ~10 s).
func BenchmarkRegistryBigPull(b *testing.B) {
	_, image := bigImage(b)
	e := newPodEnv(b, pullTestConfig)
	var direct, via, alone, during time.Duration
	b.ResetTimer()
	for i := range b.N {
		r := bigPullRound(b, e, image, i+1)
		direct, via, alone, during = direct+r.direct, via+r.viaMqlet, alone+r.alone, during+r.during
	}
	n := float64(b.N)
	b.ReportMetric(direct.Seconds()/n, "ctr-pull-s")
	b.ReportMetric(via.Seconds()/n, "mqlet-pull-s")
	b.ReportMetric(via.Seconds()/direct.Seconds(), "mqlet/ctr")
	b.ReportMetric(float64(alone.Milliseconds())/n, "start-alone-ms")
	b.ReportMetric(float64(during.Milliseconds())/n, "start-during-pull-ms")
}

// bigImage pushes busybox plus a 200 MiB random layer to a plain registry.
func bigImage(tb testing.TB) (*Registry, string) {
	reg := StartRegistry(tb, false)
	reg.Push(containerd.BusyboxImage, "big/base:1")
	reg.Derive("big/base:1", "big/app:1", "big", 200<<20)
	return reg, reg.Host + "/big/app:1"
}

type bigPullTimes struct {
	direct, viaMqlet, alone, during time.Duration
	pulled                          string // mqlet's Pulled event
}

// bigPullRound pulls image with ctr and removes it, then has mqlet run a
// pod of it while a present-image pod starts; it leaves nothing behind.
func bigPullRound(tb testing.TB, e *podEnv, image string, round int) bigPullTimes {
	tb.Helper()
	var r bigPullTimes
	sock := strings.TrimPrefix(containerd.Endpoint(tb), "unix://")
	hostsDir := filepath.Join(filepath.Dir(sock), "certs.d")
	start := time.Now()
	if out, err := exec.Command("ctr", "-n", "k8s.io", "-a", sock, "images", "pull", "--hosts-dir", hostsDir, image).CombinedOutput(); err != nil {
		tb.Fatalf("ctr images pull: %v: %s", err, tail(string(out), 5))
	}
	r.direct = time.Since(start)
	removeImage(tb, image)

	alone, big, during := fmt.Sprintf("alone-%d", round), fmt.Sprintf("big-%d", round), fmt.Sprintf("during-%d", round)
	t0 := time.Now()
	e.apply(podYAML(alone, e.ns, "Always", "sleep 3600"), "succeeded", podReadyTimeout)
	r.alone = time.Since(t0)
	bigID := e.nextID("apply")
	mark := e.mq.Mark()
	t1 := time.Now()
	e.mq.Command(e.node, "apply", bigID, []byte(regPod(big, e.ns, image, "IfNotPresent")))
	Eventually(tb, 30*time.Second, "the big pull started", func() bool { return len(e.eventsFor(mark, big, "Pulling")) > 0 })
	t2 := time.Now()
	e.apply(podYAML(during, e.ns, "Always", "sleep 3600"), "succeeded", podReadyTimeout)
	r.during = time.Since(t2)
	if len(e.eventsFor(mark, big, "Pulled")) > 0 {
		tb.Fatalf("the big pull ended (%v) before the other pod started; nothing is shown", time.Since(t1))
	}
	e.waitFinal(bigID, "succeeded", 5*time.Minute)
	r.viaMqlet = time.Since(t1)
	if pulled := e.eventsFor(mark, big, "Pulled"); len(pulled) > 0 {
		r.pulled = pulled[len(pulled)-1].Message
	}
	for _, n := range []string{alone, big, during} {
		e.deletePod(n)
	}
	Eventually(tb, podGoneTimeout, "the round's pods gone", func() bool {
		return len(e.cri.Containers(e.ns, big)) == 0 && len(e.cri.Sandboxes(e.ns, big)) == 0
	})
	removeImage(tb, image)
	return r
}

// removeImage removes every name of image (CRI added its digest name) and
// waits until its 200 MiB layer is gone, so the next pull fetches it all.
// The busybox image has another id and stays.
func removeImage(tb testing.TB, image string) {
	tb.Helper()
	img := imageService(tb)
	ctx, cancel := criCtx()
	defer cancel()
	st, err := img.ImageStatus(ctx, &runtimeapi.ImageSpec{Image: image}, false)
	if err != nil || st.GetImage() == nil {
		tb.Fatalf("image %s not seen by CRI: %v", image, err)
	}
	if err := img.RemoveImage(ctx, &runtimeapi.ImageSpec{Image: st.GetImage().Id}); err != nil {
		tb.Fatalf("removing image %s: %v", image, err)
	}
	sock := strings.TrimPrefix(containerd.Endpoint(tb), "unix://")
	Eventually(tb, 30*time.Second, "the 200 MB layer gone from containerd's content store", func() bool {
		out, err := exec.Command("ctr", "-n", "k8s.io", "-a", sock, "content", "ls").Output()
		return err == nil && !strings.Contains(string(out), "MiB")
	})
}

// TestRegistryFixedPullSecretIsANewAttempt: after a 401 the pod is in a
// long backoff (60 s); re-applied with another, valid imagePullSecrets it
// runs at once, and so does a pod whose own pull secret is fixed in place.
// The backoff is the pod's, for that image and those credentials (the
// kubelet keys it by pod uid and image): a change of credentials is a new
// attempt, not an answer from the old backoff.
func TestRegistryFixedPullSecretIsANewAttempt(t *testing.T) {
	reg := StartRegistry(t, true)
	image := reg.Push(containerd.BusyboxImage, "private/fixed:1")
	e := newPodEnv(t, "images:\n  pullBackoffBase: 60s\n  pullBackoffMax: 300s\n"+allowLocalRegistries)
	e.cleanupPods("renamed", "inplace")
	secret := func(name, pass string) string {
		return fmt.Sprintf(`{"apiVersion":"v1","kind":"Secret","type":"kubernetes.io/dockerconfigjson","metadata":{"name":%q,"namespace":%q},"stringData":{".dockerconfigjson":%q}}`,
			name, e.ns, dockerConfigJSON("https://"+reg.Host, reg.User, pass))
	}
	r := e.apply(list(secret("wrong", "not-"+reg.Pass), regPod("renamed", e.ns, image, "IfNotPresent", "wrong"),
		regPod("inplace", e.ns, image, "IfNotPresent", "wrong")), "failed", 60*time.Second)
	if !strings.Contains(r.Message, "401 Unauthorized") {
		t.Fatalf("apply with a wrong password: want the registry's 401, got %q", r.Message)
	}
	for _, name := range []string{"renamed", "inplace"} {
		e.waitStatus(name, 30*time.Second, "in ImagePullBackOff", func(p *v1.Pod) bool {
			reason, _ := waitingOf(p)
			return reason == "ImagePullBackOff"
		})
	}
	// Another secret named in the pod: a new attempt, answered succeeded
	// well inside the 60 s backoff.
	start := time.Now()
	e.apply(list(secret("right", reg.Pass), regPod("renamed", e.ns, image, "IfNotPresent", "right")), "succeeded", 40*time.Second)
	t.Logf("re-applied with a valid secret: running after %v", time.Since(start).Round(time.Millisecond))
	// The same secret fixed in place: the pod's next sync pulls with it.
	e.apply(list(secret("wrong", reg.Pass)), "succeeded", 30*time.Second)
	Eventually(t, 40*time.Second, "the pod whose secret was fixed runs inside the old backoff", func() bool {
		return len(e.cri.Running(e.ns, "inplace")) == 1
	})
}
