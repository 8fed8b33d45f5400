package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	apiv1 "github.com/mqlet/mqlet/api/v1"
	"github.com/mqlet/mqlet/mqtt/broker"
)

// publishFleetNode publishes what an agent retains for node name.
func publishFleetNode(t *testing.T, url, name, state string, ready v1.ConditionStatus, pods int, nodeLabels map[string]string) {
	t.Helper()
	pub := testClient(t, url, "pub-"+name)
	s := apiv1.Scheme{Node: name}
	st, _ := json.Marshal(apiv1.NodeState{State: state, BootID: "boot-" + name, Version: "v0.9." + name[len(name)-1:], StartedAt: testNow.Add(-time.Hour)})
	mustPublish(t, pub, s.State(), true, st)
	node := v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: nodeLabels, CreationTimestamp: ago(48 * time.Hour)},
		Status: v1.NodeStatus{
			Conditions: []v1.NodeCondition{{Type: v1.NodeReady, Status: ready}},
			Addresses:  []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: "192.0.2.1"}},
			NodeInfo:   v1.NodeSystemInfo{OSImage: "Debian GNU/Linux 12 (bookworm)", ContainerRuntimeVersion: "containerd://1.6.20"},
		},
	}
	nb, _ := json.Marshal(node)
	mustPublish(t, pub, s.NodeTopic(), true, nb)
	for i := 0; i < pods; i++ {
		pb, _ := json.Marshal(v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "default"}})
		mustPublish(t, pub, s.Pod("default", "p"+string(rune('a'+i))), true, pb)
	}
}

func TestGetNodes(t *testing.T) {
	url := startBroker(t, broker.Options{})
	publishFleetNode(t, url, "gw1", "online", v1.ConditionTrue, 2, map[string]string{"site": "north"})
	publishFleetNode(t, url, "gw2", "offline", v1.ConditionTrue, 0, map[string]string{"site": "south"})
	publishFleetNode(t, url, "gw3", "online", v1.ConditionFalse, 1, map[string]string{"site": "north"})
	// A pod topic without any node state is not a node.
	mustPublish(t, testClient(t, url, "stray"), apiv1.Scheme{Node: "ghost"}.Pod("default", "x"), true, []byte(`{}`))

	res := runCLIEnv(t, map[string]string{envBroker: url}, "", "get", "nodes")
	want := "" +
		"NAME   STATUS     AGE   VERSION   PODS\n" +
		"gw1    online     2d    v0.9.1    2\n" +
		"gw2    offline    2d    v0.9.2    0\n" +
		"gw3    NotReady   2d    v0.9.3    1\n"
	if res.code != 0 || res.stdout != want {
		t.Fatalf("get nodes (no --node needed):\n%v\nwant:\n%s", res, want)
	}
	res = runCLIEnv(t, map[string]string{envBroker: url}, "", "get", "nodes", "-l", "site=north", "-o", "name")
	if res.code != 0 || res.stdout != "node/gw1\nnode/gw3\n" {
		t.Fatalf("get nodes -l site=north -o name: %v", res)
	}
	res = runCLIEnv(t, map[string]string{envBroker: url}, "", "get", "node", "gw2", "-o", "wide")
	if res.code != 0 || !strings.Contains(res.stdout, "192.0.2.1") || !strings.Contains(res.stdout, "containerd://1.6.20") || strings.Contains(res.stdout, "gw1") {
		t.Fatalf("get node gw2 -o wide: %v", res)
	}
	res = runCLIEnv(t, map[string]string{envBroker: url}, "", "get", "node", "gw9", "--retained-wait", "500ms")
	if res.code != 1 || !strings.Contains(res.stderr, `no node named "gw9" under prefix mqlet/v1`) {
		t.Fatalf("get node gw9: %v", res)
	}
	res = runCLIEnv(t, map[string]string{envBroker: url}, "", "get", "nodes", "--prefix", "other/v1", "--retained-wait", "300ms")
	if res.code != 0 || res.stdout != "" || res.stderr != "No resources found under prefix other/v1\n" {
		t.Fatalf("get nodes under an empty prefix: %v", res)
	}
}

func TestGetLabelSelectorAndNames(t *testing.T) {
	url := startBroker(t, broker.Options{})
	pods := cannedPods()
	pods[0].Labels = map[string]string{"app": "web"}
	pods[2].Labels = map[string]string{"app": "web", "tier": "canary"}
	cm := &v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "cfg", Namespace: "default", Labels: map[string]string{"app": "web"}}}
	agent := getAgent(t, url, apiv1.GetResult{Pods: pods, ConfigMaps: []*v1.ConfigMap{cm}})
	res := runCLI(t, url, "", "get", "all", "-l", "app=web,tier!=canary", "-o", "name")
	if res.code != 0 || res.stdout != "pod/web\nconfigmap/cfg\n" {
		t.Fatalf("get all -l app=web,tier!=canary -o name: %v", res)
	}
	var sent apiv1.GetRequest
	if err := json.Unmarshal(agent.only(t).Payload, &sent); err != nil || sent.LabelSelector != "app=web,tier!=canary" {
		t.Errorf("the selector is not sent to the agent, which filters by it: %s", agent.only(t).Payload)
	}
	res = runCLI(t, url, "", "get", "pods", "-l", "app=db", "-n", "default")
	if res.code != 0 || res.stdout != "" || res.stderr != "No resources found in default namespace.\n" {
		t.Fatalf("a selector matching nothing: %v", res)
	}
	res = runCLI(t, url, "", "get", "pods", "-l", "app in (")
	if res.code != 2 {
		t.Fatalf("a bad selector is bad usage: %v", res)
	}
}

func TestGetPodsWatch(t *testing.T) {
	url := startBroker(t, broker.Options{})
	c := testClient(t, url, "publisher")
	pods := cannedPods()
	pods[0].Labels = map[string]string{"app": "web"}
	b, _ := json.Marshal(pods[0])
	mustPublish(t, c, scheme.Pod("default", "web"), true, b)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out, errOut syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"--node", "n1", "--broker", url, "get", "pods", "-n", "default", "-w", "-l", "app=web"},
			env{getenv: func(string) string { return "" }, stdout: &out, stderr: &errOut, now: func() time.Time { return testNow }})
	}()
	waitFor := func(what string) {
		t.Helper()
		deadline := time.After(15 * time.Second)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for !strings.Contains(out.String(), what) {
			select {
			case <-tick.C:
			case code := <-done:
				t.Fatalf("watch ended early with %d:\n%s\n%s", code, out.String(), errOut.String())
			case <-deadline:
				t.Fatalf("watch did not print %q:\n%s\n%s", what, out.String(), errOut.String())
			}
		}
	}
	waitFor("web                          2/2        Running")
	// A change: the pod crash-loops; then it is deleted.
	pods[0].Status.ContainerStatuses[0].Ready = false
	pods[0].Status.ContainerStatuses[0].State = v1.ContainerState{Waiting: &v1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}}
	b, _ = json.Marshal(pods[0])
	mustPublish(t, c, scheme.Pod("default", "web"), true, b)
	waitFor("web                          1/2        CrashLoopBackOff")
	mustPublish(t, c, scheme.Pod("default", "web"), true, nil)
	waitFor("Deleted")
	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Errorf("get -w ended by Ctrl-C exited %d: %s", code, errOut.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("get -w did not stop when cancelled")
	}
	if lines := strings.Split(strings.TrimSpace(out.String()), "\n"); len(lines) != 4 || !strings.HasPrefix(lines[0], "NAME") {
		t.Errorf("want a header and three rows:\n%s", out.String())
	}
}

// delete node X clears what X left retained (state, node, pods), refuses
// while X is online unless --force, and says not found for a node that
// left nothing.
func TestDeleteNodeClearsItsRetainedTopics(t *testing.T) {
	url := startBroker(t, broker.Options{})
	c := testClient(t, url, "publisher")
	publishNode := func(state string) {
		mustPublish(t, c, scheme.State(), true, []byte(`{"state":"`+state+`","bootId":"b1","version":"test","ts":"2026-03-01T11:00:00Z"}`))
		mustPublish(t, c, scheme.NodeTopic(), true, []byte(`{"metadata":{"name":"n1"}}`))
		mustPublish(t, c, scheme.Pod("default", "web"), true, []byte(`{"metadata":{"name":"web","namespace":"default"}}`))
		mustPublish(t, c, scheme.Pod("edge", "db"), true, []byte(`{"metadata":{"name":"db","namespace":"edge"}}`))
	}
	publishNode("online")
	vars := map[string]string{envBroker: url}
	res := runCLIEnv(t, vars, "", "--retained-wait", "300ms", "delete", "node", "n1")
	if res.code != 1 || !strings.Contains(res.stderr, "node n1 is online") {
		t.Fatalf("delete node of an online node: want it refused: %v", res)
	}
	retainedOf := func() []string {
		t.Helper()
		got := make(chan string, 16)
		sub := testClient(t, url, fmt.Sprint("reader-", time.Now().UnixNano()))
		tok := sub.Subscribe("mqlet/v1/n1/#", 1, func(_ paho.Client, m paho.Message) {
			if m.Retained() && len(m.Payload()) > 0 {
				got <- m.Topic()
			}
		})
		if !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
			t.Fatal(tok.Error())
		}
		var topics []string
		for {
			select {
			case tp := <-got:
				topics = append(topics, tp)
			case <-time.After(500 * time.Millisecond):
				return topics
			}
		}
	}
	if n := len(retainedOf()); n != 4 {
		t.Fatalf("a refused delete node cleared topics: %d of 4 left", n)
	}
	publishNode("offline")
	res = runCLIEnv(t, vars, "", "--retained-wait", "300ms", "delete", "node", "n1")
	if res.code != 0 || res.stdout != "node/n1 deleted (4 retained topics cleared)\n" {
		t.Fatalf("delete node of an offline node: %v", res)
	}
	if left := retainedOf(); len(left) != 0 {
		t.Fatalf("retained topics left after delete node: %v", left)
	}
	publishNode("online")
	if res := runCLIEnv(t, vars, "", "--retained-wait", "300ms", "delete", "node", "n1", "--force"); res.code != 0 {
		t.Fatalf("delete node --force of an online node: %v", res)
	}
	if res := runCLIEnv(t, vars, "", "--retained-wait", "300ms", "delete", "node", "ghost"); res.code != 1 || !strings.Contains(res.stderr, `nodes "ghost" not found`) {
		t.Fatalf("delete node of an unknown node: %v", res)
	}
	if res := runCLIEnv(t, vars, "", "delete", "pod", "web", "--force"); res.code != 2 {
		t.Fatalf("--force on a pod delete: want usage error: %v", res)
	}
}
