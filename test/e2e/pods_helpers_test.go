package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	v1 "k8s.io/api/core/v1"
	internalapi "k8s.io/cri-api/pkg/apis"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	criclient "k8s.io/cri-client/pkg"
	"k8s.io/klog/v2"

	apiv1 "github.com/mqlet/mqlet/api/v1"
	"github.com/mqlet/mqlet/internal/testutil/mosquitto"
)

// Generous bounds: the test machine has 2 shared cores.
const (
	podReadyTimeout = 90 * time.Second
	podGoneTimeout  = 60 * time.Second
)

var podEnvSeq atomic.Int64

// podEnv is one mqlet on a real mosquitto and the test containerd, with a
// node name and pod namespace of its own so tests never see each other's pods.
type podEnv struct {
	t        testing.TB
	node, ns string
	broker   *mosquitto.Broker
	mq       *Client
	cri      *CRI
	rt       internalapi.RuntimeService // full CRI, for foreign pods and the final sweep
	agent    *Agent
	stateDir string
	ids      atomic.Int64
}

// podTestConfig makes crash loops and relists fast enough to observe in a test.
func podTestConfig(logDir, extra string) string {
	return fmt.Sprintf(`runtime:
  plegPeriod: 500ms
  podLogDir: %s
pods:
  backoffBase: 1s
  backoffMax: 4s
telemetry:
  metricsInterval: 0s
%s`, logDir, extra)
}

var nonDNS = regexp.MustCompile(`[^a-z0-9-]+`)

// newPodEnv starts mosquitto, a recording operator client and mqlet, and
// waits until mqlet is online. extraConfig is appended to the test config.
func newPodEnv(t testing.TB, extraConfig string) *podEnv {
	t.Helper()
	return startPodEnv(t, func(logDir string) string { return podTestConfig(logDir, extraConfig) })
}

// startPodEnv is newPodEnv with the mqlet config made by config (given a
// fresh pod log dir) and extra mqlet flags.
func startPodEnv(t testing.TB, config func(logDir string) string, args ...string) *podEnv {
	t.Helper()
	return startPodEnvIn(t, "", config, args...)
}

// startPodEnvIn is startPodEnv with mqlet's state directory at stateDir
// ("": a fresh temp dir).
func startPodEnvIn(t testing.TB, stateDir string, config func(logDir string) string, args ...string) *podEnv {
	t.Helper()
	cri, endpoint := ConnectCRI(t)
	ctx, cancel := criCtx()
	defer cancel()
	rt, err := criclient.NewRemoteRuntimeServiceBuilder().WithEndpoint(endpoint).WithConnectionTimeout(5 * time.Second).WithTracerProvider(nil).Build(ctx)
	if err != nil {
		t.Fatalf("connecting to CRI %s: %v", endpoint, err)
	}
	short := strings.Trim(nonDNS.ReplaceAllString(strings.ToLower(strings.TrimPrefix(t.Name(), "Test")), "-"), "-")
	if len(short) > 30 {
		short = short[:30]
	}
	suffix := strconv.FormatInt(time.Now().UnixNano()%1e9, 36) + strconv.FormatInt(podEnvSeq.Add(1), 36)
	e := &podEnv{t: t, cri: cri, rt: rt, node: "e2e-" + short + "-" + suffix, ns: "e2e-" + short + "-" + suffix}
	// Registered first, so it runs last: after mqlet stopped, nothing of this
	// test's namespace may stay in containerd.
	t.Cleanup(e.sweep)
	e.broker = mosquitto.Start(t)
	e.mq = Connect(t, e.broker.URL())
	e.mq.Subscribe(prefix + "/" + e.node + "/#")
	e.stateDir = stateDir
	if e.stateDir == "" {
		e.stateDir = t.TempDir()
	}
	mark := e.mq.Mark()
	e.agent = StartAgent(t, AgentOpts{Node: e.node, Broker: e.broker.URL(), CRI: endpoint, StateDir: e.stateDir,
		Config: config(t.TempDir()), Args: args})
	e.mq.WaitState(mark, e.node, "online", 30*time.Second)
	return e
}

// nextID is a fresh request id.
func (e *podEnv) nextID(verb string) string {
	return fmt.Sprintf("%s-%d-%d", verb, time.Now().UnixNano()%1e6, e.ids.Add(1))
}

// apply sends an apply command and waits for the wanted final phase.
func (e *podEnv) apply(payload []byte, phase string, timeout time.Duration) apiv1.Reply {
	e.t.Helper()
	id := e.nextID("apply")
	e.mq.Command(e.node, "apply", id, payload)
	return e.waitFinal(id, phase, timeout)
}

// waitFinalAny waits for the final reply to request id, whatever its phase.
func (e *podEnv) waitFinalAny(id string, timeout time.Duration) apiv1.Reply {
	e.t.Helper()
	var got apiv1.Reply
	topic := prefix + "/" + e.node + "/reply/" + id
	e.mq.WaitFor(0, timeout, "final reply to "+id, func(m Msg) bool {
		var r apiv1.Reply
		if m.Topic != topic || json.Unmarshal(m.Payload, &r) != nil || !r.Final() {
			return false
		}
		got = r
		return true
	})
	return got
}

// waitFinal waits for the final reply to request id and fails unless it has
// phase.
func (e *podEnv) waitFinal(id, phase string, timeout time.Duration) apiv1.Reply {
	e.t.Helper()
	got := e.waitFinalAny(id, timeout)
	if got.Phase != phase {
		e.t.Fatalf("request %s ended %s (%s), want %s; errors: %v", id, got.Phase, got.Message, phase, got.Errors)
	}
	return got
}

// deletePod sends a delete command for pod name and waits for it to succeed.
func (e *podEnv) deletePod(name string) apiv1.Reply {
	e.t.Helper()
	id := e.nextID("delete")
	e.mq.Command(e.node, "delete", id, fmt.Appendf(nil, `{"kind":"Pod","namespace":%q,"name":%q}`, e.ns, name))
	return e.waitFinal(id, apiv1.Succeeded, podGoneTimeout)
}

// cleanupPods deletes the named pods through mqlet when the test ends
// (before mqlet stops), and checks containerd let go of them.
func (e *podEnv) cleanupPods(names ...string) {
	e.t.Cleanup(func() {
		if !e.agent.Running() {
			return // the sweep removes them
		}
		// A client of its own: the test's clients may be closed already
		// (their cleanups ran first) or belong to a broker since restarted.
		e.mq = Connect(e.t, e.broker.URL())
		e.mq.Subscribe(prefix + "/" + e.node + "/reply/#")
		for _, n := range names {
			e.deletePod(n)
		}
		for _, n := range names {
			Eventually(e.t, podGoneTimeout, "pod "+n+" gone from containerd", func() bool {
				return len(e.cri.Containers(e.ns, n)) == 0 && len(e.cri.Sandboxes(e.ns, n)) == 0
			})
		}
	})
}

// sweep removes whatever of this test's namespace is left in containerd.
// A loaded containerd can miss the client's 5 s per-call deadline, so it
// lists again and retries what is left, a few times.
func (e *podEnv) sweep() {
	ctx, cancel := context.WithTimeout(klog.NewContext(context.Background(), logr.Discard()), 3*time.Minute)
	defer cancel()
	defer func() { _ = e.rt.Close(ctx) }()
	const passes = 4
	for pass := 1; ; pass++ {
		sbs, err := e.rt.ListPodSandbox(ctx, &runtimeapi.PodSandboxFilter{LabelSelector: map[string]string{"io.kubernetes.pod.namespace": e.ns}})
		if err != nil {
			e.t.Logf("sweep: listing sandboxes: %v", err)
			return
		}
		if len(sbs) == 0 {
			return
		}
		if pass > passes {
			e.t.Errorf("sweep: %d sandboxes of %s left after %d passes", len(sbs), e.ns, passes)
			return
		}
		// A few at a time: a test may leave a hundred pods.
		var wg sync.WaitGroup
		slots := make(chan struct{}, 8)
		for _, sb := range sbs {
			wg.Add(1)
			slots <- struct{}{}
			go func(id string) {
				defer func() { <-slots; wg.Done() }()
				_ = e.rt.StopPodSandbox(ctx, id) // RemovePodSandbox stops it too
				if err := e.rt.RemovePodSandbox(ctx, id); err != nil && pass == passes {
					e.t.Logf("sweep: removing sandbox %s: %v", id, err)
				}
			}(sb.Id)
		}
		wg.Wait()
	}
}

// status returns the last pod status recorded for name: nil and true when
// the retained topic was cleared, nil and false when none was seen.
func (e *podEnv) status(name string) (*v1.Pod, bool) {
	msgs := e.mq.Messages()
	topic := e.podTopic(name)
	for i := len(msgs) - 1; i >= 0; i-- {
		if msgs[i].Topic != topic {
			continue
		}
		if len(msgs[i].Payload) == 0 {
			return nil, true
		}
		var p v1.Pod
		if err := json.Unmarshal(msgs[i].Payload, &p); err != nil {
			e.t.Fatalf("pod status on %s is not a v1.Pod: %v: %s", topic, err, msgs[i].Payload)
		}
		return &p, true
	}
	return nil, false
}

func (e *podEnv) podTopic(name string) string {
	return prefix + "/" + e.node + "/pods/" + e.ns + "/" + name
}

// waitStatus waits until the latest status of pod name satisfies cond.
func (e *podEnv) waitStatus(name string, timeout time.Duration, what string, cond func(*v1.Pod) bool) *v1.Pod {
	e.t.Helper()
	var got *v1.Pod
	Eventually(e.t, timeout, name+" "+what, func() bool {
		p, ok := e.status(name)
		if ok && p != nil && cond(p) {
			got = p
			return true
		}
		return false
	})
	return got
}

// containerStatus returns the status of container c in pod p.
func containerStatus(p *v1.Pod, c string, init bool) (v1.ContainerStatus, bool) {
	list := p.Status.ContainerStatuses
	if init {
		list = p.Status.InitContainerStatuses
	}
	for _, cs := range list {
		if cs.Name == c {
			return cs, true
		}
	}
	return v1.ContainerStatus{}, false
}

// runningIDs returns the ids of the running containers of pod name, sorted by name.
func (e *podEnv) runningIDs(name string) map[string]string {
	out := map[string]string{}
	for _, c := range e.cri.Running(e.ns, name) {
		out[c.GetMetadata().GetName()] = c.Id
	}
	return out
}

// sandboxIDs returns the ids of every sandbox of pod name (any state).
func (e *podEnv) sandboxIDs(name string) []string {
	var ids []string
	for _, sb := range e.cri.Sandboxes(e.ns, name) {
		ids = append(ids, sb.Id)
	}
	return ids
}

// pod is a busybox pod of this env's namespace.
func (e *podEnv) pod(name, restartPolicy, cmd string) []byte {
	return podYAML(name, e.ns, restartPolicy, cmd)
}

func dump(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// kill9BetweenSyncs SIGKILLs mqlet, as a crash would. The kill may land
// while a pod is synced: one death never quarantines a pod (the poison
// guard needs a Go crash traced to the sync, or the same sync caught at
// several deaths in a row; see TestAgentKilledInPodSyncKeepsThePod), so
// nothing is cleared before the restart.
func (e *podEnv) kill9BetweenSyncs() {
	e.t.Helper()
	e.agent.Kill9()
}
