package e2e

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/mqlet/mqlet/internal/testutil/containerd"
)

// TestRegistryImageGCWithRealImages: with the image filesystem over the
// (lowered) high threshold, mqlet removes the pulled images no desired pod
// uses, and keeps those of desired pods and the sandbox image.
func TestRegistryImageGCWithRealImages(t *testing.T) {
	reg := StartRegistry(t, false)
	reg.Push(containerd.BusyboxImage, "gc/base:1")
	for _, n := range []string{"a", "b", "c"} {
		reg.Derive("gc/base:1", "gc/"+n+":1", "gc-"+n, 0)
	}
	imgA, imgB, imgC := reg.Host+"/gc/a:1", reg.Host+"/gc/b:1", reg.Host+"/gc/c:1"
	sock := strings.TrimPrefix(containerd.Endpoint(t), "unix://")
	// c is pulled outside mqlet and used by nothing.
	if out, err := exec.Command("ctr", "-n", "k8s.io", "-a", sock, "images", "pull", "--hosts-dir", filepath.Join(filepath.Dir(sock), "certs.d"), imgC).CombinedOutput(); err != nil {
		t.Fatalf("ctr images pull: %v: %s", err, out)
	}
	img := imageService(t)
	present := func(ref string) bool {
		ctx, cancel := criCtx()
		defer cancel()
		st, err := img.ImageStatus(ctx, &runtimeapi.ImageSpec{Image: ref}, false)
		return err == nil && st.GetImage() != nil
	}
	// First the desired pod "keep", which protects the local busybox the
	// other tests need; then mqlet again with image GC every second, always
	// finding the disk over 1 %.
	e := newPodEnv(t, "images:\n"+allowLocalRegistries)
	e.cleanupPods("keep", "a")
	e.apply(podYAML("keep", e.ns, "Always", "sleep 3600"), "succeeded", podReadyTimeout)
	restart := func(extra string) {
		e.agent.Stop()
		e.agent.opts.Config = podTestConfig(t.TempDir(), extra)
		mark := e.mq.Mark()
		e.agent.Restart()
		e.mq.WaitState(mark, e.node, "online", 30*time.Second)
	}
	restart("  nodeStatusInterval: 2s\ngc:\n  interval: 1s\n  imageGCHighPercent: 1\n  imageGCLowPercent: 0\nimages:\n" + allowLocalRegistries) // the first line goes under telemetry
	// Runs before the pods are deleted: without "keep" the busybox image
	// would be unused and go too.
	t.Cleanup(func() { restart("images:\n" + allowLocalRegistries) })
	e.apply([]byte(regPod("a", e.ns, imgA, "IfNotPresent")), "succeeded", podReadyTimeout)
	e.apply([]byte(regPod("b", e.ns, imgB, "IfNotPresent")), "succeeded", podReadyTimeout)
	if !present(imgB) {
		t.Fatal("image b not present while its pod runs")
	}
	// The node status lists the images present, as the kubelet's status.images.
	e.waitNode(0, 90*time.Second, "status.images lists images a and b", func(n *v1.Node) bool {
		names := map[string]bool{}
		for _, img := range n.Status.Images {
			for _, name := range img.Names {
				names[name] = img.SizeBytes > 0
			}
		}
		return names[imgA] && names[imgB]
	})
	e.deletePod("b")
	Eventually(t, 60*time.Second, "unused images b and c removed", func() bool { return !present(imgB) && !present(imgC) })
	for _, ref := range []string{imgA, containerd.BusyboxImage, containerd.PauseImage} {
		if !present(ref) {
			t.Errorf("image %s removed although a desired pod (or the sandbox) uses it", ref)
		}
	}
	if len(e.cri.Running(e.ns, "a")) != 1 {
		t.Error("pod a no longer runs")
	}
}
