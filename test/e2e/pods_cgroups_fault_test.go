package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	apiv1 "github.com/mqlet/mqlet/api/v1"
)

// cgroupFS is where this machine mounts its cgroup hierarchies.
const cgroupFS = "/sys/fs/cgroup"

// podLeftovers lists what of pod uid is still on the node: its cgroup in
// any hierarchy under root (each v1 controller, the 'unified' v2 mount, a
// v2 tree), its pod and log directories, and any mount naming it.
func podLeftovers(t *testing.T, root, stateDir, logDir, uid string) []string {
	t.Helper()
	left, _ := filepath.Glob(filepath.Join(cgroupFS, "*", root, "pod"+uid))
	if dir := filepath.Join(cgroupFS, root, "pod"+uid); isDir(dir) {
		left = append(left, dir)
	}
	if dir := filepath.Join(stateDir, "pods", uid); isDir(dir) {
		left = append(left, dir)
	}
	logs, _ := filepath.Glob(filepath.Join(logDir, "*_"+uid))
	left = append(left, logs...)
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatalf("reading mountinfo: %v", err)
	}
	for _, line := range strings.Split(string(mounts), "\n") {
		if strings.Contains(line, uid) {
			left = append(left, "mount: "+line)
		}
	}
	return left
}

// rmdirTree removes an empty cgroup directory tree, deepest first.
func rmdirTree(dir string) {
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if e.IsDir() {
			rmdirTree(filepath.Join(dir, e.Name()))
		}
	}
	_ = os.Remove(dir)
}

func isDir(path string) bool {
	st, err := os.Stat(path)
	return err == nil && st.IsDir()
}

// Issue 18, finding 5: mqlet killed after making a pod's cgroups (its
// pids.max is set before the sandbox) and directories, before its sandbox,
// leaves them with nothing in the runtime for a later delete to kill. Once
// the pod is deleted, nothing of its uid may stay: no cgroup in any
// hierarchy, no pod or log directory, no mount.
func TestPodCgroupsLeftByAKillBeforeTheSandboxAreRemoved(t *testing.T) {
	root := "/mqlet-e2e-" + strconv.FormatInt(time.Now().UnixNano()%1e9, 36)
	// The test's own cgroup root goes once mqlet stopped (registered
	// first, so it runs after the agent's stop), with whatever a failed
	// run left in it.
	t.Cleanup(func() {
		dirs, _ := filepath.Glob(filepath.Join(cgroupFS, "*", root))
		for _, d := range dirs {
			rmdirTree(d)
		}
	})
	var logDir string
	e := startPodEnv(t, func(dir string) string {
		logDir = dir
		return fmt.Sprintf("runtime:\n  plegPeriod: 500ms\n  podLogDir: %s\n  cgroupRoot: %s\npods:\n  pidsLimit: 256\ntelemetry:\n  metricsInterval: 0s\ngc:\n  interval: 1s\n  minDeadAge: 1s\n  imageGCHighPercent: 0\n", dir, root)
	})

	// 1. The agent dies between the pod's cgroups and its sandbox.
	mark := e.mq.Mark()
	e.agent.Kill9()
	e.agent.RestartWithFaults("cri.after-pod-cgroups")
	e.mq.WaitState(mark, e.node, "online", 30*time.Second)
	e.mq.Command(e.node, "apply", e.nextID("apply"), e.pod("left", "Always", "sleep 3600"))
	if !e.agent.WaitExit(podReadyTimeout) {
		t.Fatal("mqlet did not reach cri.after-pod-cgroups")
	}
	pids, _ := filepath.Glob(filepath.Join(cgroupFS, "pids", root, "pod*"))
	if len(pids) != 1 {
		t.Fatalf("pod cgroups in the pids hierarchy after the kill: %v, want the one of the pod applied", pids)
	}
	uid := strings.TrimPrefix(filepath.Base(pids[0]), "pod")
	if left := podLeftovers(t, root, e.stateDir, logDir, uid); len(left) < 2 {
		t.Fatalf("the kill left %v; the test needs the pod's cgroup and directories made", left)
	}
	if sbs := e.cri.Sandboxes(e.ns, "left"); len(sbs) != 0 {
		t.Fatalf("a sandbox exists (%d) though the kill came before it", len(sbs))
	}

	// 2. The pod is deleted while no sandbox can be made for it (the
	// runtime out of reach), so no later delete has anything to kill.
	criEndpoint := e.agent.opts.CRI
	e.agent.opts.CRI = "unix://" + filepath.Join(e.stateDir, "no-such-cri.sock")
	mark = e.mq.Mark()
	e.agent.RestartWithFaults("")
	e.mq.WaitState(mark, e.node, "online", 30*time.Second)
	del := e.nextID("delete")
	e.mq.Command(e.node, "delete", del, fmt.Appendf(nil, `{"kind":"Pod","namespace":%q,"name":"left"}`, e.ns))
	e.mq.WaitFor(mark, 30*time.Second, "the delete accepted", func(m Msg) bool {
		return m.Topic == prefix+"/"+e.node+"/reply/"+del && strings.Contains(string(m.Payload), `"`+apiv1.Accepted+`"`)
	})

	// 3. Back with the runtime: nothing of the pod's uid stays.
	e.agent.Kill9()
	e.agent.opts.CRI = criEndpoint
	mark = e.mq.Mark()
	e.agent.Restart()
	e.mq.WaitState(mark, e.node, "online", 30*time.Second)
	var left []string
	defer func() {
		if t.Failed() {
			t.Logf("left of pod uid %s: %v", uid, left)
		}
	}()
	Eventually(t, podGoneTimeout, "no cgroup, directory or mount of the deleted pod's uid", func() bool {
		left = podLeftovers(t, root, e.stateDir, logDir, uid)
		return len(left) == 0
	})
	if sbs := e.cri.Sandboxes(e.ns, "left"); len(sbs) != 0 {
		t.Fatalf("a sandbox of the deleted pod exists: %d", len(sbs))
	}
}
