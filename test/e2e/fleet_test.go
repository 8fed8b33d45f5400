package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	internalapi "k8s.io/cri-api/pkg/apis"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	criclient "k8s.io/cri-client/pkg"
	"k8s.io/klog/v2"

	apiv1 "github.com/mqlet/mqlet/api/v1"
	"github.com/mqlet/mqlet/internal/testutil/mosquitto"
)

// FleetEndpointsEnv names two more containerds (comma-separated CRI
// endpoints) for the fleet tests: members of one group run pods of the
// same namespace/name, and mqlet removes a runtime pod of its pod's name
// with another uid, so each member needs a containerd of its own.
// test/run-tests.sh starts them.
const FleetEndpointsEnv = "MQLET_TEST_CRI_ENDPOINTS_FLEET"

// fleetNode is one mqlet of a fleet test with its own containerd.
type fleetNode struct {
	name  string
	agent *Agent
	cri   *CRI
	rt    internalapi.RuntimeService
}

func fleetEndpoints(t testing.TB) []string {
	t.Helper()
	v := os.Getenv(FleetEndpointsEnv)
	eps := strings.Split(v, ",")
	if v == "" || len(eps) < 2 {
		t.Fatalf("%s must name two more containerds (comma-separated CRI endpoints): start them with test/env/containerd-up.sh, each with its own MQLET_TEST_DIR, MQLET_TEST_BRIDGE and MQLET_TEST_SUBNET (test/run-tests.sh does)", FleetEndpointsEnv)
	}
	lockFleet(t, v)
	_, first := ConnectCRI(t)
	return []string{first, eps[0], eps[1]}
}

// lockFleet holds the fleet containerds for the test: e2e shards run in
// parallel processes and share them, and two mqlets on one containerd
// remove each other's pods (each one's GC removes every mqlet sandbox it
// does not desire, whatever its namespace). The lock is a flock on a file
// named by the endpoints, released when the test ends.
func lockFleet(t testing.TB, endpoints string) {
	t.Helper()
	sum := sha256.Sum256([]byte(endpoints))
	path := filepath.Join(os.TempDir(), "mqlet-e2e-fleet-"+hex.EncodeToString(sum[:6])+".lock")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatalf("fleet lock: %v", err)
	}
	start := time.Now()
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) || time.Since(start) > 15*time.Minute {
			f.Close()
			t.Fatalf("fleet lock %s: %v (waited %v)", path, err, time.Since(start))
		}
		time.Sleep(200 * time.Millisecond) // another shard's fleet test holds it
	}
	if waited := time.Since(start); waited > time.Second {
		t.Logf("waited %v for the fleet containerds (another shard's fleet test)", waited.Round(time.Millisecond))
	}
	t.Cleanup(func() { _ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN); f.Close() })
}

func connectCRIAt(t testing.TB, endpoint string) (*CRI, internalapi.RuntimeService) {
	t.Helper()
	ctx, cancel := context.WithTimeout(klog.NewContext(context.Background(), logr.Discard()), 10*time.Second)
	defer cancel()
	svc, err := criclient.NewRemoteRuntimeServiceBuilder().WithEndpoint(endpoint).WithConnectionTimeout(5 * time.Second).WithTracerProvider(nil).Build(ctx)
	if err != nil {
		t.Fatalf("connecting to CRI %s: %v", endpoint, err)
	}
	return &CRI{t: t, svc: svc}, svc
}

// sweepNamespace removes what is left of namespace ns in rt.
func sweepNamespace(t testing.TB, rt internalapi.RuntimeService, ns string) {
	ctx, cancel := context.WithTimeout(klog.NewContext(context.Background(), logr.Discard()), time.Minute)
	defer cancel()
	sbs, err := rt.ListPodSandbox(ctx, &runtimeapi.PodSandboxFilter{LabelSelector: map[string]string{"io.kubernetes.pod.namespace": ns}})
	if err != nil {
		t.Logf("sweep: %v", err)
		return
	}
	for _, sb := range sbs {
		_ = rt.StopPodSandbox(ctx, sb.Id)
		_ = rt.RemovePodSandbox(ctx, sb.Id)
	}
}

// Two mqlets in group line-1 and one outside, on one mosquitto: a group
// apply runs the pod on both members only, each answering on its own reply
// topic; a node command cannot delete the group's pod; a group sync leaves
// node objects alone; a member that leaves the group (live config) loses
// only the group's pods.
func TestGroupCommandsReachMembersOnly(t *testing.T) {
	eps := fleetEndpoints(t)
	broker := mosquitto.Start(t)
	mq := Connect(t, broker.URL())
	mq.Subscribe(prefix + "/#")
	suffix := strconv.FormatInt(time.Now().UnixNano()%1e9, 36)
	ns := "e2e-fleet-" + suffix
	group := "line-" + suffix
	var nodes []*fleetNode
	for i, ep := range eps {
		n := &fleetNode{name: fmt.Sprintf("e2e-fleet-%s-%d", suffix, i)}
		n.cri, n.rt = connectCRIAt(t, ep)
		t.Cleanup(func() { sweepNamespace(t, n.rt, ns) })
		args := []string{}
		if i < 2 {
			args = append(args, "--groups", group)
		}
		mark := mq.Mark()
		n.agent = StartAgent(t, AgentOpts{Node: n.name, Broker: broker.URL(), CRI: ep, Config: podTestConfig(t.TempDir(), ""), Args: args})
		mq.WaitState(mark, n.name, "online", 30*time.Second)
		nodes = append(nodes, n)
	}
	m1, m2, out := nodes[0], nodes[1], nodes[2]
	groupTopic := func(verb, id string) string {
		return apiv1.Scheme{Prefix: prefix}.CommandIn(apiv1.Scope{Group: group}, verb, id)
	}
	final := func(node, id string, timeout time.Duration) apiv1.Reply {
		t.Helper()
		var got apiv1.Reply
		mq.WaitFor(0, timeout, "final reply of "+node+" to "+id, func(m Msg) bool {
			var r apiv1.Reply
			if m.Topic != prefix+"/"+node+"/reply/"+id || json.Unmarshal(m.Payload, &r) != nil || !r.Final() {
				return false
			}
			got = r
			return true
		})
		return got
	}
	// The retained state names the groups.
	for _, n := range []*fleetNode{m1, m2} {
		var st apiv1.NodeState
		for _, m := range mq.Messages() {
			if m.Topic == prefix+"/"+n.name+"/state" {
				_ = json.Unmarshal(m.Payload, &st)
			}
		}
		if len(st.Groups) != 1 || st.Groups[0] != group {
			t.Fatalf("state of %s names groups %v, want [%s]", n.name, st.Groups, group)
		}
	}

	// A group apply runs on both members, each answering with its name.
	web := podYAML("web", ns, "Always", "sleep 3600")
	mq.Publish(groupTopic("apply", "ga1"), web, false)
	for _, n := range []*fleetNode{m1, m2} {
		r := final(n.name, "ga1", podReadyTimeout)
		if r.Phase != apiv1.Succeeded || r.Node != n.name {
			t.Fatalf("group apply on %s: %s %q (node %q)", n.name, r.Phase, r.Message, r.Node)
		}
		if len(n.cri.Running(ns, "web")) != 1 {
			t.Fatalf("web does not run on %s", n.name)
		}
	}
	if len(out.cri.Sandboxes(ns, "web")) != 0 || len(mq.Replies(out.name, "ga1")) != 0 {
		t.Fatalf("the node outside the group took the group's command")
	}
	// The published pod shows its source.
	for _, m := range mq.Messages() {
		if m.Topic == prefix+"/"+m1.name+"/pods/"+ns+"/web" && len(m.Payload) > 0 && !strings.Contains(string(m.Payload), `"mqlet.io/source":"group/`+group+`"`) {
			t.Fatalf("published pod without its source: %s", m.Payload)
		}
	}

	// The node's own commands cannot delete the group's pod.
	mq.Command(m1.name, "delete", "nd1", fmt.Appendf(nil, `{"kind":"Pod","namespace":%q,"name":"web"}`, ns))
	if r := final(m1.name, "nd1", 30*time.Second); r.Phase != apiv1.Failed || !strings.Contains(r.Message, "group/"+group) {
		t.Fatalf("node delete of the group's pod: %s %q", r.Phase, r.Message)
	}
	// A node pod of m1 beside it; a group sync of nothing leaves it.
	mq.Command(m1.name, "apply", "na1", podYAML("own", ns, "Always", "sleep 3600"))
	if r := final(m1.name, "na1", podReadyTimeout); r.Phase != apiv1.Succeeded {
		t.Fatalf("node apply on %s: %s %q", m1.name, r.Phase, r.Message)
	}

	// m2 leaves the group (live config): only the group's pod goes there.
	mq.Command(m2.name, "config", "lv1", []byte(`{"groups":[]}`))
	if r := final(m2.name, "lv1", 30*time.Second); r.Phase != apiv1.Succeeded {
		t.Fatalf("leaving the group: %s %q", r.Phase, r.Message)
	}
	Eventually(t, podGoneTimeout, "web gone from "+m2.name, func() bool { return len(m2.cri.Sandboxes(ns, "web")) == 0 })
	if len(m1.cri.Running(ns, "web")) != 1 {
		t.Fatal("m2 leaving the group stopped web on m1")
	}
	// A group command no longer reaches m2.
	mq.Publish(groupTopic("sync", "gs1"), []byte(`{"apiVersion":"v1","kind":"List","items":[]}`), false)
	if r := final(m1.name, "gs1", podGoneTimeout); r.Phase != apiv1.Succeeded {
		t.Fatalf("group sync on %s: %s %q", m1.name, r.Phase, r.Message)
	}
	Eventually(t, podGoneTimeout, "web gone from "+m1.name, func() bool { return len(m1.cri.Sandboxes(ns, "web")) == 0 })
	if len(m1.cri.Running(ns, "own")) != 1 {
		t.Fatal("the group sync stopped the node's own pod")
	}
	if rs := mq.Replies(m2.name, "gs1"); len(rs) != 0 {
		t.Fatalf("m2 answered a group command after leaving: %+v", rs[0])
	}
	mq.Command(m1.name, "delete", "nd2", fmt.Appendf(nil, `{"kind":"Pod","namespace":%q,"name":"own"}`, ns))
	if r := final(m1.name, "nd2", podGoneTimeout); r.Phase != apiv1.Succeeded {
		t.Fatalf("node delete of its own pod: %s %q", r.Phase, r.Message)
	}
}

// BenchmarkGroupApply measures a group apply to three members, each on its
// own containerd: from the publish on the group topic until every member
// answered succeeded (its pod runs). Each iteration applies a new pod, so
// every run starts a sandbox and a container on each member. Reports p50
// and p99 over b.N runs.
//
//	go test ./test/e2e/ -run '^$' -bench BenchmarkGroupApply -benchtime 20x
func BenchmarkGroupApply(b *testing.B) {
	v := os.Getenv(FleetEndpointsEnv)
	eps := strings.Split(v, ",")
	if v == "" || len(eps) < 2 {
		b.Fatalf("%s must name two more containerds", FleetEndpointsEnv)
	}
	lockFleet(b, v)
	_, first := ConnectCRI(b)
	eps = []string{first, eps[0], eps[1]}
	broker := mosquitto.Start(b)
	mq := Connect(b, broker.URL())
	mq.Subscribe(prefix + "/+/reply/#")
	suffix := strconv.FormatInt(time.Now().UnixNano()%1e9, 36)
	ns, group := "e2e-fleetbench-"+suffix, "bench-"+suffix
	var names []string
	for i, ep := range eps {
		name := fmt.Sprintf("e2e-fleetbench-%s-%d", suffix, i)
		StartAgent(b, AgentOpts{Node: name, Broker: broker.URL(), CRI: ep, Config: podTestConfig(b.TempDir(), ""), Args: []string{"--groups", group}})
		names = append(names, name)
	}
	sub := Connect(b, broker.URL())
	sub.Subscribe(prefix + "/+/state")
	for _, n := range names {
		sub.WaitState(0, n, "online", 30*time.Second)
	}
	topic := func(verb, id string) string {
		return apiv1.Scheme{Prefix: prefix}.CommandIn(apiv1.Scope{Group: group}, verb, id)
	}
	var took []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		id := fmt.Sprintf("bench-%d", i)
		from := mq.Mark()
		start := time.Now()
		mq.Publish(topic("apply", id), podYAML(fmt.Sprintf("web-%d", i), ns, "Always", "sleep 3600"), false)
		for _, n := range names {
			mq.WaitFor(from, podReadyTimeout, n+" succeeded "+id, func(m Msg) bool {
				var r apiv1.Reply
				return m.Topic == prefix+"/"+n+"/reply/"+id && json.Unmarshal(m.Payload, &r) == nil && r.Phase == apiv1.Succeeded
			})
		}
		took = append(took, time.Since(start))
	}
	b.StopTimer()
	slices.Sort(took)
	b.ReportMetric(float64(took[len(took)/2].Milliseconds()), "p50-ms")
	b.ReportMetric(float64(took[(len(took)*99)/100].Milliseconds()), "p99-ms")
	mq.Publish(topic("sync", "bench-end"), []byte(`{"apiVersion":"v1","kind":"List","items":[]}`), false)
	for _, n := range names {
		mq.WaitFor(0, podGoneTimeout, n+" emptied", func(m Msg) bool {
			var r apiv1.Reply
			return m.Topic == prefix+"/"+n+"/reply/bench-end" && json.Unmarshal(m.Payload, &r) == nil && r.Final()
		})
	}
}
