package main

import (
	"encoding/json"
	"reflect"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	statsapi "k8s.io/kubelet/pkg/apis/stats/v1alpha1"

	apiv1 "github.com/mqlet/mqlet/api/v1"
	"github.com/mqlet/mqlet/mqtt/broker"
)

func describedPod() *v1.Pod {
	pod := cannedPods()[1] // edge/crasher, crash-looping
	pod.Labels = map[string]string{"app": "crasher"}
	pod.Spec.Volumes = []v1.Volume{
		{Name: "cache", VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}},
		{Name: "creds", VolumeSource: v1.VolumeSource{Secret: &v1.SecretVolumeSource{SecretName: "db-creds"}}},
	}
	c := &pod.Spec.Containers[0]
	c.Image = "busybox:test"
	c.Command = []string{"sh", "-c", "exit 1"}
	c.Env = []v1.EnvVar{{Name: "MODE", Value: "edge"}, {Name: "PASSWORD", ValueFrom: &v1.EnvVarSource{SecretKeyRef: &v1.SecretKeySelector{LocalObjectReference: v1.LocalObjectReference{Name: "db-creds"}, Key: "pw"}}}}
	c.VolumeMounts = []v1.VolumeMount{{Name: "cache", MountPath: "/cache"}, {Name: "creds", MountPath: "/creds", ReadOnly: true}}
	c.LivenessProbe = &v1.Probe{ProbeHandler: v1.ProbeHandler{HTTPGet: &v1.HTTPGetAction{Path: "/healthz", Port: intstr.FromInt32(8080)}}, PeriodSeconds: 5}
	c.Resources.Limits = v1.ResourceList{v1.ResourceMemory: resource.MustParse("64Mi")}
	pod.Status.Conditions = []v1.PodCondition{{Type: v1.PodReady, Status: v1.ConditionFalse}, {Type: v1.PodInitialized, Status: v1.ConditionTrue}}
	pod.Status.QOSClass = v1.PodQOSBurstable
	return pod
}

func TestDescribePod(t *testing.T) {
	url := startBroker(t, broker.Options{})
	pub := testClient(t, url, "events")
	pod := describedPod()
	backOff := v1.Event{
		ObjectMeta:     metav1.ObjectMeta{Name: "crasher.backoff", Namespace: "edge"},
		InvolvedObject: v1.ObjectReference{Kind: "Pod", Namespace: "edge", Name: "crasher"},
		Type:           v1.EventTypeWarning, Reason: "BackOff", Message: "Back-off restarting failed container app",
		Source: v1.EventSource{Component: "mqlet"}, Count: 3,
		FirstTimestamp: metav1.NewTime(testNow.Add(-2 * time.Minute)), LastTimestamp: metav1.NewTime(testNow.Add(-10 * time.Second)),
	}
	mine, _ := json.Marshal(backOff)
	other, _ := json.Marshal(v1.Event{
		ObjectMeta:     metav1.ObjectMeta{Name: "someone-else.started", Namespace: "edge"},
		InvolvedObject: v1.ObjectReference{Kind: "Pod", Namespace: "edge", Name: "someone-else"},
		Type:           v1.EventTypeNormal, Reason: "Started", Message: "not about crasher",
	})
	// The history has the pod's older events, and the BackOff before its
	// latest repeat, which describe hears on the events topic.
	scheduled := v1.Event{
		ObjectMeta:     metav1.ObjectMeta{Name: "crasher.scheduled", Namespace: "edge"},
		InvolvedObject: backOff.InvolvedObject, Type: v1.EventTypeNormal, Reason: "Scheduled",
		Message: "Successfully assigned edge/crasher to n1", Source: v1.EventSource{Component: "mqlet"},
		LastTimestamp: metav1.NewTime(testNow.Add(-25 * time.Minute)),
	}
	olderBackOff := backOff
	olderBackOff.Count, olderBackOff.LastTimestamp = 2, metav1.NewTime(testNow.Add(-time.Minute))
	var once sync.Once
	agent := startFakeAgent(t, url, func(r received) []fakeReply {
		var req apiv1.GetRequest
		_ = json.Unmarshal(r.Payload, &req)
		if req.Kind == apiv1.KindEvent {
			return []fakeReply{{Phase: "succeeded", Result: apiv1.EventList{Events: []*v1.Event{&scheduled, &olderBackOff}}}}
		}
		// Events published while describe listens are shown too.
		once.Do(func() {
			mustPublish(t, pub, scheme.Events(), false, other)
			mustPublish(t, pub, scheme.Events(), false, mine)
		})
		return []fakeReply{{Phase: "succeeded", Result: apiv1.GetResult{Pods: []*v1.Pod{pod}}}}
	})
	res := runCLI(t, url, "", "describe", "pod", "crasher", "-n", "edge", "--retained-wait", "1s")
	if res.code != 0 {
		t.Fatalf("describe: %v", res)
	}
	// Asked once to find the pod, again after listening for its events,
	// then for the pod's events in the history.
	agent.mu.Lock()
	cmds := append([]received(nil), agent.commands...)
	agent.mu.Unlock()
	if len(cmds) != 3 {
		t.Fatalf("describe sent %d gets, want 3", len(cmds))
	}
	for i, cmd := range cmds {
		want := apiv1.GetRequest{Kind: "Pod", Namespace: "edge", Name: "crasher"}
		if i == 2 {
			want = apiv1.GetRequest{Kind: "Event", Namespace: "edge", InvolvedObject: &apiv1.ObjectRef{Kind: "Pod", Namespace: "edge", Name: "crasher"}}
		}
		var sent apiv1.GetRequest
		if err := json.Unmarshal(cmd.Payload, &sent); err != nil || !reflect.DeepEqual(sent, want) {
			t.Errorf("describe asked for %s, want %+v", cmd.Payload, want)
		}
	}
	for _, want := range []string{
		"Name:            crasher\n",
		"Namespace:       edge\n",
		"Labels:          app=crasher\n",
		"Status:          Running\n",
		"    Image:          busybox:test\n",
		"    State:          Waiting\n      Reason:       CrashLoopBackOff\n",
		"    Last State:     Terminated\n      Reason:       Error\n      Exit Code:    1\n",
		"    Restart Count:  7\n",
		"    Limits:         memory=64Mi\n",
		"    Liveness:       http-get http://:8080/healthz delay=0s timeout=1s period=5s #success=1 #failure=3\n",
		"      PASSWORD:     <set to the key 'pw' in secret 'db-creds'>\n",
		"      /creds from creds (ro)\n",
		"  Ready            False\n",
		"  creds:\n    Type:        Secret (a volume populated by a Secret)\n    SecretName:  db-creds\n",
		"QoS Class:       Burstable\n",
		"Events:\n",
		"  Normal   Scheduled  25m  mqlet  Successfully assigned edge/crasher to n1\n" +
			"  Warning  BackOff    10s (x3 over 2m)  mqlet  Back-off restarting failed container app\n",
	} {
		// Column widths are tabwriter's business: compare with runs of
		// spaces folded.
		if !strings.Contains(fold(res.stdout), fold(want)) {
			t.Errorf("describe output lacks %q:\n%s", want, res.stdout)
		}
	}
	if n := strings.Count(res.stdout, "Back-off restarting"); n != 1 {
		t.Errorf("the BackOff event is shown %d times, want once:\n%s", n, res.stdout)
	}
	if strings.Contains(res.stdout, "not about crasher") {
		t.Errorf("describe shows another pod's event:\n%s", res.stdout)
	}
	if strings.Contains(res.stdout, "only those seen") {
		t.Errorf("describe says it has only listened events though the history answered:\n%s", res.stdout)
	}
}

// An agent without an event history: describe shows what it heard on the
// events topic and says that is all.
func TestDescribePodWithoutHistory(t *testing.T) {
	url := startBroker(t, broker.Options{})
	pub := testClient(t, url, "events")
	mine, _ := json.Marshal(v1.Event{
		ObjectMeta:     metav1.ObjectMeta{Name: "crasher.backoff", Namespace: "edge"},
		InvolvedObject: v1.ObjectReference{Kind: "Pod", Namespace: "edge", Name: "crasher"},
		Type:           v1.EventTypeWarning, Reason: "BackOff", Message: "Back-off restarting failed container app",
		Source: v1.EventSource{Component: "mqlet"}, LastTimestamp: metav1.NewTime(testNow.Add(-10 * time.Second)),
	})
	var once sync.Once
	startFakeAgent(t, url, func(r received) []fakeReply {
		var req apiv1.GetRequest
		_ = json.Unmarshal(r.Payload, &req)
		if req.Kind == apiv1.KindEvent {
			return []fakeReply{{Phase: "failed", Message: "kind Event is not supported by this mqlet"}}
		}
		once.Do(func() { mustPublish(t, pub, scheme.Events(), false, mine) })
		return []fakeReply{{Phase: "succeeded", Result: apiv1.GetResult{Pods: []*v1.Pod{describedPod()}}}}
	})
	res := runCLI(t, url, "", "describe", "pod", "crasher", "-n", "edge", "--retained-wait", "1s")
	if res.code != 0 {
		t.Fatalf("describe: %v", res)
	}
	for _, want := range []string{
		"Events: (only those seen on the events topic in the ",
		"describe listened: the agent has no event history to give: kind Event is not supported by this mqlet)\n",
		"  Warning  BackOff  10s   mqlet  Back-off restarting failed container app\n",
	} {
		if !strings.Contains(fold(res.stdout), fold(want)) {
			t.Errorf("describe output lacks %q:\n%s", want, res.stdout)
		}
	}
}

var spaces = regexp.MustCompile(` +`)

func fold(s string) string { return spaces.ReplaceAllString(s, " ") }

func TestDescribeNotFound(t *testing.T) {
	url := startBroker(t, broker.Options{})
	getAgent(t, url, apiv1.GetResult{})
	res := runCLI(t, url, "", "describe", "pod", "nope", "--retained-wait", "100ms")
	if res.code != 1 || !strings.Contains(res.stderr, `pods "nope" not found in namespace default`) {
		t.Fatalf("describe of a missing pod: %v", res)
	}
}

func TestTopNodeAndPods(t *testing.T) {
	url := startBroker(t, broker.Options{})
	pub := testClient(t, url, "metrics")
	u64 := func(v uint64) *uint64 { return &v }
	summary, _ := json.Marshal(statsapi.Summary{
		Node: statsapi.NodeStats{NodeName: "n1",
			CPU:    &statsapi.CPUStats{UsageNanoCores: u64(500_000_000)},
			Memory: &statsapi.MemoryStats{WorkingSetBytes: u64(512 << 20)}},
		Pods: []statsapi.PodStats{
			{PodRef: statsapi.PodReference{Namespace: "edge", Name: "b"}, Containers: []statsapi.ContainerStats{
				{Name: "x", CPU: &statsapi.CPUStats{UsageNanoCores: u64(2_000_000)}, Memory: &statsapi.MemoryStats{WorkingSetBytes: u64(3 << 20)}},
				{Name: "y", CPU: &statsapi.CPUStats{UsageNanoCores: u64(3_000_000)}, Memory: &statsapi.MemoryStats{WorkingSetBytes: u64(1 << 20)}}}},
			{PodRef: statsapi.PodReference{Namespace: "default", Name: "a"}},
		},
	})
	node, _ := json.Marshal(v1.Node{Status: v1.NodeStatus{Allocatable: v1.ResourceList{v1.ResourceCPU: resource.MustParse("2"), v1.ResourceMemory: resource.MustParse("2Gi")}}})
	mustPublish(t, pub, scheme.NodeTopic(), true, node)
	mustPublish(t, pub, scheme.State(), true, []byte(`{"state":"online"}`))
	// Metrics are not retained: publish until top has read one.
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				pub.Publish(scheme.Metrics(), 0, false, summary).Wait()
			}
		}
	}()
	defer func() { close(stop); <-done }()
	res := runCLI(t, url, "", "top", "node")
	want := "NAME   CPU(cores)   CPU(%)   MEMORY(bytes)   MEMORY(%)\nn1     500m         25%      512Mi           25%\n"
	if res.code != 0 || res.stdout != want {
		t.Fatalf("top node:\n%v\nwant:\n%s", res, want)
	}
	res = runCLI(t, url, "", "top", "pods")
	want = "NAMESPACE   NAME   CPU(cores)   MEMORY(bytes)\ndefault     a      0m           0Mi\nedge        b      5m           4Mi\n"
	if res.code != 0 || res.stdout != want {
		t.Fatalf("top pods:\n%v\nwant:\n%s", res, want)
	}
	res = runCLI(t, url, "", "top", "pods", "-n", "kube-system")
	if res.code != 0 || res.stderr != "No resources found in kube-system namespace.\n" {
		t.Fatalf("top pods -n kube-system: %v", res)
	}
}

func TestTopWithoutMetricsTimesOut(t *testing.T) {
	url := startBroker(t, broker.Options{})
	mustPublish(t, testClient(t, url, "state"), scheme.State(), true, []byte(`{"state":"online"}`))
	res := runCLI(t, url, "", "top", "node", "--timeout", "1s", "--retained-wait", "5s")
	if res.code != 1 || !strings.Contains(res.stderr, `no metrics message from node "n1"`) {
		t.Fatalf("top with no metrics: %v", res)
	}
	res = runCLI(t, url, "", "top", "node", "--node", "n9", "--timeout", "30s", "--retained-wait", "300ms")
	if res.code != 1 || !strings.Contains(res.stderr, `no node named "n9" under prefix mqlet/v1`) {
		t.Fatalf("top of a node that does not exist: %v", res)
	}
}

// describe shows the events of the pod it describes, not those of an
// earlier, deleted pod of the same name (another uid).
func TestDescribeKeepsTheEventsOfThePodsUID(t *testing.T) {
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web", UID: "uid-now"}}
	for _, c := range []struct {
		ref  v1.ObjectReference
		want bool
	}{
		{v1.ObjectReference{Kind: "Pod", Namespace: "default", Name: "web", UID: "uid-now"}, true},
		{v1.ObjectReference{Kind: "Pod", Namespace: "default", Name: "web"}, true},
		{v1.ObjectReference{Kind: "Pod", Namespace: "default", Name: "web", UID: "uid-before"}, false},
		{v1.ObjectReference{Kind: "Pod", Namespace: "other", Name: "web", UID: "uid-now"}, false},
		{v1.ObjectReference{Kind: "Node", Name: "web"}, false},
	} {
		if got := ofPod(&v1.Event{InvolvedObject: c.ref}, pod); got != c.want {
			t.Errorf("ofPod(%+v) = %v, want %v", c.ref, got, c.want)
		}
	}
}
