package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/mqlet/mqlet/agent/reply"
)

// waitLog waits until attempt 0 of container c of pod name logged want,
// and returns the log.
func (e *podEnv) waitLog(logDir, name, c, want string, timeout time.Duration) string {
	e.t.Helper()
	var out string
	Eventually(e.t, timeout, fmt.Sprintf("%q in the log of %s/%s", want, name, c), func() bool {
		out = logsOf(logDir, e.ns, name, c)
		return strings.Contains(out, want)
	})
	return out
}

// fieldRef and resourceFieldRef env: spec.nodeName is the node's name, as
// the published pod's spec says too.
func TestPodDownwardEnv(t *testing.T) {
	logDir := t.TempDir()
	e := startPodEnv(t, func(string) string { return podTestConfig(logDir, "") })
	e.cleanupPods("denv")
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
	e.apply([]byte(pod), reply.Succeeded, podReadyTimeout)
	out := e.waitLog(logDir, "denv", "main", "done", 30*time.Second)
	t.Logf("container output:\n%s", out)
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
