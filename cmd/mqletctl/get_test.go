package main

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/mqlet/mqlet/agent/reply"
	apiv1 "github.com/mqlet/mqlet/api/v1"
	"github.com/mqlet/mqlet/mqtt/broker"
	"github.com/mqlet/mqlet/mqtt/outbox"
)

func ago(d time.Duration) metav1.Time { return metav1.NewTime(testNow.Add(-d)) }

// cannedPods: one running, one crash-looping with restarts, one pending.
func cannedPods() []*v1.Pod {
	running := v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default", CreationTimestamp: ago(3 * time.Hour)},
		Spec:       v1.PodSpec{NodeName: "n1", Containers: []v1.Container{{Name: "web"}, {Name: "log"}}},
		Status: v1.PodStatus{Phase: v1.PodRunning, PodIP: "10.88.0.5", ContainerStatuses: []v1.ContainerStatus{
			{Name: "web", Ready: true, State: v1.ContainerState{Running: &v1.ContainerStateRunning{}}},
			{Name: "log", Ready: true, State: v1.ContainerState{Running: &v1.ContainerStateRunning{}}},
		}},
	}
	crashing := v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "crasher", Namespace: "edge", CreationTimestamp: ago(25 * time.Minute)},
		Spec:       v1.PodSpec{Containers: []v1.Container{{Name: "app"}}},
		Status: v1.PodStatus{Phase: v1.PodRunning, ContainerStatuses: []v1.ContainerStatus{{
			Name: "app", RestartCount: 7,
			State:                v1.ContainerState{Waiting: &v1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}},
			LastTerminationState: v1.ContainerState{Terminated: &v1.ContainerStateTerminated{ExitCode: 1, Reason: "Error", FinishedAt: ago(42 * time.Second)}},
		}}},
	}
	pending := v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "new", Namespace: "default", CreationTimestamp: ago(5 * time.Second)},
		Spec:       v1.PodSpec{Containers: []v1.Container{{Name: "a"}}},
		Status:     v1.PodStatus{Phase: v1.PodPending},
	}
	return []*v1.Pod{&running, &crashing, &pending}
}

func getAgent(t *testing.T, url string, res apiv1.GetResult) *fakeAgent {
	return startFakeAgent(t, url, func(r received) []fakeReply {
		return []fakeReply{{Phase: "succeeded", Message: "canned", Result: res}}
	})
}

func TestGetPodsTable(t *testing.T) {
	url := startBroker(t, broker.Options{})
	agent := getAgent(t, url, apiv1.GetResult{Pods: cannedPods()})
	res := runCLI(t, url, "", "get", "pods")
	if res.code != 0 {
		t.Fatalf("get pods: %v", res)
	}
	want := "" +
		"NAMESPACE   NAME      READY   STATUS             RESTARTS      AGE\n" +
		"default     new       0/1     Pending            0             5s\n" +
		"default     web       2/2     Running            0             3h\n" +
		"edge        crasher   0/1     CrashLoopBackOff   7 (42s ago)   25m\n"
	if res.stdout != want {
		t.Errorf("table:\n%s\nwant:\n%s", res.stdout, want)
	}
	var args apiv1.GetRequest
	if err := json.Unmarshal(agent.only(t).Payload, &args); err != nil || args != (apiv1.GetRequest{Kind: "Pod"}) {
		t.Errorf("get request = %+v (%v), want kind Pod only", args, err)
	}
}

func TestGetPodsInNamespaceWide(t *testing.T) {
	url := startBroker(t, broker.Options{})
	agent := getAgent(t, url, apiv1.GetResult{Pods: cannedPods()[:1]})
	res := runCLI(t, url, "", "get", "pods", "web", "-n", "default", "-o", "wide")
	want := "" +
		"NAME   READY   STATUS    RESTARTS   AGE   IP          NODE\n" +
		"web    2/2     Running   0          3h    10.88.0.5   n1\n"
	if res.code != 0 || res.stdout != want {
		t.Fatalf("get -o wide:\n%v\nwant stdout:\n%s", res, want)
	}
	var args apiv1.GetRequest
	if err := json.Unmarshal(agent.only(t).Payload, &args); err != nil || args != (apiv1.GetRequest{Kind: "Pod", Namespace: "default", Name: "web"}) {
		t.Errorf("get request = %+v (%v)", args, err)
	}
}

func TestGetConfigMapsAndSecrets(t *testing.T) {
	url := startBroker(t, broker.Options{})
	getAgent(t, url, apiv1.GetResult{
		ConfigMaps: []*v1.ConfigMap{{ObjectMeta: metav1.ObjectMeta{Name: "cfg", Namespace: "default", CreationTimestamp: ago(48 * time.Hour)}, Data: map[string]string{"a": "1", "b": "2"}}},
		Secrets:    []*v1.Secret{{ObjectMeta: metav1.ObjectMeta{Name: "creds", Namespace: "default", CreationTimestamp: ago(time.Minute)}, Data: map[string][]byte{"pw": []byte("<redacted: 6 bytes>")}}},
	})
	res := runCLI(t, url, "", "get", "all", "-n", "default")
	want := "" +
		"NAME   DATA   AGE\n" +
		"cfg    2      2d\n" +
		"\n" +
		"NAME    TYPE     DATA   AGE\n" +
		"creds   Opaque   1      60s\n"
	if res.code != 0 || res.stdout != want {
		t.Fatalf("get all:\n%v\nwant stdout:\n%s", res, want)
	}
}

func TestGetEmpty(t *testing.T) {
	url := startBroker(t, broker.Options{})
	getAgent(t, url, apiv1.GetResult{})
	res := runCLI(t, url, "", "get", "all")
	if res.code != 0 || res.stdout != "" || res.stderr != "No resources found\n" {
		t.Fatalf("get all with nothing: %v", res)
	}
	res = runCLI(t, url, "", "get", "pods", "-n", "kube-system")
	if res.code != 0 || res.stdout != "" || res.stderr != "No resources found in kube-system namespace.\n" {
		t.Fatalf("get pods -n kube-system with nothing: %v", res)
	}
}

func TestGetSinglePodJSONAndYAML(t *testing.T) {
	url := startBroker(t, broker.Options{})
	getAgent(t, url, apiv1.GetResult{Pods: cannedPods()[1:2]})
	res := runCLI(t, url, "", "get", "pod", "crasher", "-o", "json")
	if res.code != 0 {
		t.Fatalf("get -o json: %v", res)
	}
	var pod v1.Pod
	if err := json.Unmarshal([]byte(res.stdout), &pod); err != nil {
		t.Fatalf("output is not a Pod: %v\n%v", err, res)
	}
	if pod.Name != "crasher" || pod.Status.ContainerStatuses[0].RestartCount != 7 {
		t.Errorf("decoded pod = %s restarts %d", pod.Name, pod.Status.ContainerStatuses[0].RestartCount)
	}

	res = runCLI(t, url, "", "get", "pods", "-o", "yaml")
	if res.code != 0 {
		t.Fatalf("get -o yaml: %v", res)
	}
	var list struct {
		Kind  string   `json:"kind"`
		Items []v1.Pod `json:"items"`
	}
	if strings.HasPrefix(strings.TrimSpace(res.stdout), "{") {
		t.Errorf("-o yaml printed JSON:\n%s", res.stdout)
	}
	if err := yaml.Unmarshal([]byte(res.stdout), &list); err != nil || list.Kind != "List" || len(list.Items) != 1 || list.Items[0].Name != "crasher" {
		t.Errorf("yaml list = %+v (%v)", list, err)
	}
}

func TestGetFailed(t *testing.T) {
	url := startBroker(t, broker.Options{})
	startFakeAgent(t, url, func(r received) []fakeReply {
		return []fakeReply{{Phase: "failed", Message: "not found: Pod default/nope"}}
	})
	res := runCLI(t, url, "", "get", "pod", "nope", "-n", "default")
	if res.code != 1 || !strings.Contains(res.stderr, "not found: Pod default/nope") || res.stdout != "" {
		t.Fatalf("get of a missing pod: %v", res)
	}
}

// capture is an outbox that keeps what a reply.Sender queued.
type capture struct{ msgs []outbox.Message }

func (c *capture) Put(m outbox.Message) error { c.msgs = append(c.msgs, m); return nil }

// A result too large for one reply arrives in parts; get joins them.
func TestGetJoinsAResultSentInParts(t *testing.T) {
	var cms []*v1.ConfigMap
	for i := 0; i < 40; i++ {
		cms = append(cms, &v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("cfg-%02d", i), Namespace: "default", CreationTimestamp: ago(time.Hour)},
			Data: map[string]string{"a": strings.Repeat("x", 200)}})
	}
	url := startBroker(t, broker.Options{})
	startFakeAgent(t, url, func(r received) []fakeReply {
		box := &capture{}
		s := reply.NewSender(scheme, box, nil, nil, zerolog.Nop(), reply.WithMaxReplyBytes(4096))
		if err := s.Send(apiv1.Reply{RequestID: r.RequestID, Verb: "get", Phase: apiv1.Succeeded, Message: "40 configmaps", Result: apiv1.GetResult{ConfigMaps: cms}}); err != nil {
			t.Errorf("fake agent: %v", err)
		}
		var out []fakeReply
		for _, m := range box.msgs {
			var f fakeReply
			if err := json.Unmarshal(m.Payload, &f); err != nil {
				t.Errorf("fake agent: %v", err)
			}
			out = append(out, f)
		}
		if len(out) < 3 {
			t.Errorf("fake agent: %d messages, want parts", len(out))
		}
		return out
	})
	res := runCLI(t, url, "", "get", "configmaps")
	if res.code != 0 {
		t.Fatalf("get configmaps: %v", res)
	}
	if n := strings.Count(res.stdout, "cfg-"); n != 40 {
		t.Fatalf("%d configmaps printed, want 40:\n%s", n, res.stdout)
	}
}

func cannedEvents() []*v1.Event {
	return []*v1.Event{
		{ObjectMeta: metav1.ObjectMeta{Name: "web.scheduled", Namespace: "default"},
			InvolvedObject: v1.ObjectReference{Kind: "Pod", Namespace: "default", Name: "web"},
			Type:           v1.EventTypeNormal, Reason: "Scheduled", Message: "Successfully assigned default/web to n1", LastTimestamp: ago(3 * time.Hour)},
		{ObjectMeta: metav1.ObjectMeta{Name: "crasher.backoff", Namespace: "edge"},
			InvolvedObject: v1.ObjectReference{Kind: "Pod", Namespace: "edge", Name: "crasher"},
			Type:           v1.EventTypeWarning, Reason: "BackOff", Message: "Back-off restarting failed container app\x1b[2J",
			Count: 7, FirstTimestamp: ago(25 * time.Minute), LastTimestamp: ago(42 * time.Second)},
	}
}

func TestGetEvents(t *testing.T) {
	url := startBroker(t, broker.Options{})
	var mu sync.Mutex
	var asked []apiv1.GetRequest
	startFakeAgent(t, url, func(r received) []fakeReply {
		var req apiv1.GetRequest
		if err := json.Unmarshal(r.Payload, &req); err != nil {
			t.Errorf("fake agent: %v", err)
		}
		mu.Lock()
		asked = append(asked, req)
		mu.Unlock()
		if req.Kind != apiv1.KindEvent {
			return []fakeReply{{Phase: "failed", Message: "not an event get"}}
		}
		// The agent filters: answer like it would, from the canned history.
		var out []*v1.Event
		for _, ev := range cannedEvents() {
			o := ev.InvolvedObject
			if (req.Namespace == "" || o.Namespace == req.Namespace) && (req.InvolvedObject == nil || req.InvolvedObject.Name == o.Name) {
				out = append(out, ev)
			}
		}
		return []fakeReply{{Phase: "succeeded", Result: apiv1.EventList{Events: out}}}
	})
	lastAsked := func() apiv1.GetRequest {
		mu.Lock()
		defer mu.Unlock()
		return asked[len(asked)-1]
	}

	res := runCLI(t, url, "", "get", "events")
	want := "" +
		"NAMESPACE   LAST SEEN           TYPE      REASON      OBJECT        MESSAGE\n" +
		"default     3h                  Normal    Scheduled   pod/web       Successfully assigned default/web to n1\n" +
		"edge        42s (x7 over 25m)   Warning   BackOff     pod/crasher   Back-off restarting failed container app?[2J\n"
	if res.code != 0 || res.stdout != want {
		t.Fatalf("get events:\n%v\nwant stdout:\n%s", res, want)
	}
	if got := lastAsked(); !reflect.DeepEqual(got, apiv1.GetRequest{Kind: "Event"}) {
		t.Errorf("get events asked %+v", got)
	}

	res = runCLI(t, url, "", "get", "ev", "--for", "pod/crasher", "-n", "edge")
	want = "" +
		"LAST SEEN           TYPE      REASON    OBJECT        MESSAGE\n" +
		"42s (x7 over 25m)   Warning   BackOff   pod/crasher   Back-off restarting failed container app?[2J\n"
	if res.code != 0 || res.stdout != want {
		t.Fatalf("get events --for pod/crasher -n edge:\n%v\nwant stdout:\n%s", res, want)
	}
	if got := lastAsked(); !reflect.DeepEqual(got, apiv1.GetRequest{Kind: "Event", Namespace: "edge",
		InvolvedObject: &apiv1.ObjectRef{Kind: "Pod", Namespace: "edge", Name: "crasher"}}) {
		t.Errorf("get events --for asked %+v", got)
	}

	// A pod named without -n is in the default namespace, as for kubectl.
	res = runCLI(t, url, "", "get", "events", "--for", "pod/web", "-o", "json")
	if res.code != 0 {
		t.Fatalf("get events -o json: %v", res)
	}
	if got := lastAsked(); !reflect.DeepEqual(got.InvolvedObject, &apiv1.ObjectRef{Kind: "Pod", Namespace: "default", Name: "web"}) {
		t.Errorf("get events --for pod/web asked %+v", got.InvolvedObject)
	}
	var list struct {
		Kind  string     `json:"kind"`
		Items []v1.Event `json:"items"`
	}
	if err := json.Unmarshal([]byte(res.stdout), &list); err != nil || list.Kind != "List" || len(list.Items) != 1 || list.Items[0].Reason != "Scheduled" {
		t.Errorf("get events -o json = %+v (%v)\n%s", list, err, res.stdout)
	}
	res = runCLI(t, url, "", "get", "events", "-o", "yaml")
	if err := yaml.Unmarshal([]byte(res.stdout), &list); res.code != 0 || err != nil || len(list.Items) != 2 || list.Items[1].Count != 7 {
		t.Errorf("get events -o yaml = %+v (%v)\n%v", list, err, res)
	}

	res = runCLI(t, url, "", "get", "events", "-n", "kube-system")
	if res.code != 0 || res.stdout != "" || res.stderr != "No resources found in kube-system namespace.\n" {
		t.Errorf("get events -n kube-system with nothing: %v", res)
	}

	// What get events cannot do is refused, not ignored, before asking.
	mu.Lock()
	before := len(asked)
	mu.Unlock()
	for _, args := range [][]string{
		{"get", "events", "crasher.backoff"},
		{"get", "events", "-l", "app=web"},
		{"get", "events", "-w"},
		{"get", "events", "-o", "wide"},
		{"get", "events", "--for", "crasher"},
		{"get", "events", "--for", "secret/creds"},
		{"get", "pods", "--for", "pod/web"},
	} {
		if res := runCLI(t, url, "", args...); res.code != 2 {
			t.Errorf("%q: want usage error, got %v", args, res)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(asked) != before {
		t.Errorf("refused commands still asked the agent: %+v", asked[before:])
	}
}

func TestGetEventsFailed(t *testing.T) {
	url := startBroker(t, broker.Options{})
	startFakeAgent(t, url, func(r received) []fakeReply {
		return []fakeReply{{Phase: "failed", Message: "kind Event is not supported by this mqlet"}}
	})
	res := runCLI(t, url, "", "get", "events")
	if res.code != 1 || !strings.Contains(res.stderr, "kind Event is not supported") || res.stdout != "" {
		t.Fatalf("get events from an agent without history: %v", res)
	}
}
