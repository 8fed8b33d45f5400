package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	apiv1 "github.com/mqlet/mqlet/api/v1"
)

// Applying and deleting the same pod over and over leaves nothing behind:
// no sandbox or container in containerd, no pod directory, no log directory,
// no pod cgroup, no retained status — and mqlet's memory does not grow with
// the cycles.
func TestApplyDeleteCyclesLeaveNothing(t *testing.T) {
	e := newPodEnv(t, "")
	const cycles = 8
	var uids []string
	var rss []int
	for i := range cycles {
		r := e.apply(e.pod("cycle", "Always", "sleep 3600"), apiv1.Succeeded, podReadyTimeout)
		if len(r.Message) == 0 {
			t.Fatal("empty succeeded reply")
		}
		st, ok := e.status("cycle")
		if !ok || st == nil {
			t.Fatalf("cycle %d: no status", i)
		}
		uids = append(uids, string(st.UID))
		id := e.nextID("delete")
		e.mq.Command(e.node, "delete", id, fmt.Appendf(nil, `{"kind":"Pod","namespace":%q,"name":"cycle","gracePeriodSeconds":0}`, e.ns))
		e.waitFinal(id, apiv1.Succeeded, podGoneTimeout)
		rss = append(rss, rssKiB(t, e.agent))
	}
	if len(e.cri.Containers(e.ns, "cycle")) != 0 || len(e.cri.Sandboxes(e.ns, "cycle")) != 0 {
		t.Fatal("containers or sandboxes left in containerd")
	}
	for _, uid := range uids {
		for _, dir := range []string{filepath.Join(e.stateDir, "pods", uid), filepath.Join("/sys/fs/cgroup/memory/mqlet", "pod"+uid)} {
			if _, err := os.Stat(dir); !os.IsNotExist(err) {
				t.Errorf("%s left behind (%v)", dir, err)
			}
		}
	}
	if p, ok := e.status("cycle"); !ok || p != nil {
		t.Error("the deleted pod's retained status was not cleared")
	}
	t.Logf("mqlet RSS over %d cycles (KiB): %v", cycles, rss)
	if last, first := rss[len(rss)-1], rss[1]; last > first+8*1024 {
		t.Errorf("RSS grew from %d to %d KiB over %d cycles", first, last, cycles)
	}
}

// rssKiB reads the resident set size of the agent's process.
func rssKiB(t *testing.T, a *Agent) int {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", a.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			n, err := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(rest), " kB"))
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatal("no VmRSS")
	return 0
}
