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

// Short pull backoffs, so growing delays show within a test.
const pullTestConfig = `images:
  pullBackoffBase: 2s
  pullBackoffMax: 8s
`

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
// makes the pod run.
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

// TestRegistryAlwaysMovedTag: with imagePullPolicy Always, a restart of the
// pod's container after the tag moved runs the new digest.
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
}

func imageService(t *testing.T) interface {
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
// through mqlet against `ctr images pull` of the same image.
func TestRegistryBigPullDoesNotDelayOthers(t *testing.T) {
	reg := StartRegistry(t, false)
	reg.Push(containerd.BusyboxImage, "big/base:1")
	reg.Derive("big/base:1", "big/app:1", "big", 200<<20)
	image := reg.Host + "/big/app:1"
	sock := strings.TrimPrefix(containerd.Endpoint(t), "unix://")
	hostsDir := filepath.Join(filepath.Dir(sock), "certs.d")
	start := time.Now()
	if out, err := exec.Command("ctr", "-n", "k8s.io", "-a", sock, "images", "pull", "--hosts-dir", hostsDir, image).CombinedOutput(); err != nil {
		t.Fatalf("ctr images pull: %v: %s", err, tail(string(out), 5))
	}
	direct := time.Since(start)
	// Every name of it (CRI added its digest name), so its content goes and
	// mqlet has to pull it all again; the busybox image has another id.
	img := imageService(t)
	ctx, cancel := criCtx()
	st, err := img.ImageStatus(ctx, &runtimeapi.ImageSpec{Image: image}, false)
	if err != nil || st.GetImage() == nil {
		t.Fatalf("image pulled by ctr not seen by CRI: %v", err)
	}
	if err := img.RemoveImage(ctx, &runtimeapi.ImageSpec{Image: st.GetImage().Id}); err != nil {
		t.Fatalf("removing the image ctr pulled: %v", err)
	}
	cancel()
	Eventually(t, 30*time.Second, "the 200 MB layer gone from containerd's content store", func() bool {
		out, err := exec.Command("ctr", "-n", "k8s.io", "-a", sock, "content", "ls").Output()
		return err == nil && !strings.Contains(string(out), "MiB")
	})

	e := newPodEnv(t, pullTestConfig)
	e.cleanupPods("alone", "big", "during")
	t0 := time.Now()
	e.apply(podYAML("alone", e.ns, "Always", "sleep 3600"), "succeeded", podReadyTimeout)
	alone := time.Since(t0)

	bigID := e.nextID("apply")
	t1 := time.Now()
	e.mq.Command(e.node, "apply", bigID, []byte(regPod("big", e.ns, image, "IfNotPresent")))
	mark := e.mq.Mark()
	e.mq.WaitFor(0, 30*time.Second, "the big pull started", func(m Msg) bool {
		return strings.Contains(string(m.Payload), `"Pulling"`) && strings.Contains(string(m.Payload), "big/app")
	})
	t2 := time.Now()
	e.apply(podYAML("during", e.ns, "Always", "sleep 3600"), "succeeded", podReadyTimeout)
	during := time.Since(t2)
	if len(e.eventsFor(mark, "big", "Pulled")) > 0 {
		t.Fatalf("the big pull ended (%v) before the other pod started; the test shows nothing", time.Since(t1))
	}
	e.waitFinal(bigID, "succeeded", 5*time.Minute)
	viaMqlet := time.Since(t1)
	pulled := e.eventsFor(0, "big", "Pulled")
	t.Logf("200 MB pull: ctr images pull %v, through mqlet (apply to running) %v, ratio %.2f; Pulled event: %s",
		direct.Round(time.Millisecond), viaMqlet.Round(time.Millisecond), viaMqlet.Seconds()/direct.Seconds(), pulled[len(pulled)-1].Message)
	t.Logf("present-image pod start: alone %v, during the big pull %v", alone.Round(time.Millisecond), during.Round(time.Millisecond))
	if during > 3*alone+5*time.Second {
		t.Fatalf("a present-image pod took %v to start during the pull, %v alone", during, alone)
	}
}
