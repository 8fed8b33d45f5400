package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mqlet/mqlet/internal/testutil/containerd"
)

// exportImage writes the local busybox under the name ref as an OCI
// tarball at file, leaving ref absent from containerd.
func exportImage(t *testing.T, ref, file string) {
	t.Helper()
	sock := strings.TrimPrefix(containerd.Endpoint(t), "unix://")
	for _, args := range [][]string{
		{"images", "tag", "--force", containerd.BusyboxImage, ref},
		{"images", "export", file, ref},
		{"images", "rm", ref},
	} {
		if out, err := exec.Command("ctr", append([]string{"-n", "k8s.io", "-a", sock}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("ctr %v: %v: %s", args, err, out)
		}
	}
	t.Cleanup(func() { untag(t, ref) })
}

// TestRegistryPreloadTarball: OCI tarballs in the preload directory are
// imported at start and when they appear later, each with a node event, and
// pods use them with imagePullPolicy Never.
func TestRegistryPreloadTarball(t *testing.T) {
	dir := t.TempDir()
	suffix := fmt.Sprint(time.Now().UnixNano() % 1e9)
	atStart, later := "docker.io/mqlet/preloaded-a:"+suffix, "docker.io/mqlet/preloaded-b:"+suffix
	exportImage(t, atStart, filepath.Join(dir, "a.tar"))
	staged := filepath.Join(t.TempDir(), "b.tar")
	exportImage(t, later, staged)
	old := time.Now().Add(-time.Minute)
	_ = os.Chtimes(filepath.Join(dir, "a.tar"), old, old)

	e := newPodEnv(t, "images:\n  preloadDir: "+dir+"\n  preloadInterval: 500ms\n")
	e.cleanupPods("pre-a", "pre-b")
	pod := func(name, image string) []byte {
		return []byte(fmt.Sprintf(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":%q,"namespace":%q},"spec":{
		  "terminationGracePeriodSeconds":1,"containers":[{"name":"main","image":%q,"imagePullPolicy":"Never","command":["sh","-c","sleep 3600"]}]}}`,
			name, e.ns, image))
	}
	e.mq.WaitFor(0, 30*time.Second, "an ImagePreloaded event for a.tar", func(m Msg) bool {
		return strings.Contains(string(m.Payload), `"ImagePreloaded"`) && strings.Contains(string(m.Payload), atStart)
	})
	e.apply(pod("pre-a", atStart), "succeeded", podReadyTimeout)

	// Appears later: copied in, then renamed, as an operator would.
	data, err := os.ReadFile(staged)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "b.tar"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	e.mq.WaitFor(0, 30*time.Second, "an ImagePreloaded event for b.tar", func(m Msg) bool {
		return strings.Contains(string(m.Payload), `"ImagePreloaded"`) && strings.Contains(string(m.Payload), later)
	})
	e.apply(pod("pre-b", later), "succeeded", podReadyTimeout)
	n := 0
	for _, m := range e.mq.Messages() {
		if strings.Contains(string(m.Payload), `"ImagePreloaded"`) && strings.Contains(string(m.Payload), atStart) {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("a.tar imported %d times, want once", n)
	}
}
