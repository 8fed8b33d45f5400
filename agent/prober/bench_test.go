package prober

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/kubernetes/pkg/probe"
	clocktesting "k8s.io/utils/clock/testing"
)

// What one check costs mqlet itself (go test -bench . -benchmem
// ./agent/prober/): the handler's own work around the runtime call (exec,
// answered at once) and around one HTTP round trip on loopback.
func BenchmarkExecCheck(b *testing.B) {
	clk := clocktesting.NewFakeClock(t0)
	m := New(Options{Exec: &fakeExec{clk: clk}, Clock: clk})
	c := &v1.Container{Name: "main", Env: []v1.EnvVar{{Name: "FILE", Value: "/tmp/healthy"}}}
	w := handlerWorker(m, c, &v1.Probe{TimeoutSeconds: 1, ProbeHandler: v1.ProbeHandler{
		Exec: &v1.ExecAction{Command: []string{"cat", "$(FILE)"}}}}, "")
	b.ReportAllocs()
	for b.Loop() {
		if r, _, err := m.runHandler(context.Background(), w); err != nil || r != probe.Success {
			b.Fatalf("%v %v", r, err)
		}
	}
}

func BenchmarkHTTPGetCheck(b *testing.B) {
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer srv.Close()
	host, portText, _ := net.SplitHostPort(srv.Listener.Addr().String())
	port, _ := strconv.Atoi(portText)
	m := New(Options{})
	c := &v1.Container{Name: "main", Ports: []v1.ContainerPort{{Name: "http", ContainerPort: int32(port)}}}
	w := handlerWorker(m, c, &v1.Probe{TimeoutSeconds: 1, ProbeHandler: v1.ProbeHandler{HTTPGet: &v1.HTTPGetAction{
		Path: "/ready", Port: intstr.FromString("http"), HTTPHeaders: []v1.HTTPHeader{{Name: "X-Probe", Value: "yes"}}}}}, host)
	b.ReportAllocs()
	for b.Loop() {
		if r, _, err := m.runHandler(context.Background(), w); err != nil || r != probe.Success {
			b.Fatalf("%v %v", r, err)
		}
	}
}
