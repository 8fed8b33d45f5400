package cri

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	clocktesting "k8s.io/utils/clock/testing"
)

func TestPullAuthsMatchLikeTheKubelet(t *testing.T) {
	m := testManager(t)
	node := filepath.Join(t.TempDir(), "config.json")
	if err := os.WriteFile(node, []byte(`{"auths":{"reg.example:5000":{"username":"node","password":"np"},"node-only.example":{"auth":"bm9kZTI6cHc="}}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	m.cfg.NodeCredentials = node
	pod := testPod(v1.RestartPolicyAlways, nil, "a")
	pod.Spec.ImagePullSecrets = []v1.LocalObjectReference{{Name: "json"}, {Name: "legacy"}, {Name: "missing"}}
	objects := fakeObjects{secrets: map[string]*v1.Secret{
		"default/json": {Type: v1.SecretTypeDockerConfigJson, Data: map[string][]byte{v1.DockerConfigJsonKey: []byte(
			`{"auths":{"https://index.docker.io/v1/":{"auth":"dXNlcjpwYXNz"},"reg.example:5000":{"username":"u2","password":"p2"},"http://reg.example:5000/team/app":{"username":"deep","password":"p3"}}}`)}},
		"default/legacy": {Type: v1.SecretTypeDockercfg, Data: map[string][]byte{v1.DockerConfigKey: []byte(
			`{"old.example":{"username":"legacy","password":"p4"}}`)}},
	}}
	for image, want := range map[string][]string{
		"busybox":                                         {"user"},
		"docker.io/library/nginx:1":                       {"user"},
		"reg.example:5000/app:1":                          {"u2", "node"},         // the pod's secret first, then the node's
		"reg.example:5000/team/app:2":                     {"deep", "u2", "node"}, // the longest match first
		"old.example/x@sha256:" + strings.Repeat("a", 64): {"legacy"},
		"node-only.example/tool":                          {"node2"},
		"reg.example/app":                                 {""}, // another port: no match, anonymous
		"other.example/app":                               {""},
	} {
		auths, err := m.pullAuths(pod, image, objects)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, a := range auths {
			if a == nil {
				got = append(got, "")
				continue
			}
			got = append(got, a.Username)
		}
		if strings.Join(got, ",") != strings.Join(want, ",") {
			t.Errorf("%s: users %q, want %q", image, got, want)
		}
	}
	objects.secrets["default/json"].Data[v1.DockerConfigJsonKey] = []byte(`{"auths": "s3cret-bytes`)
	_, err := m.pullAuths(pod, "busybox", objects)
	if err == nil || strings.Contains(err.Error(), "s3cret") {
		t.Errorf("malformed pull secret: %v", err)
	}
}

// fakePulls is a pullFunc whose pulls block until released.
type fakePulls struct {
	mu      sync.Mutex
	running atomic.Int32
	peak    atomic.Int32
	calls   atomic.Int32
	release chan struct{}
	err     error
}

func (f *fakePulls) pull(ctx context.Context, w pullWork, auth *runtimeapi.AuthConfig) (string, uint64, error) {
	f.calls.Add(1)
	n := f.running.Add(1)
	defer f.running.Add(-1)
	for {
		p := f.peak.Load()
		if n <= p || f.peak.CompareAndSwap(p, n) {
			break
		}
	}
	select {
	case <-f.release:
	case <-ctx.Done():
		return "", 0, ctx.Err()
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return "", 0, f.err
	}
	return "sha256:" + w.image, 42, nil
}

func waitDone(t *testing.T, p *imagePuller, uid string) {
	t.Helper()
	select {
	case got := <-p.wake:
		if got != uid {
			t.Fatalf("woke %s, want %s", got, uid)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("pull did not end")
	}
}

func TestPullerBacksOffPerPodImageAndCredentials(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	f := &fakePulls{release: make(chan struct{}), err: errors.New(`failed to resolve reference "r/x:1": unexpected status: 401 Unauthorized`)}
	close(f.release)
	p := newImagePuller(f.pull, 2, time.Minute, 10*time.Second, 300*time.Second, clk)
	defer p.stop()
	w := pullWork{image: "r/x:1", auths: []*runtimeapi.AuthConfig{nil}}
	if r := p.request("pod-a", pullKey(w), w); r.state != pullStarted {
		t.Fatalf("first request: %v", r.state)
	}
	waitDone(t, p, "pod-a")
	r := p.request("pod-a", pullKey(w), w)
	if r.state != pullFailed || !r.definite || !strings.Contains(r.err.Error(), "401 Unauthorized") {
		t.Fatalf("after the failure: %+v", r)
	}
	if r := p.request("pod-a", pullKey(w), w); r.state != pullBackOff || r.wait != 10*time.Second || !r.announce {
		t.Fatalf("asked again: %+v", r)
	}
	if r := p.request("pod-a", pullKey(w), w); r.state != pullBackOff || r.announce {
		t.Fatalf("asked a third time: %+v (announced twice)", r)
	}
	// Another pod with the same image has its own backoff (the kubelet's
	// key is the pod and the image): it pulls.
	if r := p.request("pod-b", pullKey(w), w); r.state != pullStarted {
		t.Fatalf("another pod: %+v", r)
	}
	waitDone(t, p, "pod-b")
	_ = p.request("pod-b", pullKey(w), w)
	var waits []time.Duration
	bk := backoffKey("pod-a", pullKey(w))
	for range 6 {
		clk.Step(p.backoff.Get(bk))
		if r := p.request("pod-a", pullKey(w), w); r.state != pullStarted {
			t.Fatalf("after the backoff: %+v", r)
		}
		waitDone(t, p, "pod-a")
		_ = p.request("pod-a", pullKey(w), w)
		r := p.request("pod-a", pullKey(w), w)
		if r.state != pullBackOff {
			t.Fatalf("pod-a during backoff: %+v", r)
		}
		waits = append(waits, r.wait)
	}
	want := []time.Duration{20 * time.Second, 40 * time.Second, 80 * time.Second, 160 * time.Second, 300 * time.Second, 300 * time.Second}
	for i := range want {
		if waits[i] != want[i] {
			t.Fatalf("backoffs %v, want %v", waits, want)
		}
	}
	// Other credentials (a fixed pull secret) are a new attempt at once.
	fixed := pullWork{image: "r/x:1", auths: []*runtimeapi.AuthConfig{{Username: "u", Password: "right"}}}
	f.mu.Lock()
	f.err = nil
	f.mu.Unlock()
	if r := p.request("pod-a", pullKey(fixed), fixed); r.state != pullStarted {
		t.Fatalf("fixed credentials during the old backoff: %+v", r)
	}
	waitDone(t, p, "pod-a")
	if r := p.request("pod-a", pullKey(fixed), fixed); r.state != pullDone || r.pull.ref != "sha256:r/x:1" || r.pull.size != 42 {
		t.Fatalf("after success: %+v", r)
	}
	if f.calls.Load() != 9 {
		t.Errorf("%d pulls, want 9 (one per retry)", f.calls.Load())
	}
	// A gone pod's backoffs go with it.
	p.forget("pod-a")
	if r := p.request("pod-a", pullKey(w), w); r.state != pullStarted {
		t.Fatalf("a forgotten pod still backs off: %+v", r)
	}
	waitDone(t, p, "pod-a")
}

func TestPullerBoundsParallelismAndSharesPulls(t *testing.T) {
	f := &fakePulls{release: make(chan struct{})}
	p := newImagePuller(f.pull, 2, time.Minute, time.Second, time.Minute, nil)
	defer p.stop()
	images := []string{"a", "b", "c", "d"}
	for _, img := range images {
		w := pullWork{image: img, auths: []*runtimeapi.AuthConfig{nil}}
		for _, uid := range []string{"p1", "p2"} {
			r := p.request(uid+img, pullKey(w), w)
			if r.state != pullStarted {
				t.Fatalf("%s %s: %v", uid, img, r.state)
			}
		}
		if r := p.request("p1"+img, pullKey(w), w); r.state != pullWaiting {
			t.Fatalf("asked again: %v", r.state)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for f.running.Load() < 2 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	close(f.release)
	woken := map[string]bool{}
	for range 8 {
		select {
		case uid := <-p.wake:
			woken[uid] = true
		case <-time.After(10 * time.Second):
			t.Fatalf("woken %v", woken)
		}
	}
	if len(woken) != 8 {
		t.Errorf("woken %v, want every waiting pod", woken)
	}
	if f.peak.Load() != 2 || f.calls.Load() != 4 {
		t.Errorf("peak %d pulls at once (want 2), %d pulls (want one per image: 4)", f.peak.Load(), f.calls.Load())
	}
	// Other credentials are another pull.
	w := pullWork{image: "a", auths: []*runtimeapi.AuthConfig{{Username: "u", Password: "p"}}}
	if r := p.request("p3", pullKey(w), w); r.state != pullStarted {
		t.Errorf("same image, other credentials: %v", r.state)
	}
}

func TestPullerDeadlineIsTransient(t *testing.T) {
	f := &fakePulls{release: make(chan struct{})}
	p := newImagePuller(f.pull, 1, 50*time.Millisecond, time.Second, time.Minute, nil)
	defer p.stop()
	w := pullWork{image: "slow", auths: []*runtimeapi.AuthConfig{nil}}
	p.request("p", pullKey(w), w)
	waitDone(t, p, "p")
	r := p.request("p", pullKey(w), w)
	if r.state != pullFailed || r.definite || !strings.Contains(r.err.Error(), "pull deadline") {
		t.Fatalf("%+v", r)
	}
}

func TestDefinitePullErrors(t *testing.T) {
	for msg, want := range map[string]bool{
		`rpc error: code = Unknown desc = failed to pull and unpack image "x": failed to resolve reference "x": pulling from host 127.0.0.1:5000 failed with status code [manifests 1]: 401 Unauthorized`: true,
		`failed to resolve reference "127.0.0.1:5000/a:1": 127.0.0.1:5000/a:1: not found`:                                                                                                                 true,
		`failed to resolve reference "x": failed to do request: Head "http://127.0.0.1:5000/v2/a/manifests/1": dial tcp 127.0.0.1:5000: connect: connection refused`:                                      false,
		`unexpected status: 503 Service Unavailable`: false,
	} {
		if got := definitePullError(errors.New(msg)); got != want {
			t.Errorf("%q: definite %v, want %v", msg, got, want)
		}
	}
}

// What a failed pull publishes is its class and the registry's host, never
// the registry's own words (a service that is no registry answers with its
// banner).
func TestPullErrorKeepsClassAndHostOnly(t *testing.T) {
	for raw, class := range map[string]string{
		`failed to pull and unpack image "127.0.0.1:2222/x:1": failed to resolve reference "127.0.0.1:2222/x:1": failed to do request: Head "http://127.0.0.1:2222/v2/x/manifests/1": net/http: HTTP/1.x transport connection broken: malformed HTTP response "SSH-2.0-OpenSSH_9.2p1 banner-secret"`: "not an HTTP registry (malformed answer)",
		`failed to resolve reference "r.example/x:1": pulling from host r.example failed with status code [manifests 1]: 401 Unauthorized`:                                                                                                                                                           "401 Unauthorized",
		`failed to resolve reference "r.example/x:1": r.example/x:1: not found`:                                                "not found",
		`failed to do request: Head "http://r.example/v2/": dial tcp 10.0.0.9:80: connect: connection refused`:                 "connection refused",
		`unexpected status from GET request to http://r.example/v2/x/blobs/sha256:00: 500 Internal Server Error banner-secret`: "registry answered status 500",
		`failed to unpack: invalid character '<' looking for beginning of value banner-secret`:                                 "the registry's answer is not a usable image (see mqlet's log)",
	} {
		err := newPullError("r.example:5000/x:1", errors.New(raw))
		if strings.Contains(err.Error(), "banner-secret") || !strings.HasSuffix(err.Error(), ": "+class) || !strings.Contains(err.Error(), "registry r.example:5000") {
			t.Errorf("%q published as %q, want class %q", raw, err, class)
		}
	}
	if err := newPullError("x:1", context.DeadlineExceeded); !errors.Is(err, context.DeadlineExceeded) || definitePullError(err) {
		t.Errorf("a deadline: %v", err)
	}
	if err := newPullError("x:1", errors.New("pulling from host h failed with status code [manifests 1]: 401 Unauthorized")); !definitePullError(err) {
		t.Errorf("a 401 is definite: %v", err)
	}
}
