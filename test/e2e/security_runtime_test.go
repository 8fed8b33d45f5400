package e2e

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	apiv1 "github.com/mqlet/mqlet/api/v1"
)

// Host escapes an attacker with only a broker login found, each closed in
// the runtime (defence in depth behind admission). Every test plants a
// marker on the host and checks the pod neither read it nor wrote next to
// it.

const busybox = "docker.io/mqlet/busybox:test"

// hostMarker is a host directory holding a random marker file; a pod that
// reaches the host root would see dir/marker and could write dir/pwned.
type hostMarker struct {
	dir, marker, pwned, token string
}

func newHostMarker(t *testing.T) hostMarker {
	t.Helper()
	dir := t.TempDir()
	token := randomToken(t)
	m := hostMarker{dir: dir, marker: filepath.Join(dir, "marker"), pwned: filepath.Join(dir, "pwned"), token: token}
	if err := os.WriteFile(m.marker, []byte(token), 0o644); err != nil {
		t.Fatal(err)
	}
	return m
}

// escapeScript is what a pod with the host root at root runs: read the
// marker, write next to it, then stay up.
func (m hostMarker) escapeScript(root string) string {
	return fmt.Sprintf("cat %s%s; echo escaped > %s%s; sleep 3600", root, m.marker, root, m.pwned)
}

// checkNotEscaped fails when the pod wrote next to the marker.
func (m hostMarker) checkNotEscaped(t *testing.T) {
	t.Helper()
	if data, err := os.ReadFile(m.pwned); err == nil {
		t.Fatalf("HOST ESCAPE: the pod wrote %s (%q)", m.pwned, data)
	}
}

// waitEscaped reports the escape a pod that should have been refused
// makes once it runs.
func (m hostMarker) waitEscaped(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		m.checkNotEscaped(t)
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatal("the pod was not refused (no escape seen within 30 s)")
}

func randomToken(t *testing.T) string {
	t.Helper()
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b[:])
}

// logsOf returns the log of attempt 0 of container c of pod name ("" if
// none yet).
func logsOf(logDir, ns, name, c string) string {
	files, _ := filepath.Glob(filepath.Join(logDir, ns+"_"+name+"_*", c, "0.log"))
	if len(files) == 0 {
		return ""
	}
	data, _ := os.ReadFile(files[0])
	return string(data)
}

// waitWaiting waits until container c of pod name waits with reason and
// a message containing want, and returns that message.
func (e *podEnv) waitWaiting(name, c, reason, want string, timeout time.Duration) string {
	e.t.Helper()
	var msg string
	e.waitStatus(name, timeout, fmt.Sprintf("container %s waiting %s (%q)", c, reason, want), func(p *v1.Pod) bool {
		cs, ok := containerStatus(p, c, false)
		if !ok {
			cs, ok = containerStatus(p, c, true)
		}
		if !ok || cs.State.Waiting == nil || cs.State.Waiting.Reason != reason || !strings.Contains(cs.State.Waiting.Message, want) {
			return false
		}
		msg = cs.State.Waiting.Message
		return true
	})
	return msg
}

func (e *podEnv) noContainerRan(name string) {
	e.t.Helper()
	if running := e.cri.Running(e.ns, name); len(running) != 0 {
		e.t.Fatalf("pod %s has running containers: %s", name, dump(running))
	}
}

// 1. An init container plants "pivot -> /" in an emptyDir; the app
// container mounts the emptyDir with subPath pivot. The runtime refuses,
// naming the subPath, and the host root never shows up in the container.
func TestSecurityRuntimeSubPathSymlinkEscape(t *testing.T) {
	e := newPodEnv(t, "")
	host := newHostMarker(t)
	e.cleanupPods("pivot")
	pod := fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: pivot, namespace: %s}
spec:
  restartPolicy: Always
  terminationGracePeriodSeconds: 1
  volumes:
  - name: shared
    emptyDir: {}
  initContainers:
  - name: plant
    image: %s
    imagePullPolicy: Never
    command: ["sh", "-c", "ln -s / /shared/pivot"]
    volumeMounts: [{name: shared, mountPath: /shared}]
  containers:
  - name: main
    image: %s
    imagePullPolicy: Never
    command: ["sh", "-c", %q]
    volumeMounts: [{name: shared, mountPath: /host, subPath: pivot}]
`, e.ns, busybox, busybox, host.escapeScript("/host"))
	id := e.nextID("apply")
	e.mq.Command(e.node, "apply", id, []byte(pod))
	r := e.waitFinalAny(id, podReadyTimeout)
	if r.Phase != apiv1.Failed {
		host.waitEscaped(t)
	}
	if !strings.Contains(r.Message, `subPath "pivot"`) || !strings.Contains(r.Message, "escapes the volume") {
		t.Fatalf("apply failed with %q, want the subPath named as escaping", r.Message)
	}
	e.waitWaiting("pivot", "main", "CreateContainerConfigError", `subPath "pivot"`, 30*time.Second)
	e.noContainerRan("pivot")
	host.checkNotEscaped(t)
}

// 1b. subPathExpr is honoured (it used to be ignored, mounting the whole
// volume): $(POD_NAME) selects a directory of the emptyDir, made safely.
func TestSecurityRuntimeSubPathExpr(t *testing.T) {
	e := newPodEnv(t, "")
	// Deleted by the test itself (the final sweep catches a failure).
	pod := fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: expr, namespace: %s}
spec:
  restartPolicy: Always
  terminationGracePeriodSeconds: 1
  volumes:
  - name: data
    emptyDir: {}
  containers:
  - name: main
    image: %s
    imagePullPolicy: Never
    command: ["sh", "-c", "echo hello > /data/own && sleep 3600"]
    env:
    - name: POD_NAME
      valueFrom: {fieldRef: {fieldPath: metadata.name}}
    volumeMounts: [{name: data, mountPath: /data, subPathExpr: "logs/$(POD_NAME)"}]
`, e.ns, busybox)
	e.apply([]byte(pod), apiv1.Succeeded, podReadyTimeout)
	p := e.waitStatus("expr", 30*time.Second, "running", func(p *v1.Pod) bool { return p.UID != "" })
	vol := filepath.Join(e.stateDir, "pods", string(p.UID), "volumes", "kubernetes.io~empty-dir", "data")
	Eventually(t, 30*time.Second, "file written through the subPathExpr mount", func() bool {
		data, err := os.ReadFile(filepath.Join(vol, "logs", "expr", "own"))
		return err == nil && string(data) == "hello\n"
	})
	if _, err := os.Stat(filepath.Join(vol, "own")); err == nil {
		t.Fatal("subPathExpr ignored: the whole volume was mounted")
	}
	// The CRI mounts the bind mount under the pod directory, not the path
	// inside the volume.
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(mounts, []byte(filepath.Join(e.stateDir, "pods", string(p.UID), "volume-subpaths", "data", "main", "0"))) {
		t.Fatal("no subpath bind mount under the pod directory")
	}
	e.deletePod("expr")
	Eventually(t, podGoneTimeout, "subpath mount removed with the pod", func() bool {
		mounts, err := os.ReadFile("/proc/self/mountinfo")
		return err == nil && !bytes.Contains(mounts, []byte(filepath.Join(e.stateDir, "pods", string(p.UID))))
	})
}

// 2. hostPath "<allowed>/pivot" passes a prefix check as a string; a pod
// then plants "<allowed>/pivot -> /". The runtime resolves the path at
// mount time and refuses it. The victim pod is applied before the symlink
// exists (type Directory: it waits for the path), so it is the runtime,
// not admission, that must catch it.
func TestSecurityRuntimeHostPathSymlinkEscape(t *testing.T) {
	allowed := t.TempDir()
	if err := os.Chmod(allowed, 0o777); err != nil {
		t.Fatal(err)
	}
	e := newPodEnv(t, fmt.Sprintf("admission:\n  allowedHostPaths: [%q]\n", allowed))
	host := newHostMarker(t)
	e.cleanupPods("victim", "planter")
	victim := fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: victim, namespace: %s}
spec:
  restartPolicy: Always
  terminationGracePeriodSeconds: 1
  volumes:
  - name: h
    hostPath: {path: %q, type: Directory}
  containers:
  - name: main
    image: %s
    imagePullPolicy: Never
    command: ["sh", "-c", %q]
    volumeMounts: [{name: h, mountPath: /host}]
`, e.ns, filepath.Join(allowed, "pivot"), busybox, host.escapeScript("/host"))
	id := e.nextID("apply")
	e.mq.Command(e.node, "apply", id, []byte(victim))
	e.mq.WaitReply(e.node, id, apiv1.Accepted, 30*time.Second)
	planter := fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: planter, namespace: %s}
spec:
  restartPolicy: Always
  terminationGracePeriodSeconds: 1
  volumes:
  - name: h
    hostPath: {path: %q, type: Directory}
  containers:
  - name: main
    image: %s
    imagePullPolicy: Never
    command: ["sh", "-c", "ln -s / /a/pivot; sleep 3600"]
    volumeMounts: [{name: h, mountPath: /a}]
`, e.ns, allowed, busybox)
	e.apply([]byte(planter), apiv1.Succeeded, podReadyTimeout)
	Eventually(t, 30*time.Second, "the planted symlink", func() bool {
		target, err := os.Readlink(filepath.Join(allowed, "pivot"))
		return err == nil && target == "/"
	})
	Eventually(t, podReadyTimeout, "victim refused (or escaped)", func() bool {
		if _, err := os.Stat(host.pwned); err == nil {
			return true
		}
		p, ok := e.status("victim")
		if !ok || p == nil {
			return false
		}
		cs, ok := containerStatus(p, "main", false)
		return ok && cs.State.Waiting != nil && strings.Contains(cs.State.Waiting.Message, "resolves to /")
	})
	host.checkNotEscaped(t)
	msg := e.waitWaiting("victim", "main", "CreateContainerConfigError", "resolves to /", 10*time.Second)
	if !strings.Contains(msg, "outside the allowed host paths") {
		t.Fatalf("refusal %q does not say why", msg)
	}
	e.noContainerRan("victim")
	host.checkNotEscaped(t)
	// Creating types must not create through the symlink either.
	creator := fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: creator, namespace: %s}
spec:
  restartPolicy: Always
  terminationGracePeriodSeconds: 1
  volumes:
  - name: h
    hostPath: {path: %q, type: DirectoryOrCreate}
  containers:
  - name: main
    image: %s
    imagePullPolicy: Never
    command: ["sleep", "3600"]
    volumeMounts: [{name: h, mountPath: /host}]
`, e.ns, filepath.Join(allowed, "pivot", strings.TrimPrefix(host.dir, "/"), "made-by-pod"), busybox)
	// Admission may refuse it first (it resolves too); either way it fails.
	r := e.apply([]byte(creator), apiv1.Failed, podReadyTimeout)
	if !strings.Contains(r.Message, "nothing applied") {
		e.cleanupPods("creator") // stored, refused by the runtime
	}
	t.Logf("DirectoryOrCreate through the symlink: %s", r.Message)
	if _, err := os.Stat(filepath.Join(host.dir, "made-by-pod")); err == nil {
		t.Fatal("HOST ESCAPE: DirectoryOrCreate created a directory through the symlink")
	}
}

// 3. A uid like "../../x" must never become a host path: nothing is made
// beside the pods directory, and deleting the pod removes nothing there.
func TestSecurityRuntimeUIDPathTraversal(t *testing.T) {
	e := newPodEnv(t, "")
	name := "escape-" + randomToken(t)
	uid := "../../../" + name
	// Where the old code would have made (and on delete RemoveAll'd) it.
	podTarget := filepath.Join(e.stateDir, "pods", uid)
	if err := os.MkdirAll(podTarget, 0o755); err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(podTarget)
	sentinel := filepath.Join(podTarget, "keep")
	if err := os.WriteFile(sentinel, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	pod := fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: trav, namespace: %s, uid: %q}
spec:
  restartPolicy: Always
  terminationGracePeriodSeconds: 1
  volumes: [{name: v, emptyDir: {}}]
  containers:
  - name: main
    image: %s
    imagePullPolicy: Never
    command: ["sleep", "3600"]
    volumeMounts: [{name: v, mountPath: /v}]
`, e.ns, uid, busybox)
	id := e.nextID("apply")
	e.mq.Command(e.node, "apply", id, []byte(pod))
	// Refused at intake, refused by the runtime, or run under a uid the
	// store assigned: any is fine as long as the host is untouched.
	r := e.waitFinalAny(id, podReadyTimeout)
	t.Logf("apply: %s %s", r.Phase, r.Message)
	if p, ok := e.status("trav"); ok && p != nil {
		if string(p.UID) == uid && len(e.cri.Running(e.ns, "trav")) != 0 {
			t.Fatalf("a pod with uid %q runs", uid)
		}
		e.deletePod("trav")
	}
	if _, err := os.Stat(filepath.Join(podTarget, "volumes")); err == nil {
		t.Fatalf("HOST ESCAPE: volumes made at %s", podTarget)
	}
	if _, err := os.Stat(sentinel); err != nil {
		t.Fatalf("HOST ESCAPE: deleting the pod removed %s: %v", sentinel, err)
	}
	if matches, _ := filepath.Glob(filepath.Join(filepath.Dir(e.stateDir), "*"+name+"*")); len(matches) > 0 {
		t.Fatalf("HOST ESCAPE: %v made from the uid", matches)
	}
}

// 4. A default pod gets seccomp RuntimeDefault, a masked /proc/kcore and
// a read-only /proc/sys and /proc/sysrq-trigger.
func TestSecurityRuntimeProcAndSeccompDefaults(t *testing.T) {
	logDir := t.TempDir()
	e := startPodEnv(t, func(string) string { return podTestConfig(logDir, "") })
	e.cleanupPods("proc")
	before, err := os.ReadFile("/proc/sys/kernel/core_pattern")
	if err != nil {
		t.Fatal(err)
	}
	// Writes back the current core_pattern, so an unmasked /proc changes
	// nothing on the host even before the fix; only the exit status tells.
	script := `grep Seccomp: /proc/self/status; echo "kcore=$(head -c 16 /proc/kcore 2>/dev/null | wc -c)"; ` +
		`cp=$(cat /proc/sys/kernel/core_pattern); if echo "$cp" > /proc/sys/kernel/core_pattern; then echo CORE_PATTERN_WRITABLE; else echo core_pattern_denied; fi; ` +
		`if echo h > /proc/sysrq-trigger; then echo SYSRQ_WRITABLE; else echo sysrq_denied; fi; echo done; sleep 3600`
	e.apply(e.pod("proc", "Always", script), apiv1.Succeeded, podReadyTimeout)
	var out string
	Eventually(t, 30*time.Second, "the probe's output", func() bool {
		out = logsOf(logDir, e.ns, "proc", "main")
		return strings.Contains(out, "done")
	})
	t.Logf("probe output:\n%s", out)
	seccomp := ""
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		if _, rest, ok := strings.Cut(sc.Text(), "Seccomp:"); ok {
			seccomp = strings.TrimSpace(rest)
		}
	}
	if seccomp != "2" {
		t.Errorf("Seccomp: %q in the container, want 2 (filter)", seccomp)
	}
	if !strings.Contains(out, "kcore=0") {
		t.Error("/proc/kcore is readable in the container")
	}
	if strings.Contains(out, "CORE_PATTERN_WRITABLE") || !strings.Contains(out, "core_pattern_denied") {
		t.Error("/proc/sys/kernel/core_pattern is writable in the container")
	}
	if strings.Contains(out, "SYSRQ_WRITABLE") || !strings.Contains(out, "sysrq_denied") {
		t.Error("/proc/sysrq-trigger is writable in the container")
	}
	if after, _ := os.ReadFile("/proc/sys/kernel/core_pattern"); !bytes.Equal(before, after) {
		t.Fatalf("host core_pattern changed from %q to %q", before, after)
	}
}

// 5. A hostPort a host service listens on is refused; the host service
// keeps answering.
func TestSecurityRuntimeHostPortHijack(t *testing.T) {
	l, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	// Admission allows this one host port, so the runtime's own check is
	// what must refuse it.
	e := newPodEnv(t, fmt.Sprintf("admission:\n  allowedHostPorts: [\"%d\"]\n", l.Addr().(*net.TCPAddr).Port))
	e.cleanupPods("hijack")
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte("host-service\n"))
			c.Close()
		}
	}()
	port := l.Addr().(*net.TCPAddr).Port
	pod := fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: hijack, namespace: %s}
spec:
  restartPolicy: Always
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: %s
    imagePullPolicy: Never
    command: ["sh", "-c", "while true; do echo pod | nc -l -p 8080; done"]
    ports: [{containerPort: 8080, hostPort: %d}]
`, e.ns, busybox, port)
	r := e.apply([]byte(pod), apiv1.Failed, podReadyTimeout)
	want := fmt.Sprintf("hostPort %d/TCP is already in use", port)
	if !strings.Contains(r.Message, want) {
		t.Fatalf("apply failed with %q, want %q", r.Message, want)
	}
	e.waitWaiting("hijack", "main", "CreateContainerConfigError", want, 30*time.Second)
	if sbs := e.cri.Sandboxes(e.ns, "hijack"); len(sbs) != 0 {
		t.Fatalf("a sandbox with the port mapping was made: %s", dump(sbs))
	}
	for _, addr := range []string{fmt.Sprintf("127.0.0.1:%d", port)} {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			t.Fatalf("host service on %s: %v", addr, err)
		}
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		line, err := bufio.NewReader(c).ReadString('\n')
		c.Close()
		if err != nil || line != "host-service\n" {
			t.Fatalf("host service on %s answered %q (%v)", addr, line, err)
		}
	}
}

// 6. command ["$(PW)"] with PW from a Secret makes runc's error quote the
// value; it must appear in no log line, event or retained status.
func TestSecurityRuntimeSecretNotLeakedThroughErrors(t *testing.T) {
	e := newPodEnv(t, "")
	e.cleanupPods("leak")
	value := "Sup3rS3cret-" + randomToken(t)
	list := secretAsCommandList(e.ns, "leak", value)
	id := e.nextID("apply")
	e.mq.Command(e.node, "apply", id, []byte(list))
	e.mq.WaitReply(e.node, id, apiv1.Accepted, 30*time.Second)
	// The start fails (no such executable) and is reported, scrubbed
	// (looked for without the < and >, which JSON escapes).
	Eventually(t, podReadyTimeout, "the failed start reported with the value redacted", func() bool {
		for _, m := range e.mq.Messages() {
			if (m.Topic == e.podTopic("leak") || m.Topic == prefix+"/"+e.node+"/events") && bytes.Contains(m.Payload, []byte("redacted")) {
				return true
			}
		}
		return false
	})
	// Let a few restarts happen, each a chance to leak.
	e.waitStatus("leak", podReadyTimeout, "restarted", func(p *v1.Pod) bool {
		cs, ok := containerStatus(p, "main", false)
		return ok && cs.RestartCount >= 1
	})
	for _, m := range e.mq.Messages() {
		if strings.HasPrefix(m.Topic, prefix+"/"+e.node+"/cmd/") {
			continue // the test's own command
		}
		if bytes.Contains(m.Payload, []byte(value)) {
			t.Fatalf("secret value published on %s: %s", m.Topic, m.Payload)
		}
	}
	if strings.Contains(e.agent.Logs(), value) {
		t.Fatal("secret value in mqlet's log")
	}
	// The retained status, as a late subscriber sees it.
	late := Connect(t, e.broker.URL())
	late.Subscribe(e.podTopic("leak"))
	got := late.WaitFor(0, 10*time.Second, "retained status", func(m Msg) bool { return m.Topic == e.podTopic("leak") })
	if bytes.Contains(got.Payload, []byte(value)) {
		t.Fatalf("secret value in the retained status: %s", got.Payload)
	}
}

// 7. runAsNonRoot is enforced against the image's user: busybox names no
// user, so it would run as root.
func TestSecurityRuntimeRunAsNonRoot(t *testing.T) {
	e := newPodEnv(t, "")
	e.cleanupPods("rootimg", "asuser")
	pod := func(name, extra string) []byte {
		return []byte(fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: %s, namespace: %s}
spec:
  restartPolicy: Always
  terminationGracePeriodSeconds: 1
  securityContext: {runAsNonRoot: true%s}
  containers:
  - name: main
    image: %s
    imagePullPolicy: Never
    command: ["sh", "-c", "id -u; sleep 3600"]
`, name, e.ns, extra, busybox))
	}
	r := e.apply(pod("rootimg", ""), apiv1.Failed, podReadyTimeout)
	if !strings.Contains(r.Message, "container has runAsNonRoot and image will run as root") {
		t.Fatalf("apply failed with %q, want the kubelet's runAsNonRoot message", r.Message)
	}
	e.waitWaiting("rootimg", "main", "CreateContainerConfigError", "image will run as root", 30*time.Second)
	e.noContainerRan("rootimg")
	e.apply(pod("asuser", ", runAsUser: 1000"), apiv1.Succeeded, podReadyTimeout)
}

// secretAsCommandList is a List of a Secret "pw" holding value and a pod
// whose command is $(PW) from it: runc's "executable file not found" error
// then quotes the secret value, which must never be published or logged.
func secretAsCommandList(namespace, pod, value string) string {
	return fmt.Sprintf(`{"apiVersion":"v1","kind":"List","items":[
	  {"apiVersion":"v1","kind":"Secret","metadata":{"name":"pw","namespace":%q},"stringData":{"PW":%q}},
	  {"apiVersion":"v1","kind":"Pod","metadata":{"name":%q,"namespace":%q},"spec":{
	    "restartPolicy":"Always","terminationGracePeriodSeconds":1,
	    "containers":[{"name":"main","image":%q,"imagePullPolicy":"Never","command":["$(PW)"],
	      "env":[{"name":"PW","valueFrom":{"secretKeyRef":{"name":"pw","key":"PW"}}}]}]}}]}`,
		namespace, value, pod, namespace, busybox)
}
