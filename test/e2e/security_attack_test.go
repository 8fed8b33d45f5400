package e2e

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	apiv1 "github.com/mqlet/mqlet/api/v1"
	"github.com/mqlet/mqlet/internal/testutil/mosquitto"
	"github.com/mqlet/mqlet/signing"
)

// Attacks by someone with only a broker login, against the merged
// defences: each test failed on the binary before its fix.

// grepLines returns the lines of s holding want.
func grepLines(s, want string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, want) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// hostUsers: false made the Pod Security Standards (baseline) allow
// procMount: Unmasked, but mqlet's runtime makes no user namespace: the
// container ran as host root (uid_map 0 0 4294967295) with /proc read-write
// and no masked paths, and could write the host's kernel.core_pattern (a
// pipe to its own program would run as root on the host). The probe writes
// the current value back, so the host is not changed even when it works.
func TestAttackHostUsersFalseUnmaskedProc(t *testing.T) {
	logDir := t.TempDir()
	e := startPodEnv(t, func(string) string { return podTestConfig(logDir, "") })
	// Refused at admission, so nothing to delete; the final sweep removes
	// what an old binary ran.
	pod := fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: uns, namespace: %s}
spec:
  hostUsers: false
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: %s
    imagePullPolicy: Never
    securityContext: {procMount: Unmasked}
    command: ["sh", "-c", "cp=$(cat /proc/sys/kernel/core_pattern); if echo \"$cp\" > /proc/sys/kernel/core_pattern; then echo CORE_PATTERN_WRITABLE; else echo core_pattern_denied; fi; sleep 3600"]
`, e.ns, busybox)
	id := e.nextID("apply")
	e.mq.Command(e.node, "apply", id, []byte(pod))
	r := e.waitFinalAny(id, podReadyTimeout)
	if r.Phase != apiv1.Failed {
		var out string
		Eventually(t, 30*time.Second, "the probe's output", func() bool {
			out = logsOf(logDir, e.ns, "uns", "main")
			return strings.Contains(strings.ToLower(out), "core_pattern")
		})
		t.Fatalf("hostUsers: false with an Unmasked /proc was admitted (%s); the container says:\n%s", r.Phase, out)
	}
	if !strings.Contains(r.Message, "spec.hostUsers") || !strings.Contains(r.Message, "user namespaces") {
		t.Fatalf("refused, but without naming spec.hostUsers: %q", r.Message)
	}
	e.noContainerRan("uns")
}

// A configMap item path "./x" (valid for Kubernetes) made mqlet remove the
// volume directory and put a dangling symlink in its place: the pod was
// accepted and never started. Now it is cleaned to x, as the kubelet does.
func TestAttackConfigMapItemDotPath(t *testing.T) {
	logDir := t.TempDir()
	e := startPodEnv(t, func(string) string { return podTestConfig(logDir, "") })
	e.cleanupPods("dot")
	list := fmt.Sprintf(`apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: ConfigMap
  metadata: {name: cm, namespace: %[1]s}
  data: {a: hello-from-the-item}
- apiVersion: v1
  kind: Pod
  metadata: {name: dot, namespace: %[1]s}
  spec:
    terminationGracePeriodSeconds: 1
    volumes:
    - name: v
      configMap:
        name: cm
        items: [{key: a, path: ./x}]
    containers:
    - name: main
      image: %[2]s
      imagePullPolicy: Never
      command: ["sh", "-c", "cat /v/x; echo; sleep 3600"]
      volumeMounts: [{name: v, mountPath: /v}]
`, e.ns, busybox)
	e.apply([]byte(list), apiv1.Succeeded, podReadyTimeout)
	Eventually(t, 30*time.Second, "the item read at /v/x", func() bool {
		return strings.Contains(logsOf(logDir, e.ns, "dot", "main"), "hello-from-the-item")
	})
}

// Under the restricted profile, spec.os.name: windows made the Pod
// Security Standards skip allowPrivilegeEscalation, capabilities drop ALL
// and seccomp, and mqlet ran the pod as a Linux pod with them all
// loosened. A pod for another OS is refused, naming spec.os.name.
func TestAttackWindowsPodEvadesRestricted(t *testing.T) {
	e := newPodEnv(t, "admission:\n  profile: restricted\n")
	pod := fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: win, namespace: %s}
spec:
  os: {name: windows}
  securityContext: {runAsNonRoot: true}
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: %s
    imagePullPolicy: Never
    command: ["sleep", "3600"]
`, e.ns, busybox)
	id := e.nextID("apply")
	e.mq.Command(e.node, "apply", id, []byte(pod))
	r := e.waitFinalAny(id, podReadyTimeout)
	if r.Phase != apiv1.Failed || !strings.Contains(r.Message, "spec.os.name") {
		t.Fatalf("a Windows pod was admitted under restricted (%s: %q)", r.Phase, r.Message)
	}
	e.noContainerRan("win")
}

// Two ways around signed commands for someone without a key:
//   - with signedVerbs [apply], an unsigned sync stored the same objects
//     (sync applies and deletes), so the signature requirement was moot;
//   - an unsigned command on the request id an operator will use (a
//     dashboard's "r1") was refused and that refusal recorded, so the
//     operator's signed command with that id only got the refusal back.
func TestAttackSignedVerbsBypass(t *testing.T) {
	b := mosquitto.Start(t)
	node := "gw-attack-" + randomToken(t)[:6]
	key, err := signing.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	ops, err := signing.NewSigner("ops", key)
	if err != nil {
		t.Fatal(err)
	}
	op := Connect(t, b.URL())
	op.Subscribe(prefix + "/" + node + "/#")
	cfg := fmt.Sprintf("security:\n  signedVerbs: [apply]\n  trustedKeys:\n  - keyId: ops\n    publicKey: %s\n    verbs: [\"*\"]\n",
		base64.StdEncoding.EncodeToString(ops.Public()))
	StartAgent(t, AgentOpts{Node: node, Broker: b.URL(), Config: cfg})
	op.WaitState(0, node, "online", 15*time.Second)

	op.Command(node, "sync", "y1", []byte(`{"apiVersion":"v1","kind":"List","items":[`+string(mustJSON(t, configMapYAML("via-sync")))+`]}`))
	if r := waitFinal(op, 0, node, "y1"); r.Phase != apiv1.Failed || !strings.Contains(r.Message, "signature required") {
		t.Fatalf("unsigned sync with signedVerbs [apply]: %s %q", r.Phase, r.Message)
	}

	op.Command(node, "apply", "r1", configMapYAML("squatter"))
	expectFailed(t, op, node, "r1", "signature required")
	now := time.Now()
	env, err := ops.Sign(signing.Claims{Node: node, Verb: "apply", RequestID: "r1", IssuedAt: now, Expires: now.Add(time.Minute)}, configMapYAML("operator"))
	if err != nil {
		t.Fatal(err)
	}
	mark := op.Mark()
	op.Command(node, "apply", "r1", env)
	if r := waitFinal(op, mark, node, "r1"); r.Phase != apiv1.Succeeded {
		t.Fatalf("the operator's signed r1 after an unsigned r1: %s %q", r.Phase, r.Message)
	}
}

// mustJSON converts a YAML manifest to JSON.
func mustJSON(t *testing.T, y []byte) []byte {
	t.Helper()
	j, err := yaml.YAMLToJSON(y)
	if err != nil {
		t.Fatal(err)
	}
	return j
}

// With allowedHostPorts configured, a second pod could ask for the
// hostPort a running pod serves on: both got DNAT rules, and which pod
// answered the node's port depended on rule order (the first, until its
// sandbox was made again). The second pod is refused HostPortConflict.
func TestAttackHostPortOfAnotherPod(t *testing.T) {
	e := newPodEnv(t, "admission:\n  allowedHostPorts: [\"18080\"]\n")
	e.cleanupPods("victim")
	mk := func(name string) []byte {
		return []byte(fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: %s, namespace: %s}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: %s
    imagePullPolicy: Never
    command: ["sh", "-c", "while true; do echo %s | nc -l -p 8080; done"]
    ports: [{containerPort: 8080, hostPort: 18080}]
`, name, e.ns, busybox, name))
	}
	e.apply(mk("victim"), apiv1.Succeeded, podReadyTimeout)
	id := e.nextID("apply")
	e.mq.Command(e.node, "apply", id, mk("thief"))
	r := e.waitFinalAny(id, podReadyTimeout)
	if r.Phase != apiv1.Failed || !strings.Contains(r.Message, "HostPortConflict: hostPort 18080/TCP of pod "+e.ns+"/thief is held by pod "+e.ns+"/victim") {
		e.cleanupPods("thief")
		t.Fatalf("a second pod on the victim's hostPort: %s %q", r.Phase, r.Message)
	}
	e.noContainerRan("thief")
}

// A pod's processes were unlimited (the CRI has no pids limit and mqlet
// set none on the pod's cgroup): a fork bomb took every pid of the node,
// and mqlet, unable to start a thread, died, again after each restart as
// the processes outlive it. The probe forks 120 sleeps (harmless on a
// shared machine) under pods.pidsLimit 40; the pod's cgroup says how many
// it ever held.
func TestAttackPodPidsAreLimited(t *testing.T) {
	e := startPodEnv(t, func(logDir string) string {
		return strings.Replace(podTestConfig(logDir, ""), "pods:\n", "pods:\n  pidsLimit: 40\n", 1)
	})
	e.cleanupPods("forks")
	script := `i=0; while [ $i -lt 120 ]; do sleep 3600 & i=$((i+1)); done; wait`
	e.apply(e.pod("forks", "Always", script), apiv1.Succeeded, podReadyTimeout)
	p := e.waitStatus("forks", 30*time.Second, "the pod's uid", func(p *v1.Pod) bool { return p.UID != "" })
	dir := filepath.Join("/sys/fs/cgroup/pids/mqlet", "pod"+string(p.UID))
	read := func(f string) string {
		b, _ := os.ReadFile(filepath.Join(dir, f))
		return strings.TrimSpace(string(b))
	}
	Eventually(t, 30*time.Second, "the pod forking up to its limit", func() bool {
		peak, _ := strconv.Atoi(read("pids.peak"))
		return peak >= 30
	})
	if peak, _ := strconv.Atoi(read("pids.peak")); read("pids.max") != "40" || peak > 40 {
		t.Fatalf("pod cgroup %s: pids.max %q, pids.peak %d (want 40 and at most 40)", dir, read("pids.max"), peak)
	}
}

// A binary secret (a key, not text) used as the command: exec quotes it
// Go-style ("\x01\x02..."), a form the scrubber did not know (it knew the
// raw and the JSON-escaped value), so the failed start published it in
// events and the pod status and logged it.
func TestAttackBinarySecretQuotedByExec(t *testing.T) {
	e := newPodEnv(t, "")
	e.cleanupPods("binleak")
	marker := "key-material-" + randomToken(t)
	value := base64.StdEncoding.EncodeToString([]byte("\x01\x02" + marker + "\x7f"))
	list := fmt.Sprintf(`{"apiVersion":"v1","kind":"List","items":[
	  {"apiVersion":"v1","kind":"Secret","metadata":{"name":"bin","namespace":%q},"data":{"KEY":%q}},
	  {"apiVersion":"v1","kind":"Pod","metadata":{"name":"binleak","namespace":%q},"spec":{
	    "restartPolicy":"Always","terminationGracePeriodSeconds":1,
	    "containers":[{"name":"main","image":%q,"imagePullPolicy":"Never","command":["$(KEY)"],
	      "env":[{"name":"KEY","valueFrom":{"secretKeyRef":{"name":"bin","key":"KEY"}}}]}]}}]}`,
		e.ns, value, e.ns, busybox)
	id := e.nextID("apply")
	e.mq.Command(e.node, "apply", id, []byte(list))
	e.mq.WaitReply(e.node, id, apiv1.Accepted, 30*time.Second)
	e.waitStatus("binleak", podReadyTimeout, "a failed start reported", func(p *v1.Pod) bool {
		cs, ok := containerStatus(p, "main", false)
		return ok && (cs.RestartCount >= 1 || (cs.State.Waiting != nil && cs.State.Waiting.Message != "") || cs.LastTerminationState.Terminated != nil)
	})
	redacted := false
	for _, m := range e.mq.Messages() {
		if strings.HasPrefix(m.Topic, prefix+"/"+e.node+"/cmd/") {
			continue
		}
		if bytes.Contains(m.Payload, []byte(marker)) {
			t.Errorf("binary secret published on %s: %s", m.Topic, m.Payload)
		}
		redacted = redacted || bytes.Contains(m.Payload, []byte("redacted"))
	}
	if !redacted {
		t.Error("no published message shows the redaction; the test saw nothing to scrub")
	}
	if logs := e.agent.Logs(); strings.Contains(logs, marker) {
		t.Errorf("binary secret in mqlet's log:\n%s", grepLines(logs, marker))
	}
}

// A pod that ignores SIGTERM and has a long grace period held a pod worker
// for all of it once deleted: with as many such pods as workers (here
// pods.workers 1, one pod), no other pod was started, restarted or deleted
// on the node until the grace period ran out (300 s here). Now the
// termination runs beside the workers.
func TestAttackStubbornTerminationHoldsNoWorker(t *testing.T) {
	e := startPodEnv(t, func(logDir string) string {
		return strings.Replace(podTestConfig(logDir, ""), "pods:\n", "pods:\n  workers: 1\n", 1)
	})
	e.cleanupPods("other")
	stubborn := fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: stubborn, namespace: %s}
spec:
  terminationGracePeriodSeconds: 300
  containers:
  - name: main
    image: %s
    imagePullPolicy: Never
    command: ["sh", "-c", "trap '' TERM; while true; do sleep 1; done"]
`, e.ns, busybox)
	e.apply([]byte(stubborn), apiv1.Succeeded, podReadyTimeout)
	id := e.nextID("delete")
	e.mq.Command(e.node, "delete", id, []byte(`{"kind":"Pod","namespace":"`+e.ns+`","name":"stubborn"}`))
	e.mq.WaitReply(e.node, id, apiv1.Accepted, 30*time.Second)
	// The delete is under way (the stubborn pod still runs) when the next
	// pod comes; it must not wait for the 300 s grace period.
	Eventually(t, 30*time.Second, "the stubborn pod's termination under way", func() bool {
		_, ok := e.status("stubborn")
		return ok
	})
	e.apply(e.pod("other", "Always", "sleep 3600"), apiv1.Succeeded, 90*time.Second)
	if len(e.cri.Running(e.ns, "stubborn")) == 0 {
		t.Fatal("the stubborn pod was gone already, within its 300 s grace period")
	}
}

// Deleting (or rotating) a secret made its old value publishable: the
// runtime still holds the containers that ran with it, whose messages
// quote it, and the next pod status carried it unscrubbed, since the
// scrubber only knew the secrets stored now.
func TestAttackDeletedSecretValueStaysScrubbed(t *testing.T) {
	e := newPodEnv(t, "")
	e.cleanupPods("oldleak")
	value := "Rotated-" + randomToken(t)
	list := secretAsCommandList(e.ns, "oldleak", value)
	id := e.nextID("apply")
	e.mq.Command(e.node, "apply", id, []byte(list))
	e.mq.WaitReply(e.node, id, apiv1.Accepted, 30*time.Second)
	e.waitStatus("oldleak", podReadyTimeout, "a failed start with the value redacted", func(p *v1.Pod) bool {
		cs, ok := containerStatus(p, "main", false)
		return ok && cs.LastTerminationState.Terminated != nil && strings.Contains(cs.LastTerminationState.Terminated.Message, "redacted")
	})
	del := e.nextID("delete")
	e.mq.Command(e.node, "delete", del, []byte(`{"kind":"Secret","namespace":"`+e.ns+`","name":"pw"}`))
	e.mq.WaitReply(e.node, del, apiv1.Accepted, 30*time.Second)
	mark := e.mq.Mark()
	e.waitStatus("oldleak", podReadyTimeout, "the status after the secret is gone", func(p *v1.Pod) bool {
		cs, ok := containerStatus(p, "main", false)
		return ok && cs.State.Waiting != nil && strings.Contains(cs.State.Waiting.Message, "pw")
	})
	for _, m := range e.mq.Messages()[mark:] {
		if bytes.Contains(m.Payload, []byte(value)) {
			t.Errorf("the deleted secret's value published on %s: %s", m.Topic, m.Payload)
		}
	}
	if logs := e.agent.Logs(); strings.Contains(logs, value) {
		t.Errorf("the deleted secret's value in mqlet's log:\n%s", grepLines(logs, value))
	}
	// Across a restart the retired value is still known (kept sealed in
	// the store): the runtime's records still quote it.
	e.agent.Stop()
	mark = e.mq.Mark()
	e.agent.Restart()
	e.mq.WaitState(mark, e.node, "online", 30*time.Second)
	rid := e.nextID("restart")
	e.mq.Command(e.node, "get", rid, []byte(`{"kind":"Pod","namespace":"`+e.ns+`","name":"oldleak"}`))
	e.mq.WaitReply(e.node, rid, apiv1.Succeeded, 30*time.Second)
	e.waitStatus("oldleak", podReadyTimeout, "a status after the restart", func(p *v1.Pod) bool { return true })
	for _, m := range e.mq.Messages()[mark:] {
		if bytes.Contains(m.Payload, []byte(value)) {
			t.Errorf("after a restart the deleted secret's value was published on %s: %s", m.Topic, m.Payload)
		}
	}
	if logs := e.agent.Logs(); strings.Contains(logs, value) {
		t.Errorf("after a restart the deleted secret's value is in mqlet's log:\n%s", grepLines(logs, value))
	}
}

// A container's log file grew without bound: `yes` wrote 542 MB in 10 s
// here, enough to fill a gateway's flash in minutes and mqlet's state with
// it. Log files are rotated beyond runtime.containerLogMaxBytes and only
// containerLogMaxFiles are kept.
func TestAttackLogFloodIsRotated(t *testing.T) {
	logDir := t.TempDir()
	e := startPodEnv(t, func(string) string {
		return strings.Replace(podTestConfig(logDir, ""), "runtime:\n",
			"runtime:\n  containerLogMaxBytes: 1048576\n  containerLogMaxFiles: 2\n  logRotationPeriod: 1s\n", 1)
	})
	e.cleanupPods("flood")
	e.apply(e.pod("flood", "Always", "timeout 15 yes AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA; echo flood-over; sleep 3600"),
		apiv1.Succeeded, podReadyTimeout)
	files := func() ([]string, int64) {
		list, _ := filepath.Glob(filepath.Join(logDir, e.ns+"_flood_*", "main", "0.log*"))
		var total int64
		for _, f := range list {
			if st, err := os.Stat(f); err == nil {
				total += st.Size()
			}
		}
		return list, total
	}
	Eventually(t, 60*time.Second, "the flood over", func() bool {
		list, _ := files()
		for _, f := range list {
			if b, err := os.ReadFile(f); err == nil && bytes.Contains(b, []byte("flood-over")) {
				return true
			}
		}
		return false
	})
	list, total := files()
	rotated := 0
	for _, f := range list {
		if strings.HasPrefix(filepath.Base(f), "0.log.") {
			rotated++
		}
	}
	t.Logf("after 15 s of yes: %d files, %d bytes", len(list), total)
	if rotated == 0 || len(list) > 2 {
		t.Fatalf("log files %v: want the live one and at most one rotated", list)
	}
	if total > 300<<20 {
		t.Fatalf("%d bytes of logs kept for one container with containerLogMaxBytes 1 MiB", total)
	}
}
