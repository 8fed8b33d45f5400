package main

import (
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/mqlet/mqlet/mqtt/broker"

	apiv1 "github.com/mqlet/mqlet/api/v1"
)

func publishNode(t *testing.T, url string, state string) {
	t.Helper()
	publishNodeWith(t, testClient(t, url, "publisher"), state)
}

// publishNodeWith publishes node n1's retained state and node object.
func publishNodeWith(t *testing.T, c paho.Client, state string) {
	t.Helper()
	st, _ := json.Marshal(apiv1.NodeState{State: state, BootID: "b00t-1", Seq: 42, Version: "v1.2.3",
		StartedAt: testNow.Add(-2 * time.Hour), TS: testNow.Add(-time.Minute)})
	node := v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "n1"},
		Status: v1.NodeStatus{
			Capacity:    v1.ResourceList{v1.ResourceCPU: resource.MustParse("4"), v1.ResourceMemory: resource.MustParse("2Gi"), v1.ResourcePods: resource.MustParse("110")},
			Allocatable: v1.ResourceList{v1.ResourceCPU: resource.MustParse("3500m")},
			NodeInfo:    v1.NodeSystemInfo{OSImage: "Debian GNU/Linux 12", Architecture: "arm64"},
			Conditions: []v1.NodeCondition{
				{Type: v1.NodeMemoryPressure, Status: v1.ConditionFalse},
				{Type: v1.NodeDiskPressure, Status: v1.ConditionTrue},
				{Type: v1.NodeReady, Status: v1.ConditionTrue, Reason: "KubeletReady", Message: "mqlet is ready"},
			},
		},
	}
	nb, _ := json.Marshal(node)
	mustPublish(t, c, scheme.State(), true, st)
	mustPublish(t, c, scheme.NodeTopic(), true, nb)
}

func TestStatusReadsRetainedTopics(t *testing.T) {
	url := startBroker(t, broker.Options{})
	publishNode(t, url, "online")
	start := time.Now()
	// A long retained wait: status must return as soon as both topics came.
	res := runCLI(t, url, "", "status", "--retained-wait", "20s")
	if res.code != 0 {
		t.Fatalf("status: %v", res)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("status took %v though both retained topics exist", took)
	}
	for _, want := range []string{
		"Node:              n1\n",
		"State:             online\n",
		"Seq:               42\n",
		"Boot ID:           b00t-1\n",
		"Version:           v1.2.3\n",
		"Started:           2026-03-01T10:00:00Z (120m ago)\n",
		"Ready:             True (KubeletReady: mqlet is ready)\n",
		"Pressure:          DiskPressure\n",
		"Capacity:          cpu=4, memory=2Gi, pods=110\n",
		"Allocatable:       cpu=3500m\n",
		"OS:                Debian GNU/Linux 12 arm64\n",
	} {
		if !strings.Contains(res.stdout, want) {
			t.Errorf("status output lacks %q:\n%s", want, res.stdout)
		}
	}
	if strings.Contains(res.stdout, "Runtime:") {
		t.Errorf("status prints an empty runtime version:\n%s", res.stdout)
	}
}

func TestStatusOfflineExitsOne(t *testing.T) {
	url := startBroker(t, broker.Options{})
	publishNode(t, url, "offline")
	res := runCLI(t, url, "", "status", "-o", "json")
	if res.code != 1 {
		t.Fatalf("status of an offline node: want exit 1, got %v", res)
	}
	var rep statusReport
	if err := json.Unmarshal([]byte(res.stdout), &rep); err != nil {
		t.Fatalf("status -o json: %v\n%v", err, res)
	}
	if rep.State == nil || rep.State.State != "offline" || rep.Info == nil || rep.Info.Name != "n1" {
		t.Errorf("status report = %+v", rep)
	}
}

func TestStatusWithoutRetainedState(t *testing.T) {
	url := startBroker(t, broker.Options{})
	start := time.Now()
	res := runCLI(t, url, "", "status", "--retained-wait", "300ms")
	if res.code != 1 || !strings.Contains(res.stdout, "State:") || !strings.Contains(res.stdout, "unknown (no retained state message") ||
		!strings.Contains(res.stderr, `no node named "n1" under prefix mqlet/v1`) {
		t.Fatalf("status with nothing published: %v", res)
	}
	if took := time.Since(start); took < 300*time.Millisecond || took > 10*time.Second {
		t.Errorf("status waited %v for absent retained topics, want about --retained-wait", took)
	}
}

// A command to a node whose retained state says offline returns at once:
// queued (exit 3), saying since when, and the command is at the broker;
// --wait-offline waits for the reply instead.
func TestCommandToAnOfflineNodeIsQueued(t *testing.T) {
	url := startBroker(t, broker.Options{})
	c := testClient(t, url, "old-agent")
	mustPublish(t, c, scheme.State(), true, []byte(`{"state":"offline","bootId":"b1","version":"test","ts":"2026-03-01T11:00:00Z"}`))
	var got []string
	var mu sync.Mutex
	tok := c.Subscribe(scheme.CommandFilters()[0], 1, func(_ paho.Client, m paho.Message) {
		mu.Lock()
		got = append(got, m.Topic())
		mu.Unlock()
	})
	if !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatal(tok.Error())
	}
	for _, args := range [][]string{{"apply", "-f", "-"}, {"get", "pods"}, {"logs", "web"}, {"restart", "pod", "web"}} {
		start := time.Now()
		res := runCLI(t, url, podManifest, append([]string{"--timeout", "20s"}, args...)...)
		if res.code != 3 || !strings.HasPrefix(res.stderr, "queued: node n1 offline since 2026-03-01T11:00:00Z; request ") {
			t.Errorf("%v to an offline node: want exit 3 and queued: %v", args, res)
		}
		if took := time.Since(start); took > 10*time.Second {
			t.Errorf("%v took %v, want at once (--timeout is 20s)", args, took)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		mu.Lock()
		n := len(got)
		mu.Unlock()
		if n == 4 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d commands reached the broker, want 4 (queued, not dropped): %v", n, got)
		}
		time.Sleep(20 * time.Millisecond)
	}
	start := time.Now()
	res := runCLI(t, url, "", "--timeout", "20s", "top", "node")
	if res.code != 1 || !strings.Contains(res.stderr, "node n1 is offline since 2026-03-01T11:00:00Z") || time.Since(start) > 10*time.Second {
		t.Errorf("top against an offline node: want it said at once: %v", res)
	}
	res = runCLI(t, url, podManifest, "--timeout", "1s", "--wait-offline", "apply", "-f", "-")
	if res.code != 1 || !strings.Contains(res.stderr, "timed out") {
		t.Errorf("--wait-offline: want the reply awaited (timed out, exit 1): %v", res)
	}
}
