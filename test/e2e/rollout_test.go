package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	apiv1 "github.com/mqlet/mqlet/api/v1"
	"github.com/mqlet/mqlet/internal/testutil/mosquitto"
)

// rolloutPod is the manifest of pod web: image and the sleep it runs.
func rolloutPod(ns, image, sleep string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: web
  namespace: %s
spec:
  restartPolicy: Always
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: %s
    imagePullPolicy: Never
    command: ["sleep", "%s"]
`, ns, image, sleep)
}

// rolloutDoc is the latest rollout document id the observer saw.
func rolloutDoc(t *testing.T, mq *Client, id string) *apiv1.Rollout {
	t.Helper()
	var doc *apiv1.Rollout
	for _, m := range mq.Messages() {
		if m.Topic != apiv1.RolloutTopic(prefix, id) || len(m.Payload) == 0 {
			continue
		}
		var d apiv1.Rollout
		if err := json.Unmarshal(m.Payload, &d); err != nil {
			t.Fatalf("rollout document: %v", err)
		}
		doc = &d
	}
	return doc
}

// retainedPods reads every node's retained pod status, as a dashboard
// subscribing now gets them: node -> ns/name -> pod.
func retainedPods(t *testing.T, url string) map[string]map[string]*v1.Pod {
	t.Helper()
	c := Connect(t, url)
	c.Subscribe(prefix + "/+/pods/+/+")
	time.Sleep(time.Second) // nothing marks the end of the retained burst; one second of it
	out := map[string]map[string]*v1.Pod{}
	for _, m := range c.Messages() {
		parts := strings.Split(strings.TrimPrefix(m.Topic, prefix+"/"), "/")
		if len(parts) != 4 {
			continue
		}
		if out[parts[0]] == nil {
			out[parts[0]] = map[string]*v1.Pod{}
		}
		key := parts[2] + "/" + parts[3]
		if len(m.Payload) == 0 {
			delete(out[parts[0]], key)
			continue
		}
		var p v1.Pod
		if err := json.Unmarshal(m.Payload, &p); err != nil {
			t.Fatalf("pod status on %s: %v", m.Topic, err)
		}
		out[parts[0]][key] = &p
	}
	return out
}

func podIsReady(p *v1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == v1.PodReady && c.Status == v1.ConditionTrue {
			return true
		}
	}
	return false
}

// checkRolloutCounters checks every counter of the rollout document
// against the nodes' own retained pod topics: a node holds the rollout's
// pod (isNew: its spec) exactly when the document counts it applied;
// succeeded ones have it Ready with the uid and generation the node
// answered; failed ones have it not Ready; rolled back ones hold the old
// spec again; cancelled and pending ones do not hold the new one.
func checkRolloutCounters(t *testing.T, url string, doc *apiv1.Rollout, ns string, isNew func(*v1.Pod) bool) {
	t.Helper()
	key := ns + "/web"
	var seen apiv1.RolloutTotals
	var why []string
	Eventually(t, 60*time.Second, "the nodes' retained pods agree with the rollout document", func() bool {
		pods := retainedPods(t, url)
		seen = apiv1.RolloutTotals{Targeted: len(doc.Nodes)}
		why = why[:0]
		for _, n := range doc.Nodes {
			p := pods[n.Node][key]
			holdsNew := p != nil && isNew(p)
			if holdsNew {
				seen.Applied++
			}
			switch n.Phase {
			case apiv1.NodeSucceeded:
				if holdsNew && podIsReady(p) && len(n.Pods) == 1 && string(p.UID) == n.Pods[0].UID && p.Status.ObservedGeneration >= n.Pods[0].Generation {
					seen.Succeeded++
				} else {
					why = append(why, n.Node+": counted succeeded, its retained pod is not the new one Ready")
				}
			case apiv1.NodeFailed:
				if holdsNew && !podIsReady(p) {
					seen.Failed++
				} else {
					why = append(why, n.Node+": counted failed, its retained pod is not the new one failing")
				}
			case apiv1.NodeRolledBack:
				if p != nil && !holdsNew && podIsReady(p) {
					seen.RolledBack++
				} else {
					why = append(why, n.Node+": counted rolled back, its retained pod is not the old one Ready")
				}
			case apiv1.NodeCancelled:
				if !holdsNew {
					seen.Cancelled++
				} else {
					why = append(why, n.Node+": counted cancelled, it holds the new pod")
				}
			case apiv1.NodePending, apiv1.NodeSent, apiv1.NodeApplied:
				seen.Pending++
			}
		}
		want := doc.Totals
		want.Offline = 0
		return len(why) == 0 && seen == want
	})
	if len(why) > 0 {
		t.Fatalf("counters against the retained pods: %v", why)
	}
	t.Logf("rollout %s: totals %+v match the nodes' retained pods", doc.ID, doc.Totals)
}

// Over four nodes in waves of two, the second node's pod fails (its
// containerd lacks the new image, imagePullPolicy Never): the rollout stops
// after the first wave naming that node and why, the other two get
// nothing, and --rollback gives both first-wave nodes their previous pod
// back. The fourth node has no runtime at all: it is never commanded.
func TestRolloutStopsAfterAFailedWaveAndRollsBack(t *testing.T) {
	eps := fleetEndpoints(t)
	broker := mosquitto.Start(t)
	mq := Connect(t, broker.URL())
	mq.Subscribe(prefix + "/#")
	suffix := strconv.FormatInt(time.Now().UnixNano()%1e9, 36)
	ns, group := "e2e-ro-"+suffix, "ro-"+suffix
	// The new image exists on the first node's containerd only.
	newImage := "docker.io/mqlet/busybox:rollout-" + suffix
	sock := strings.TrimPrefix(eps[0], "unix://")
	if out, err := exec.Command("ctr", "-n", "k8s.io", "-a", sock, "images", "tag", "docker.io/mqlet/busybox:test", newImage).CombinedOutput(); err != nil {
		t.Fatalf("tagging %s: %v: %s", newImage, err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ctr", "-n", "k8s.io", "-a", sock, "images", "rm", newImage).Run() })
	var names []string
	for i := 0; i < 4; i++ {
		name := fmt.Sprintf("e2e-ro-%s-%d", suffix, i)
		opts := AgentOpts{Node: name, Broker: broker.URL(), Config: podTestConfig(t.TempDir(), ""), Args: []string{"--groups", group}}
		if i < 3 {
			opts.CRI = eps[i]
			_, rt := connectCRIAt(t, eps[i])
			t.Cleanup(func() { sweepNamespace(t, rt, ns) })
		}
		mark := mq.Mark()
		StartAgent(t, opts)
		mq.WaitState(mark, name, "online", 30*time.Second)
		names = append(names, name)
	}
	dir := t.TempDir()
	v1File, v2File := dir+"/v1.yaml", dir+"/v2.yaml"
	if err := os.WriteFile(v1File, []byte(rolloutPod(ns, "docker.io/mqlet/busybox:test", "3600")), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(v2File, []byte(rolloutPod(ns, newImage, "3601")), 0o600); err != nil {
		t.Fatal(err)
	}
	// The first wave's nodes run v1 (their own pod) before the rollout.
	for _, n := range names[:2] {
		if code, out, errOut := ctl(t, "--broker", broker.URL(), "--node", n, "apply", "-f", v1File, "--timeout", "90s"); code != 0 {
			t.Fatalf("v1 on %s: exit %d\n%s%s", n, code, out, errOut)
		}
	}
	id := "web-v2-" + suffix
	start := time.Now()
	code, out, errOut := ctl(t, "--broker", broker.URL(), "rollout", "start", "-f", v2File, "--group", group, "--batch", "2", "--rollback", "--id", id, "--node-timeout", "60s", "--timeout", "100s")
	t.Logf("rollout with rollback took %v:\n%s%s", time.Since(start), out, errOut)
	if code != 1 {
		t.Fatalf("want exit 1 (aborted), got %d", code)
	}
	failing := names[1]
	if !regexp.MustCompile(`Aborted: 1 node\(s\) failed \(` + failing + `: .*ErrImageNeverPull`).MatchString(out) {
		t.Errorf("the report does not name %s and why", failing)
	}
	doc := rolloutDoc(t, mq, id)
	if doc == nil {
		t.Fatal("no rollout document on the broker")
	}
	want := fmt.Sprintf("%s=RolledBack %s=RolledBack %s=Cancelled %s=Cancelled", names[0], names[1], names[2], names[3])
	// The first node is Cancelled instead when the second one failed
	// before the first was even sent its apply (its objects still being
	// read): possible on a very loaded machine, and correct.
	alsoOK := fmt.Sprintf("%s=Cancelled %s=RolledBack %s=Cancelled %s=Cancelled", names[0], names[1], names[2], names[3])
	var got []string
	for _, n := range doc.Nodes {
		got = append(got, n.Node+"="+n.Phase)
	}
	if g := strings.Join(got, " "); (g != want && g != alsoOK) || doc.Phase != apiv1.RolloutAborted {
		t.Fatalf("document %s: %s, want %s", doc.Phase, got, want)
	} else if g == alsoOK {
		t.Logf("the first node was cancelled before its apply; only the failed node was rolled back")
	}
	// The unsent nodes got no command at all.
	for _, m := range mq.Messages() {
		for _, n := range names[2:] {
			if strings.HasPrefix(m.Topic, prefix+"/"+n+"/reply/") {
				t.Errorf("%s answered a command of the aborted rollout: %s", n, m.Payload)
			}
		}
	}
	checkRolloutCounters(t, broker.URL(), doc, ns, func(p *v1.Pod) bool {
		return len(p.Spec.Containers) == 1 && p.Spec.Containers[0].Image == newImage
	})
	// Both first-wave nodes run web again in their runtime (the retained
	// pods above hold v1's spec, Ready).
	for i, n := range names[:2] {
		cri, _ := connectCRIAt(t, eps[i])
		Eventually(t, podReadyTimeout, n+" runs web", func() bool { return len(cri.Running(ns, "web")) == 1 })
	}
}

// A rollout over three nodes, one wave each, whose mqletctl is killed in
// the first wave is resumed by a second mqletctl from the document; the
// third node is offline meanwhile, counts as pending (not failed) and the
// rollout finishes when it returns. Every counter is then checked against
// the nodes' retained pods.
func TestRolloutResumedAfterAKillWaitsForAnOfflineMember(t *testing.T) {
	eps := fleetEndpoints(t)
	broker := mosquitto.Start(t)
	mq := Connect(t, broker.URL())
	mq.Subscribe(prefix + "/#")
	suffix := strconv.FormatInt(time.Now().UnixNano()%1e9, 36)
	ns, group := "e2e-rr-"+suffix, "rr-"+suffix
	var names []string
	var agents []*Agent
	for i, ep := range eps {
		name := fmt.Sprintf("e2e-rr-%s-%d", suffix, i)
		_, rt := connectCRIAt(t, ep)
		t.Cleanup(func() { sweepNamespace(t, rt, ns) })
		mark := mq.Mark()
		agents = append(agents, StartAgent(t, AgentOpts{Node: name, Broker: broker.URL(), CRI: ep, Config: podTestConfig(t.TempDir(), ""), Args: []string{"--groups", group}}))
		mq.WaitState(mark, name, "online", 30*time.Second)
		names = append(names, name)
	}
	offline := agents[2]
	mark := mq.Mark()
	offline.Stop()
	mq.WaitState(mark, names[2], "offline", 30*time.Second)

	file := t.TempDir() + "/web.yaml"
	if err := os.WriteFile(file, []byte(rolloutPod(ns, "docker.io/mqlet/busybox:test", "3602")), 0o600); err != nil {
		t.Fatal(err)
	}
	id := "rr-" + suffix
	first := exec.Command(mqletctlBin(t), "--broker", broker.URL(), "rollout", "start", "-f", file, "--group", group, "--batch", "1", "--id", id, "--timeout", "100s")
	first.Env = append(os.Environ(), "MQLETCTL_SIGN_KEY=", "MQLETCTL_NODE=", "MQLETCTL_BROKER=")
	var firstOut bytes.Buffer
	first.Stdout, first.Stderr = &firstOut, &firstOut
	if err := first.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			_ = first.Process.Kill()
			_ = first.Wait() // the output is complete (an error if already waited)
			t.Logf("the first mqletctl printed:\n%s", firstOut.String())
		}
	})
	// Killed once the first node was sent its command (mid-wave).
	mq.WaitFor(0, 60*time.Second, "the first node sent its command", func(m Msg) bool {
		var d apiv1.Rollout
		return m.Topic == apiv1.RolloutTopic(prefix, id) && json.Unmarshal(m.Payload, &d) == nil && len(d.Nodes) == 3 &&
			(d.Nodes[0].Phase == apiv1.NodeSent || d.Nodes[0].Phase == apiv1.NodeApplied)
	})
	_ = first.Process.Kill()
	_ = first.Wait()
	t.Logf("first mqletctl killed:\n%s", firstOut.String())

	second := exec.Command(mqletctlBin(t), "--broker", broker.URL(), "rollout", "resume", id, "--force", "--timeout", "100s")
	second.Env = first.Env
	var secondOut bytes.Buffer
	second.Stdout, second.Stderr = &secondOut, &secondOut
	if err := second.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- second.Wait() }()
	// The offline node is pending, the rollout waits for it.
	mq.WaitFor(0, 100*time.Second, "two nodes succeeded, the offline one pending", func(m Msg) bool {
		var d apiv1.Rollout
		return m.Topic == apiv1.RolloutTopic(prefix, id) && json.Unmarshal(m.Payload, &d) == nil &&
			d.Totals.Succeeded == 2 && d.Totals.Pending == 1 && d.Totals.Offline == 1 && d.Totals.Failed == 0 && d.Phase == apiv1.RolloutRunning
	})
	returned := time.Now()
	offline.Restart()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("resume: %v\n%s", err, secondOut.String())
		}
	case <-time.After(100 * time.Second):
		_ = second.Process.Kill()
		t.Fatalf("the resumed rollout did not finish after the offline node returned:\n%s", secondOut.String())
	}
	t.Logf("resumed rollout finished %v after the offline node was restarted:\n%s", time.Since(returned), secondOut.String())
	doc := rolloutDoc(t, mq, id)
	want := apiv1.RolloutTotals{Targeted: 3, Applied: 3, Succeeded: 3}
	if doc.Phase != apiv1.RolloutSucceeded || doc.Totals != want {
		t.Fatalf("document %s %+v, want Succeeded %+v", doc.Phase, doc.Totals, want)
	}
	checkRolloutCounters(t, broker.URL(), doc, ns, func(p *v1.Pod) bool {
		return len(p.Spec.Containers) == 1 && strings.Join(p.Spec.Containers[0].Command, " ") == "sleep 3602"
	})

	// mqletctl for the fleet on the same nodes: a group apply while the
	// third member is offline answers one row per member, the offline one
	// Pending (offline since), exit 3; get pods --group lists each
	// member's group pods with its node.
	mark = mq.Mark()
	offline.Stop()
	mq.WaitState(mark, names[2], "offline", 30*time.Second)
	side := t.TempDir() + "/side.yaml"
	if err := os.WriteFile(side, podYAML("side", ns, "Always", "sleep 3600"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := ctl(t, "--broker", broker.URL(), "--group", group, "apply", "-f", side, "--timeout", "90s")
	t.Logf("group apply with a member offline: exit %d\n%s%s", code, out, errOut)
	if code != 3 {
		t.Errorf("group apply with a member offline: exit %d, want 3", code)
	}
	for _, n := range names[:2] {
		if !regexp.MustCompile(`(?m)^` + n + `\s+succeeded\s`).MatchString(out) {
			t.Errorf("no succeeded row for %s", n)
		}
	}
	if !regexp.MustCompile(`(?m)^` + names[2] + `\s+Pending\s+offline since `).MatchString(out) {
		t.Errorf("the offline member is not Pending (offline since ...)")
	}
	code, out, errOut = ctl(t, "--broker", broker.URL(), "--group", group, "get", "pods", "-n", ns, "--timeout", "60s")
	t.Logf("get pods --group: exit %d\n%s%s", code, out, errOut)
	// A group's get reads the group's objects only: side, not the
	// rollout's web (each node's own, source node).
	for _, n := range names[:2] {
		if !regexp.MustCompile(`(?m)^` + n + `\s+` + ns + `\s+side\s+1/1\s+Running`).MatchString(out) {
			t.Errorf("get pods --group lacks %s's side", n)
		}
	}
	if strings.Contains(out, " web ") {
		t.Errorf("get pods --group lists the nodes' own web")
	}
	if code != 3 || !strings.Contains(errOut, names[2]) {
		t.Errorf("get pods --group with a member offline: exit %d, want 3 naming it", code)
	}
}

// benchFleet starts three mqlets in one group, each on its own containerd.
func benchFleet(b *testing.B, tag string) (url, group, ns string) {
	b.Helper()
	eps := fleetEndpoints(b)
	broker := mosquitto.Start(b)
	suffix := strconv.FormatInt(time.Now().UnixNano()%1e9, 36)
	ns, group = "e2e-"+tag+"-"+suffix, tag+"-"+suffix
	sub := Connect(b, broker.URL())
	sub.Subscribe(prefix + "/+/state")
	for i, ep := range eps {
		name := fmt.Sprintf("e2e-%s-%s-%d", tag, suffix, i)
		_, rt := connectCRIAt(b, ep)
		b.Cleanup(func() { sweepNamespace(b, rt, ns) })
		StartAgent(b, AgentOpts{Node: name, Broker: broker.URL(), CRI: ep, Config: podTestConfig(b.TempDir(), ""), Args: []string{"--groups", group}})
		sub.WaitState(0, name, "online", 30*time.Second)
	}
	return broker.URL(), group, ns
}

// ctlB runs mqletctl for a benchmark.
func ctlB(b *testing.B, args ...string) (int, string) {
	cmd := exec.Command(mqletctlBin(b), args...)
	cmd.Env = append(os.Environ(), "MQLETCTL_SIGN_KEY=", "MQLETCTL_NODE=", "MQLETCTL_BROKER=")
	out, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode(), string(out)
	} else if err != nil {
		b.Fatal(err)
	}
	return 0, string(out)
}

func percentiles(b *testing.B, took []time.Duration, unit string) {
	slices.Sort(took)
	b.ReportMetric(float64(took[len(took)/2].Milliseconds()), "p50-"+unit)
	b.ReportMetric(float64(took[(len(took)*99)/100].Milliseconds()), "p99-"+unit)
	b.Logf("%s over %d runs: p50 %v, p99 %v, min %v, max %v", unit, len(took), took[len(took)/2], took[(len(took)*99)/100], took[0], took[len(took)-1])
}

// BenchmarkCtlGroupApply measures `mqletctl apply --group` of a new pod to
// three members (each on its own containerd) until it exits 0: every member
// answered succeeded. It includes the CLI's start, reading the members'
// retained states and the connection. Reports p50 and p99.
//
//	go test ./test/e2e/ -run '^$' -bench BenchmarkCtlGroupApply -benchtime 20x
func BenchmarkCtlGroupApply(b *testing.B) {
	url, group, ns := benchFleet(b, "ctlga")
	dir := b.TempDir()
	var took []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		f := fmt.Sprintf("%s/web-%d.yaml", dir, i)
		if err := os.WriteFile(f, podYAML(fmt.Sprintf("web-%d", i), ns, "Always", "sleep 3600"), 0o600); err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		if code, out := ctlB(b, "--broker", url, "--retained-wait", "1s", "apply", "-f", f, "--group", group, "--timeout", "90s"); code != 0 {
			b.Fatalf("apply --group: exit %d\n%s", code, out)
		}
		took = append(took, time.Since(start))
	}
	b.StopTimer()
	percentiles(b, took, "ms")
}

var waveGapRE = regexp.MustCompile(`wave (\d+) sent ([0-9.]+m?s) after wave`)

// BenchmarkRolloutWaveOverhead runs rollouts of a new pod over three nodes
// one wave each, and reports what the rollout adds between waves: from the
// last node of a wave being Ready (its retained status) to the next wave's
// command published, which includes reading the next node's previous
// objects (a get) and republishing the document. Also the whole rollout.
//
//	go test ./test/e2e/ -run '^$' -bench BenchmarkRolloutWaveOverhead -benchtime 5x
func BenchmarkRolloutWaveOverhead(b *testing.B) {
	url, group, ns := benchFleet(b, "rowave")
	dir := b.TempDir()
	var gaps, whole []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		f := fmt.Sprintf("%s/web-%d.yaml", dir, i)
		if err := os.WriteFile(f, podYAML(fmt.Sprintf("web-%d", i), ns, "Always", "sleep 3600"), 0o600); err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		code, out := ctlB(b, "--broker", url, "rollout", "start", "-f", f, "--group", group, "--batch", "1", "--id", fmt.Sprintf("bench-%s-%d", group, i), "--timeout", "180s")
		if code != 0 {
			b.Fatalf("rollout: exit %d\n%s", code, out)
		}
		whole = append(whole, time.Since(start))
		for _, m := range waveGapRE.FindAllStringSubmatch(out, -1) {
			d, err := time.ParseDuration(m[2])
			if err != nil {
				b.Fatal(err)
			}
			gaps = append(gaps, d)
		}
	}
	b.StopTimer()
	if len(gaps) == 0 {
		b.Fatal("no wave gap reported")
	}
	percentiles(b, gaps, "gap-ms")
	percentiles(b, whole, "rollout-ms")
}
