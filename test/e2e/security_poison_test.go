package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	criclient "k8s.io/cri-client/pkg"

	"github.com/mqlet/mqlet/agent/inflight"
	"github.com/mqlet/mqlet/agent/intake"
	"github.com/mqlet/mqlet/agent/podworker"
	apiv1 "github.com/mqlet/mqlet/api/v1"
	"github.com/mqlet/mqlet/internal/testutil/mosquitto"
)

// procStatusKB reads one "Vm..." field (in kB) of /proc/<pid>/status.
func procStatusKB(t *testing.T, pid int, field string) int {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatalf("reading status of pid %d: %v", pid, err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), field+":"); ok {
			kb, err := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(rest), " kB"))
			if err != nil {
				t.Fatalf("%s of pid %d: %q", field, pid, rest)
			}
			return kb
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}

func (a *Agent) pid() int { return a.cmd.Process.Pid }

// aliasBomb is the payload that took mqlet to its 2 GiB cap in 4 s: a
// 256 KiB string aliased until the YAML is 700 KB (about 28 GiB expanded).
func aliasBombPayload(ns string) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: bomb\n  namespace: %s\ndata:\n  a: &a \"%s\"\n  b: [", ns, strings.Repeat("x", 256<<10))
	for b.Len() < 700_000 {
		b.WriteString("*a, ")
	}
	b.WriteString("*a]\n")
	return []byte(b.String())
}

// The alias bomb is answered failed with mqlet's peak RSS under 100 MB, and
// the same bomb delivered to a restarting mqlet (queued by the broker while
// it was down) does not crash it either.
func TestPoisonAliasBombRefused(t *testing.T) {
	e := newPodEnv(t, "")
	bomb := aliasBombPayload(e.ns)
	id := e.nextID("bomb")
	e.mq.Command(e.node, "apply", id, bomb)
	r := e.waitFinal(id, apiv1.Failed, 30*time.Second)
	if !strings.Contains(r.Message, "expands to more than") {
		t.Fatalf("bomb answered %q", r.Message)
	}
	if !e.agent.Running() {
		t.Fatal("mqlet died on the alias bomb")
	}
	hwm := procStatusKB(t, e.agent.pid(), "VmHWM")
	t.Logf("mqlet VmHWM after refusing the %d-byte alias bomb: %d kB", len(bomb), hwm)
	if hwm > 100<<10 {
		t.Fatalf("mqlet peak RSS %d kB, want under 100 MB", hwm)
	}

	// Down: the broker keeps the bomb for mqlet's persistent session.
	e.agent.Stop()
	id2 := e.nextID("bomb")
	e.mq.Command(e.node, "apply", id2, bomb)
	mark := e.mq.Mark()
	e.agent.Restart()
	e.mq.WaitState(mark, e.node, "online", 30*time.Second)
	e.waitFinal(id2, apiv1.Failed, 30*time.Second)
	e.getPods() // answered: the agent is past the bomb and alive
	hwm = procStatusKB(t, e.agent.pid(), "VmHWM")
	t.Logf("restarted mqlet VmHWM after the redelivered bomb: %d kB", hwm)
	if !e.agent.Running() || hwm > 100<<10 {
		t.Fatalf("restarted mqlet running=%v, peak RSS %d kB", e.agent.Running(), hwm)
	}
}

// The densest YAML within the payload limit (a 1 MiB flow sequence of
// one-letter values: 512 Ki values, whose parse tree took mqlet to 139 MB)
// is refused before its tree is built: answered failed naming the value
// bound, with mqlet in a 64 MiB memory cgroup never near its limit and its
// peak RSS (VmHWM, the binary's pages included) at most 64 MiB.
func TestPoisonDenseYAMLRefusedWithin64MiB(t *testing.T) {
	e := newPodEnv(t, "")
	cg := memCgroup(t, 64<<20)
	joinCgroup(t, cg, e.agent.pid())
	dense := []byte("x: [" + strings.Repeat("a,", (1<<19)-16) + "a]\n")
	id := e.nextID("dense")
	e.mq.Command(e.node, "apply", id, dense)
	r := e.waitFinal(id, apiv1.Failed, 60*time.Second)
	if !strings.Contains(r.Message, "more than 200000 values") {
		t.Fatalf("dense YAML answered %q", r.Message)
	}
	e.getPods() // later commands run
	if !e.agent.Running() {
		t.Fatal("mqlet died on the dense YAML")
	}
	if oom, _ := os.ReadFile(filepath.Join(cg, "memory.oom_control")); !strings.Contains(string(oom), "oom_kill 0") {
		t.Fatalf("the cgroup OOM killer ran; memory.oom_control: %s", oom)
	}
	maxUsage, _ := os.ReadFile(filepath.Join(cg, "memory.max_usage_in_bytes"))
	hwm := procStatusKB(t, e.agent.pid(), "VmHWM")
	t.Logf("mqlet after refusing the %d-byte dense YAML: VmHWM %d kB, cgroup max usage %s bytes (what it charged after joining)", len(dense), hwm, strings.TrimSpace(string(maxUsage)))
	if hwm > 64<<10 {
		t.Fatalf("mqlet peak RSS %d kB, want at most 64 MiB", hwm)
	}
}

// memCgroup makes a cgroup v1 memory cgroup limited to limit bytes (no
// swap here) and removes it when the test ends.
func memCgroup(t *testing.T, limit int) string {
	t.Helper()
	dir := filepath.Join("/sys/fs/cgroup/memory", "mqlet-e2e-"+strconv.FormatInt(time.Now().UnixNano(), 36))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatalf("creating memory cgroup (cgroup v1 memory controller needed): %v", err)
	}
	t.Cleanup(func() {
		// Processes left in it are moved out before it goes.
		if raw, err := os.ReadFile(filepath.Join(dir, "cgroup.procs")); err == nil {
			for _, p := range strings.Fields(string(raw)) {
				_ = os.WriteFile("/sys/fs/cgroup/memory/cgroup.procs", []byte(p), 0o644)
			}
		}
		if err := os.Remove(dir); err != nil {
			t.Logf("removing cgroup %s: %v", dir, err)
		}
	})
	if err := os.WriteFile(filepath.Join(dir, "memory.limit_in_bytes"), []byte(strconv.Itoa(limit)), 0o644); err != nil {
		t.Fatalf("limiting memory cgroup: %v", err)
	}
	return dir
}

func joinCgroup(t *testing.T, dir string, pid int) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644); err != nil {
		t.Fatalf("moving pid %d into %s: %v", pid, dir, err)
	}
}

// marks reads a mark file of mqlet's state dir as the next process would.
func marks(t *testing.T, path string) []string {
	t.Helper()
	f, err := inflight.Open(path, 1)
	if err != nil {
		t.Fatalf("reading marks: %v", err)
	}
	defer f.Close()
	return f.Left()
}

// A real poison: mqlet runs in a memory cgroup whose limit a payload's
// decoding exceeds, so the kernel OOM-kills it mid-command. The broker
// redelivers the un-acked command to the restarted mqlet (in the same
// cgroup: running it again would kill it again). It is answered failed
// "this command stopped the agent", acked, and never run again.
func TestPoisonCommandThatKillsTheAgentIsNotRunAgain(t *testing.T) {
	e := newPodEnv(t, "")
	// 16 MiB more than mqlet holds when it joins: the alias bomb's parse
	// tree (about 28 MiB of alias nodes, built before its expanded size
	// can be measured) does not fit, as it would not on a gateway with
	// that little memory left.
	cg := memCgroup(t, 16<<20)
	joinCgroup(t, cg, e.agent.pid())
	id := e.nextID("poison")
	e.mq.Command(e.node, "apply", id, aliasBombPayload(e.ns))
	Eventually(t, 60*time.Second, "mqlet killed by the poison", func() bool { return !e.agent.Running() })
	ws := e.agent.cmd.ProcessState.Sys().(syscall.WaitStatus)
	if !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("mqlet ended %v, want killed by the OOM killer", e.agent.cmd.ProcessState)
	}
	if oom, _ := os.ReadFile(filepath.Join(cg, "memory.oom_control")); !strings.Contains(string(oom), "oom_kill 1") {
		t.Fatalf("not killed by the cgroup OOM killer; memory.oom_control: %s", oom)
	}
	if got := marks(t, filepath.Join(e.stateDir, "inflight-command")); !slices.Equal(got, []string{"apply " + id}) {
		t.Fatalf("mark left by the killed mqlet: %q", got)
	}

	mark := e.mq.Mark()
	e.agent.Restart()
	joinCgroup(t, cg, e.agent.pid())
	e.mq.WaitState(mark, e.node, "online", 30*time.Second)
	r := e.waitFinal(id, apiv1.Failed, 30*time.Second)
	if r.Message != intake.MsgStoppedAgent {
		t.Fatalf("poison answered %q, want %q", r.Message, intake.MsgStoppedAgent)
	}
	e.waitEvent(mark, intake.ReasonCommandStoppedAgent, 30*time.Second)
	e.getPods() // later commands run
	if !e.agent.Running() {
		t.Fatal("mqlet died again on the redelivered poison")
	}
	if got := marks(t, filepath.Join(e.stateDir, "inflight-command")); len(got) != 0 {
		t.Fatalf("marks after recovery: %q", got)
	}
	// Once more: the command was acked, nothing is redelivered to kill it.
	e.agent.Stop()
	mark = e.mq.Mark()
	e.agent.Restart()
	joinCgroup(t, cg, e.agent.pid())
	e.mq.WaitState(mark, e.node, "online", 30*time.Second)
	e.getPods()
	if !e.agent.Running() {
		t.Fatal("mqlet died after a second restart")
	}
}

// getPods runs a get for this env's namespace and returns its result.
func (e *podEnv) getPods() apiv1.GetResult {
	e.t.Helper()
	id := e.nextID("get")
	e.mq.Command(e.node, "get", id, fmt.Appendf(nil, `{"kind":"Pod","namespace":%q}`, e.ns))
	r := e.waitFinal(id, apiv1.Succeeded, 30*time.Second)
	raw, _ := json.Marshal(r.Result)
	var res apiv1.GetResult
	if err := json.Unmarshal(raw, &res); err != nil {
		e.t.Fatalf("get result %s: %v", raw, err)
	}
	return res
}

func containerdPID(t *testing.T) int {
	t.Helper()
	_, endpoint := ConnectCRI(t)
	raw, err := os.ReadFile(filepath.Join(containerdDir(t, endpoint), "containerd.pid"))
	if err != nil {
		t.Fatalf("reading containerd pid: %v", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(raw)))
	if err != nil {
		t.Fatalf("containerd pid %q: %v", raw, err)
	}
	return pid
}

// A pod whose sync stops mqlet at every start is quarantined once that is
// proven: its sync killed mid-way (a fault point past its runtime read, as
// an OOM kill would) at SuspectDeaths starts in a row. The next start does
// not sync it: a Warning Quarantined event, its status and get say why,
// and the status is what runs (Running, the same container, never
// Pending). A crash of the Go runtime in its sync quarantines at the first
// death. The same spec again stays quarantined; a new spec lifts it.
func TestPoisonPodSyncQuarantined(t *testing.T) {
	e := newPodEnv(t, "")
	e.cleanupPods("stuck", "crasher")
	e.apply(e.pod("stuck", "Always", "sleep 3600"), apiv1.Succeeded, podReadyTimeout)
	e.apply(e.pod("crasher", "Always", "sleep 3600"), apiv1.Succeeded, podReadyTimeout)
	before := e.runningView(0, "stuck", podReadyTimeout)
	running := e.snapshot("stuck")

	// Killed in the pod's sync at every start, one death short of the rule
	// and then the last one.
	e.agent.Stop()
	for death := 1; death <= podworker.SuspectDeaths; death++ {
		e.agent.RestartWithFaults("podworker.syncing/" + e.ns + "/stuck")
		if !e.agent.WaitExit(60 * time.Second) {
			t.Fatalf("mqlet did not die in the pod's sync at start %d", death)
		}
	}
	mark := e.mq.Mark()
	e.agent.RestartWithFaults("")
	e.mq.WaitState(mark, e.node, "online", 30*time.Second)
	e.waitEvent(mark, podworker.ReasonQuarantined, 60*time.Second)
	st := e.waitStatus("stuck", 30*time.Second, "reported quarantined", func(p *v1.Pod) bool { return p.Status.Reason == podworker.ReasonQuarantined })
	if !strings.Contains(st.Status.Message, podworker.MsgStoppedAgent) || !strings.Contains(st.Status.Message, "in a row") {
		t.Fatalf("quarantine status message %q", st.Status.Message)
	}
	if st.Status.Phase != v1.PodRunning || len(st.Status.ContainerStatuses) != 1 || st.Status.ContainerStatuses[0].ContainerID != before.ids["main"] || st.Status.ContainerStatuses[0].State.Running == nil {
		t.Fatalf("the quarantined pod runs %v but is published as %s", running.containers, dump(st.Status))
	}
	e.sameAs("stuck", running, "quarantined")
	res := e.getPods()
	var got *v1.Pod
	for _, p := range res.Pods {
		if p.Name == "stuck" {
			got = p
		}
	}
	if got == nil || got.Status.Reason != podworker.ReasonQuarantined {
		t.Fatalf("get shows %s", dump(res.Pods))
	}
	for _, p := range res.Pods {
		if p.Name == "crasher" && p.Status.Reason == podworker.ReasonQuarantined {
			t.Fatal("a pod whose sync was never in flight at a death is quarantined")
		}
	}

	// The same spec again stays quarantined; a new spec lifts it.
	e.apply(e.pod("stuck", "Always", "sleep 3600"), apiv1.Failed, 30*time.Second)
	mark = e.mq.Mark()
	e.apply(e.pod("stuck", "Always", "sleep 3601"), apiv1.Succeeded, podReadyTimeout)
	e.waitEvent(mark, podworker.ReasonQuarantineLifted, 10*time.Second)
	if len(e.cri.Running(e.ns, "stuck")) != 1 {
		t.Fatal("the pod does not run after its quarantine was lifted")
	}

	// A Go crash (an unrecovered panic in a goroutine the sync started)
	// quarantines at the first death: the crash report names the sync.
	e.agent.Stop()
	e.agent.RestartWithFaults("podworker.syncing/" + e.ns + "/crasher!panic")
	if code := e.agent.ExitCode(60 * time.Second); code != 2 {
		t.Fatalf("mqlet exited %d at the panic, want 2 (a Go crash)", code)
	}
	mark = e.mq.Mark()
	e.agent.RestartWithFaults("")
	e.mq.WaitState(mark, e.node, "online", 30*time.Second)
	st = e.waitStatus("crasher", 60*time.Second, "reported quarantined", func(p *v1.Pod) bool { return p.Status.Reason == podworker.ReasonQuarantined })
	if !strings.Contains(st.Status.Message, "Go runtime error") || st.Status.Phase != v1.PodRunning {
		t.Fatalf("crasher published as %s", dump(st.Status))
	}
}

// newPodEnvAfter is newPodEnv, with before run on the broker after the
// operator client connected and before mqlet first starts.
func newPodEnvAfter(t *testing.T, before func(e *podEnv)) *podEnv {
	t.Helper()
	cri, endpoint := ConnectCRI(t)
	ctx, cancel := criCtx()
	defer cancel()
	rt, err := criclient.NewRemoteRuntimeServiceBuilder().WithEndpoint(endpoint).WithConnectionTimeout(5 * time.Second).WithTracerProvider(nil).Build(ctx)
	if err != nil {
		t.Fatalf("connecting to CRI %s: %v", endpoint, err)
	}
	suffix := strconv.FormatInt(time.Now().UnixNano()%1e9, 36) + strconv.FormatInt(podEnvSeq.Add(1), 36)
	e := &podEnv{t: t, cri: cri, rt: rt, node: "e2e-retained-" + suffix, ns: "e2e-retained-" + suffix}
	t.Cleanup(e.sweep) // registered first, runs last
	e.broker = mosquitto.Start(t)
	e.mq = Connect(t, e.broker.URL())
	e.mq.Subscribe(prefix + "/" + e.node + "/#")
	e.stateDir = t.TempDir()
	before(e)
	mark := e.mq.Mark()
	e.agent = StartAgent(t, AgentOpts{Node: e.node, Broker: e.broker.URL(), CRI: endpoint, StateDir: e.stateDir, Config: podTestConfig(t.TempDir(), "")})
	e.mq.WaitState(mark, e.node, "online", 30*time.Second)
	return e
}

// A retained command is replayed by the broker on every subscription; mqlet
// refuses it (failed, not recorded, nothing run); the same request id
// published without the retain flag runs.
func TestRetainedCommandRefused(t *testing.T) {
	var topic string
	var payload []byte
	e := newPodEnvAfter(t, func(e *podEnv) {
		topic = prefix + "/" + e.node + "/cmd/apply/retained-1"
		payload = e.pod("ret", "Always", "sleep 3600")
		e.mq.Publish(topic, payload, true)
	})
	e.cleanupPods("ret")
	r := e.waitFinal("retained-1", apiv1.Failed, 30*time.Second)
	if r.Message != intake.MsgRetainedRefused {
		t.Fatalf("retained command answered %q", r.Message)
	}
	e.waitEvent(0, intake.ReasonRetainedCommand, 10*time.Second)
	if res := e.getPods(); len(res.Pods) != 0 {
		t.Fatalf("a retained command stored %s", dump(res.Pods))
	}
	if n := len(e.cri.Sandboxes(e.ns, "ret")); n != 0 {
		t.Fatalf("a retained command ran: %d sandboxes", n)
	}
	// Cleared, then published as a command should be: it runs.
	e.mq.Publish(topic, nil, true)
	mark := e.mq.Mark()
	e.mq.Publish(topic, payload, false)
	e.mq.WaitFor(mark, podReadyTimeout, "retained-1 succeeded", func(m Msg) bool {
		var r apiv1.Reply
		return m.Topic == prefix+"/"+e.node+"/reply/retained-1" && json.Unmarshal(m.Payload, &r) == nil && r.Phase == apiv1.Succeeded
	})
	if len(e.cri.Running(e.ns, "ret")) != 1 {
		t.Fatal("the non-retained publish did not run the pod")
	}
}

// pods.maxPods is the node's capacity: with maxPods 5, the 6th and 7th pods
// applied one by one are answered failed OutOfpods in the kubelet's words.
func TestMaxPodsEnforced(t *testing.T) {
	e := startPodEnv(t, func(logDir string) string {
		return fmt.Sprintf("runtime:\n  plegPeriod: 500ms\n  podLogDir: %s\npods:\n  backoffBase: 1s\n  backoffMax: 4s\n  maxPods: 5\ntelemetry:\n  metricsInterval: 0s\n", logDir)
	})
	var names []string
	for i := range 5 {
		names = append(names, fmt.Sprintf("p%d", i))
	}
	e.cleanupPods(names...)
	for _, n := range names {
		e.apply(e.pod(n, "Always", "sleep 3600"), apiv1.Succeeded, podReadyTimeout)
	}
	for _, n := range []string{"p5", "p6"} {
		r := e.apply(e.pod(n, "Always", "sleep 3600"), apiv1.Failed, 30*time.Second)
		want := "OutOfpods: Node didn't have enough resource: pods, requested: 1, used: 5, capacity: 5"
		if !strings.HasPrefix(r.Message, want) {
			t.Fatalf("pod %s answered %q, want %q", n, r.Message, want)
		}
		if s := len(e.cri.Sandboxes(e.ns, n)); s != 0 {
			t.Fatalf("pod %s refused but has %d sandboxes", n, s)
		}
	}
	if res := e.getPods(); len(res.Pods) != 5 {
		t.Fatalf("%d pods desired, want 5", len(res.Pods))
	}
}

// The default capacity, as the kubelet's: 110 pods applied in one command
// run, and the 111th is answered failed OutOfpods without a sandbox.
func TestMaxPodsDefaultHundredTen(t *testing.T) {
	e := startPodEnv(t, func(logDir string) string {
		return fmt.Sprintf("runtime:\n  podLogDir: %s\npods:\n  maxPods: 110\ntelemetry:\n  metricsInterval: 0s\nadmission:\n  allowHostNetwork: true\n", logDir)
	})
	// hostNetwork pods: no CNI setup and teardown, which would make this
	// test a benchmark of the bridge plugin's iptables lock.
	pod := func(name string) string {
		return strings.Replace(string(e.pod(name, "Always", "sleep 3600")), "spec:\n", "spec:\n  hostNetwork: true\n", 1)
	}
	var docs []string
	for i := range 110 {
		docs = append(docs, pod(fmt.Sprintf("full%03d", i)))
	}
	start := time.Now()
	e.apply([]byte(strings.Join(docs, "---\n")), apiv1.Succeeded, 10*time.Minute)
	t.Logf("110 pods running %s after the apply", time.Since(start).Round(time.Millisecond))
	r := e.apply([]byte(pod("full110")), apiv1.Failed, 30*time.Second)
	want := "OutOfpods: Node didn't have enough resource: pods, requested: 1, used: 110, capacity: 110"
	if !strings.HasPrefix(r.Message, want) {
		t.Fatalf("the 111th pod answered %q, want %q", r.Message, want)
	}
	if s := len(e.cri.Sandboxes(e.ns, "full110")); s != 0 {
		t.Fatalf("the refused pod has %d sandboxes", s)
	}
	if res := e.getPods(); len(res.Pods) != 110 {
		t.Fatalf("%d pods desired, want 110", len(res.Pods))
	}
	// No cleanupPods: stopping the agent and sweeping the namespace
	// through CRI removes 110 pods faster than 110 deletes.
}

// metadata.uid is mqlet's: a uid that is a path, or another pod's uid, is
// refused naming metadata.uid, and nothing is created in containerd or on
// disk outside <stateDir>/pods.
func TestClientUIDsRefused(t *testing.T) {
	e := newPodEnv(t, "")
	e.cleanupPods("victim")
	e.apply(e.pod("victim", "Always", "sleep 3600"), apiv1.Succeeded, podReadyTimeout)
	res := e.getPods()
	if len(res.Pods) != 1 {
		t.Fatalf("get: %s", dump(res.Pods))
	}
	victimUID := string(res.Pods[0].UID)
	victimSandboxes := e.sandboxIDs("victim")

	withUID := func(name, uid string) []byte {
		return []byte(strings.Replace(string(e.pod(name, "Always", "sleep 3600")), "metadata:\n", fmt.Sprintf("metadata:\n  uid: %q\n", uid), 1))
	}
	outside := filepath.Clean(filepath.Join(e.stateDir, "pods", "../../x"))
	r := e.apply(withUID("evil", "../../x"), apiv1.Failed, 30*time.Second)
	if !strings.Contains(r.Message, "metadata.uid") || !strings.Contains(r.Message, "not a UUID") {
		t.Fatalf("uid ../../x answered %q", r.Message)
	}
	r = e.apply(withUID("twin", victimUID), apiv1.Failed, 30*time.Second)
	if !strings.Contains(r.Message, "metadata.uid") || !strings.Contains(r.Message, "belongs to Pod "+e.ns+"/victim") {
		t.Fatalf("another pod's uid answered %q", r.Message)
	}
	if _, err := os.Stat(outside); !os.IsNotExist(err) {
		t.Fatalf("%s exists (%v): a uid escaped the pods dir", outside, err)
	}
	for _, n := range []string{"evil", "twin"} {
		if s := len(e.cri.Sandboxes(e.ns, n)); s != 0 {
			t.Fatalf("refused pod %s has %d sandboxes", n, s)
		}
	}
	if got := e.sandboxIDs("victim"); !slices.Equal(got, victimSandboxes) || len(e.cri.Running(e.ns, "victim")) != 1 {
		t.Fatalf("victim's sandboxes %v -> %v", victimSandboxes, got)
	}
	if entries, err := os.ReadDir(filepath.Join(e.stateDir, "pods")); err == nil {
		for _, ent := range entries {
			if ent.Name() != victimUID {
				t.Fatalf("unexpected entry %q in the pods dir", ent.Name())
			}
		}
	}
	// Repeating the pod's own uid is accepted.
	e.apply(withUID("victim", victimUID), apiv1.Succeeded, podReadyTimeout)
}
