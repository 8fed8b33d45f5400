package e2e

import (
	"fmt"
	apiv1 "github.com/mqlet/mqlet/api/v1"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
)

// waitLog waits until attempt 0 of container c of pod name logged want,
// and returns the log.
func (e *logPodEnv) waitLog(name, c, want string, timeout time.Duration) string {
	e.t.Helper()
	var out string
	Eventually(e.t, timeout, fmt.Sprintf("%q in the log of %s/%s", want, name, c), func() bool {
		out = logsOf(e.logDir, e.ns, name, c)
		return strings.Contains(out, want)
	})
	return out
}

// logPodEnv is a pod env whose container logs the test reads.
type logPodEnv struct {
	*podEnv
	logDir string
}

// startLogPodEnv starts mqlet with its pod logs in a temporary dir and
// removes the named pods when the test ends.
func startLogPodEnv(t *testing.T, pods ...string) *logPodEnv {
	logDir := t.TempDir()
	e := startPodEnv(t, func(string) string { return podTestConfig(logDir, "") })
	e.cleanupPods(pods...)
	return &logPodEnv{podEnv: e, logDir: logDir}
}

// outputOf applies manifest and returns what container main of pod logged
// up to its line "done".
func (e *logPodEnv) outputOf(manifest, pod string) string {
	e.t.Helper()
	e.apply([]byte(manifest), apiv1.Succeeded, podReadyTimeout)
	out := e.waitLog(pod, "main", "done", 30*time.Second)
	e.t.Logf("container output:\n%s", out)
	return out
}

// fieldRef and resourceFieldRef env: spec.nodeName is the node's name, as
// the published pod's spec says too.
func TestPodDownwardEnv(t *testing.T) {
	e := startLogPodEnv(t, "denv")
	pod := fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: denv, namespace: %s, labels: {app: denv}}
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: main
    image: docker.io/mqlet/busybox:test
    imagePullPolicy: Never
    command: ["sh", "-c", "echo node=$NODE; echo name=$NAME; echo app=$APP; echo ip=$IP; echo mem=$MEM; echo cpu=$CPU; echo done; sleep 3600"]
    resources: {limits: {memory: 32Mi}}
    env:
    - {name: NODE, valueFrom: {fieldRef: {fieldPath: spec.nodeName}}}
    - {name: NAME, valueFrom: {fieldRef: {fieldPath: metadata.name}}}
    - {name: APP, valueFrom: {fieldRef: {fieldPath: "metadata.labels['app']"}}}
    - {name: IP, valueFrom: {fieldRef: {fieldPath: status.podIP}}}
    - {name: MEM, valueFrom: {resourceFieldRef: {resource: limits.memory, divisor: 1Mi}}}
    - {name: CPU, valueFrom: {resourceFieldRef: {resource: limits.cpu, divisor: 1m}}}
`, e.ns)
	out := e.outputOf(pod, "denv")
	for _, want := range []string{"node=" + e.node + "\n", "name=denv\n", "app=denv\n", "mem=32\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	p := e.waitStatus("denv", 30*time.Second, "running with a pod IP", func(p *v1.Pod) bool { return p.Status.PodIP != "" })
	if !strings.Contains(out, "ip="+p.Status.PodIP+"\n") {
		t.Errorf("status.podIP in the env differs from the published %s", p.Status.PodIP)
	}
	if p.Spec.NodeName != e.node {
		t.Errorf("published spec.nodeName = %q, want %q", p.Spec.NodeName, e.node)
	}
	// No cpu limit: the node's allocatable CPUs, in millicores.
	if strings.Contains(out, "cpu=\n") || strings.Contains(out, "cpu=0\n") {
		t.Errorf("limits.cpu without a limit is empty or zero")
	}
}

// downwardAPI and projected volumes hold the right files; secret,
// downwardAPI and projected volumes are tmpfs mounts in the container; a
// serviceAccountToken projection is refused at once, naming the field.
func TestPodDownwardAndProjectedVolumes(t *testing.T) {
	e := startLogPodEnv(t, "dvol")
	manifest := fmt.Sprintf(`apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: ConfigMap
  metadata: {name: cfg, namespace: %[1]s}
  data: {greeting: hello}
- apiVersion: v1
  kind: Secret
  metadata: {name: sec, namespace: %[1]s}
  stringData: {password: pw-value}
- apiVersion: v1
  kind: Pod
  metadata: {name: dvol, namespace: %[1]s, labels: {app: dvol}, annotations: {note: hi}}
  spec:
    terminationGracePeriodSeconds: 2
    containers:
    - name: main
      image: docker.io/mqlet/busybox:test
      imagePullPolicy: Never
      resources: {limits: {memory: 16Mi}}
      command: ["sh", "-c", "for f in /down/name /down/labels /down/mem /proj/greeting /proj/creds/password /proj/ns /sec/password; do echo \"$f=$(cat $f)\"; done; echo \"mode=$(stat -Lc %%a /proj/creds/password)\"; echo \"roots $(stat -c %%a /sec) $(stat -c %%a /cfg)\"; for m in /down /proj /sec /cfg; do echo \"fs $m $(awk -v m=$m '$2==m {print $3}' /proc/mounts)\"; done; echo done; sleep 3600"]
      volumeMounts:
      - {name: down, mountPath: /down}
      - {name: proj, mountPath: /proj}
      - {name: sec, mountPath: /sec}
      - {name: cfg, mountPath: /cfg}
    volumes:
    - name: down
      downwardAPI:
        items:
        - {path: name, fieldRef: {fieldPath: metadata.name}}
        - {path: labels, fieldRef: {fieldPath: metadata.labels}}
        - {path: mem, resourceFieldRef: {containerName: main, resource: limits.memory, divisor: 1Mi}}
    - name: proj
      projected:
        sources:
        - configMap: {name: cfg}
        - secret: {name: sec, items: [{key: password, path: creds/password, mode: 0400}]}
        - downwardAPI: {items: [{path: ns, fieldRef: {fieldPath: metadata.namespace}}]}
    - name: sec
      secret: {secretName: sec}
    - name: cfg
      configMap: {name: cfg}
`, e.ns)
	out := e.outputOf(manifest, "dvol")
	for _, want := range []string{
		"/down/name=dvol\n", "/down/labels=app=\"dvol\"\n", "/down/mem=16\n",
		"/proj/greeting=hello\n", "/proj/creds/password=pw-value\n", "/proj/ns=" + e.ns + "\n",
		"/sec/password=pw-value\n", "mode=400\n", "roots 1777 777\n",
		"fs /down tmpfs\n", "fs /proj tmpfs\n", "fs /sec tmpfs\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	if strings.Contains(out, "fs /cfg tmpfs") {
		t.Error("the configMap volume is a tmpfs; it was expected on the node's disk")
	}

	token := fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: token, namespace: %s}
spec:
  containers:
  - {name: main, image: docker.io/mqlet/busybox:test, imagePullPolicy: Never, command: [sleep, "3600"], volumeMounts: [{name: t, mountPath: /t}]}
  volumes:
  - name: t
    projected: {sources: [{serviceAccountToken: {path: token}}]}
`, e.ns)
	start := time.Now()
	r := e.apply([]byte(token), apiv1.Failed, 30*time.Second)
	if !strings.Contains(r.Message, "serviceAccountToken") {
		t.Errorf("refusal does not name serviceAccountToken: %s", r.Message)
	}
	t.Logf("refused in %s: %s", time.Since(start).Round(time.Millisecond), r.Message)
}

// A ConfigMap change reaches the mounted volume of a running pod within
// 10 s, without a restart; a subPath mount keeps the old content, as in
// the kubelet.
func TestPodConfigMapVolumeUpdates(t *testing.T) {
	e := startLogPodEnv(t, "live")
	cm := func(v string) []byte {
		return []byte(fmt.Sprintf(`apiVersion: v1
kind: ConfigMap
metadata: {name: live-cfg, namespace: %s}
data: {greeting: %s}
`, e.ns, v))
	}
	e.apply(cm("first"), apiv1.Succeeded, 30*time.Second)
	pod := fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: live, namespace: %s}
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: main
    image: docker.io/mqlet/busybox:test
    imagePullPolicy: Never
    command: ["sh", "-c", "while true; do echo \"vol=$(cat /cfg/greeting) sub=$(cat /sub/greeting)\"; sleep 0.2; done"]
    volumeMounts:
    - {name: cfg, mountPath: /cfg}
    - {name: cfg, mountPath: /sub/greeting, subPath: greeting}
  volumes:
  - name: cfg
    configMap: {name: live-cfg}
`, e.ns)
	e.apply([]byte(pod), apiv1.Succeeded, podReadyTimeout)
	e.waitLog("live", "main", "vol=first sub=first", 30*time.Second)
	before := e.cri.Running(e.ns, "live")
	if len(before) != 1 {
		t.Fatalf("running containers: %s", dump(before))
	}

	start := time.Now()
	e.apply(cm("second"), apiv1.Succeeded, 30*time.Second)
	var seen time.Duration
	Eventually(t, 30*time.Second, "the new value in the volume", func() bool {
		if strings.Contains(logsOf(e.logDir, e.ns, "live", "main"), "vol=second") {
			seen = time.Since(start)
			return true
		}
		return false
	})
	t.Logf("ConfigMap change seen in the container after %s", seen.Round(time.Millisecond))
	if seen > 10*time.Second {
		t.Errorf("the change took %s to reach the volume, want within 10 s", seen)
	}
	out := logsOf(e.logDir, e.ns, "live", "main")
	if !strings.Contains(out, "vol=second sub=first") {
		t.Errorf("subPath mount changed too or the line is missing:\n%s", tail(out, 400))
	}
	after := e.cri.Running(e.ns, "live")
	if len(after) != 1 || after[0].Id != before[0].Id {
		t.Fatalf("the container was replaced: before %s after %s", dump(before), dump(after))
	}
	p, _ := e.status("live")
	if cs, ok := containerStatus(p, "main", false); !ok || cs.RestartCount != 0 {
		t.Errorf("container restarted: %s", dump(cs))
	}
}

// /etc/hosts is the pod's managed file: its IP with hostname and FQDN
// (subdomain set) and its hostAliases.
func TestPodEtcHosts(t *testing.T) {
	e := startLogPodEnv(t, "hosts")
	pod := fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: hosts, namespace: %s}
spec:
  terminationGracePeriodSeconds: 2
  hostname: box
  subdomain: grp
  hostAliases:
  - {ip: 10.9.9.9, hostnames: [db, db.lan]}
  containers:
  - name: main
    image: docker.io/mqlet/busybox:test
    imagePullPolicy: Never
    command: ["sh", "-c", "cat /etc/hosts; echo done; sleep 3600"]
`, e.ns)
	out := e.outputOf(pod, "hosts")
	t.Logf("/etc/hosts:\n%s", out)
	p := e.waitStatus("hosts", 30*time.Second, "a pod IP", func(p *v1.Pod) bool { return p.Status.PodIP != "" })
	for _, want := range []string{
		"127.0.0.1\tlocalhost\n",
		p.Status.PodIP + "\tbox.grp." + e.ns + ".svc.cluster.local\tbox\n",
		"10.9.9.9\tdb\tdb.lan\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("/etc/hosts lacks %q", want)
		}
	}
}

// An emptyDir of medium Memory is a tmpfs that holds no more than its
// sizeLimit.
func TestPodEmptyDirMemory(t *testing.T) {
	e := startLogPodEnv(t, "memdir")
	pod := fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: memdir, namespace: %s}
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: main
    image: docker.io/mqlet/busybox:test
    imagePullPolicy: Never
    command: ["sh", "-c", "echo \"fs $(awk '$2==\"/mem\" {print $3}' /proc/mounts)\"; if dd if=/dev/zero of=/mem/big bs=1024 count=3072 2>/dev/null; then echo WROTE_3M; else echo full; fi; echo done; sleep 3600"]
    volumeMounts: [{name: mem, mountPath: /mem}]
  volumes:
  - name: mem
    emptyDir: {medium: Memory, sizeLimit: 2Mi}
`, e.ns)
	out := e.outputOf(pod, "memdir")
	if !strings.Contains(out, "fs tmpfs\n") {
		t.Error("the memory emptyDir is not a tmpfs")
	}
	if strings.Contains(out, "WROTE_3M") || !strings.Contains(out, "full\n") {
		t.Error("3 MiB fit in an emptyDir of sizeLimit 2Mi")
	}
}

// fsGroup: 2000 gives the emptyDir group 2000 and setgid, files the
// container creates there get group 2000, the container has the group,
// and a secret volume's files are group-readable by it.
func TestPodFSGroup(t *testing.T) {
	e := startLogPodEnv(t, "fsgroup")
	manifest := fmt.Sprintf(`apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Secret
  metadata: {name: fs-sec, namespace: %[1]s}
  stringData: {key: value}
- apiVersion: v1
  kind: Pod
  metadata: {name: fsgroup, namespace: %[1]s}
  spec:
    terminationGracePeriodSeconds: 2
    securityContext: {runAsUser: 1000, runAsGroup: 1000, fsGroup: 2000}
    containers:
    - name: main
      image: docker.io/mqlet/busybox:test
      imagePullPolicy: Never
      command: ["sh", "-c", "echo \"dir $(stat -c '%%g %%a' /data)\"; touch /data/new; echo \"file $(stat -c %%g /data/new)\"; echo \"groups $(id -G)\"; echo \"secret $(cat /sec/key)\"; echo done; sleep 3600"]
      volumeMounts:
      - {name: data, mountPath: /data}
      - {name: sec, mountPath: /sec}
    volumes:
    - {name: data, emptyDir: {}}
    - {name: sec, secret: {secretName: fs-sec}}
`, e.ns)
	out := e.outputOf(manifest, "fsgroup")
	for _, want := range []string{"dir 2000 2777\n", "file 2000\n", "secret value\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	_, groups, _ := strings.Cut(out, "groups ")
	groups, _, _ = strings.Cut(groups, "\n")
	if !strings.Contains(" "+groups+" ", " 2000 ") {
		t.Errorf("the container's groups %q lack 2000", groups)
	}
}

// fileKeyRef: an init container writes an env file into an emptyDir and
// the app container's env reads a key of it.
func TestPodFileKeyRefEnv(t *testing.T) {
	e := startLogPodEnv(t, "filekey")
	pod := fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: filekey, namespace: %s}
spec:
  terminationGracePeriodSeconds: 2
  initContainers:
  - name: init
    image: docker.io/mqlet/busybox:test
    imagePullPolicy: Never
    command: ["sh", "-c", "echo \"GREETING='from init'\" > /env/app.env"]
    volumeMounts: [{name: env, mountPath: /env}]
  containers:
  - name: main
    image: docker.io/mqlet/busybox:test
    imagePullPolicy: Never
    command: ["sh", "-c", "echo \"greeting=$GREETING\"; echo done; sleep 3600"]
    env:
    - {name: GREETING, valueFrom: {fileKeyRef: {volumeName: env, path: app.env, key: GREETING}}}
    volumeMounts: [{name: env, mountPath: /env}]
  volumes:
  - {name: env, emptyDir: {}}
`, e.ns)
	out := e.outputOf(pod, "filekey")
	if !strings.Contains(out, "greeting=from init\n") {
		t.Errorf("env from the file missing:\n%s", out)
	}
}
