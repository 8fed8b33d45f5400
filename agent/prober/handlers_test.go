package prober

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/kubernetes/pkg/probe"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/mqlet/mqlet/cri"
)

type fakeExec struct {
	clk     *clocktesting.FakeClock
	gotID   string
	gotCmd  []string
	gotWait time.Duration
	out     string
	code    int
	err     error
	takes   time.Duration
}

func (f *fakeExec) ExecSync(_ context.Context, id string, cmd []string, timeout time.Duration) ([]byte, []byte, int, error) {
	f.gotID, f.gotCmd, f.gotWait = id, cmd, timeout
	f.clk.Step(f.takes)
	return []byte(f.out), []byte("err"), f.code, f.err
}

func handlerWorker(m *Manager, c *v1.Container, p *v1.Probe, podIP string) *worker {
	pod := testPod(*c)
	return newWorker(m, pod, &pod.Spec.Containers[0], "c1", podIP, t0, Liveness, p)
}

func TestExecHandler(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	ex := &fakeExec{clk: clk, out: "fine\n"}
	m := New(Options{Exec: ex, Clock: clk})
	c := &v1.Container{Name: "main", Env: []v1.EnvVar{{Name: "FILE", Value: "/tmp/healthy"},
		{Name: "SECRET", ValueFrom: &v1.EnvVarSource{SecretKeyRef: &v1.SecretKeySelector{Key: "k"}}}}}
	p := &v1.Probe{TimeoutSeconds: 2, ProbeHandler: v1.ProbeHandler{Exec: &v1.ExecAction{Command: []string{"cat", "$(FILE)", "$(SECRET)"}}}}
	w := handlerWorker(m, c, p, "")

	r, out, err := m.runHandler(context.Background(), w)
	if err != nil || r != probe.Success || out != "fine\nerr" {
		t.Fatalf("exit 0: %v %q %v, want success with stdout+stderr", r, out, err)
	}
	if ex.gotID != "c1" || ex.gotWait != 2*time.Second || strings.Join(ex.gotCmd, " ") != "cat /tmp/healthy $(SECRET)" {
		t.Fatalf("ran %q in %s with timeout %s; want literal env expanded only, timeout 2s", ex.gotCmd, ex.gotID, ex.gotWait)
	}
	ex.code = 1
	if r, _, err := m.runHandler(context.Background(), w); err != nil || r != probe.Failure {
		t.Fatalf("exit 1: %v %v, want failure", r, err)
	}
	ex.code, ex.err, ex.takes = 0, errors.New("deadline"), 2*time.Second
	if r, out, err := m.runHandler(context.Background(), w); err != nil || r != probe.Failure || !strings.Contains(out, "timed out") {
		t.Fatalf("outlived the timeout: %v %q %v, want a timed-out failure", r, out, err)
	}
	ex.takes = 0
	ex.err = cri.ErrUnavailable
	if r, _, err := m.runHandler(context.Background(), w); err == nil || r != probe.Unknown {
		t.Fatalf("runtime unavailable: %v %v, want an error (no verdict)", r, err)
	}
}

func TestHTTPGetHandler(t *testing.T) {
	var gotHeader, gotPath string
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		gotHeader, gotPath = r.Header.Get("X-Probe"), r.URL.Path
		if r.URL.Path == "/bad" {
			rw.WriteHeader(http.StatusInternalServerError)
			return
		}
		_, _ = rw.Write([]byte("ok"))
	}))
	defer srv.Close()
	host, portText, _ := net.SplitHostPort(srv.Listener.Addr().String())
	port, _ := strconv.Atoi(portText)
	m := New(Options{})
	c := &v1.Container{Name: "main", Ports: []v1.ContainerPort{{Name: "http", ContainerPort: int32(port)}}}
	p := &v1.Probe{TimeoutSeconds: 5, ProbeHandler: v1.ProbeHandler{HTTPGet: &v1.HTTPGetAction{
		Path: "/healthz", Port: intstr.FromString("http"), HTTPHeaders: []v1.HTTPHeader{{Name: "X-Probe", Value: "yes"}}}}}
	w := handlerWorker(m, c, p, host)
	if r, _, err := m.runHandler(context.Background(), w); err != nil || r != probe.Success {
		t.Fatalf("200 on a named port: %v %v, want success", r, err)
	}
	if gotHeader != "yes" || gotPath != "/healthz" {
		t.Fatalf("server saw path %q header %q", gotPath, gotHeader)
	}
	// The request is built once per worker and sent again at each check.
	gotPath = ""
	if r, _, err := m.runHandler(context.Background(), w); err != nil || r != probe.Success || gotPath != "/healthz" {
		t.Fatalf("second check: %v %v (path %q), want success on /healthz", r, err, gotPath)
	}
	// A worker's spec never changes: each case below is a new worker.
	bad := p.DeepCopy()
	bad.HTTPGet.Path = "/bad"
	if r, out, err := m.runHandler(context.Background(), handlerWorker(m, c, bad, host)); err != nil || r != probe.Failure || !strings.Contains(out, "500") {
		t.Fatalf("500: %v %q %v, want failure naming the code", r, out, err)
	}
	nope := p.DeepCopy()
	nope.HTTPGet.Port = intstr.FromString("nope")
	if _, _, err := m.runHandler(context.Background(), handlerWorker(m, c, nope, host)); err == nil {
		t.Fatal("an unknown named port gave no error")
	}
	if _, _, err := m.runHandler(context.Background(), handlerWorker(m, c, p, "")); err == nil {
		t.Fatal("a pod without IP gave no error")
	}
}

func TestTCPSocketHandler(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	m := New(Options{})
	p := &v1.Probe{TimeoutSeconds: 5, ProbeHandler: v1.ProbeHandler{TCPSocket: &v1.TCPSocketAction{Port: intstr.FromInt32(int32(port))}}}
	w := handlerWorker(m, &v1.Container{Name: "main"}, p, "127.0.0.1")
	if r, _, err := m.runHandler(context.Background(), w); err != nil || r != probe.Success {
		t.Fatalf("listening: %v %v, want success", r, err)
	}
	l.Close()
	if r, _, err := m.runHandler(context.Background(), w); err != nil || r != probe.Failure {
		t.Fatalf("closed: %v %v, want failure", r, err)
	}
}

func TestGRPCHandler(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	hs := health.NewServer()
	healthpb.RegisterHealthServer(srv, hs)
	go func() { _ = srv.Serve(l) }()
	defer srv.Stop()
	hs.SetServingStatus("db", healthpb.HealthCheckResponse_NOT_SERVING)

	m := New(Options{})
	service := "db"
	p := &v1.Probe{TimeoutSeconds: 5, ProbeHandler: v1.ProbeHandler{GRPC: &v1.GRPCAction{Port: int32(l.Addr().(*net.TCPAddr).Port)}}}
	w := handlerWorker(m, &v1.Container{Name: "main"}, p, "127.0.0.1")
	if r, _, err := m.runHandler(context.Background(), w); err != nil || r != probe.Success {
		t.Fatalf("overall service serving: %v %v, want success", r, err)
	}
	p.GRPC.Service = &service
	if r, _, err := m.runHandler(context.Background(), w); err != nil || r != probe.Failure {
		t.Fatalf("service db not serving: %v %v, want failure", r, err)
	}
}

// A check in flight ends with its worker: a server that accepts and never
// answers does not hold a gRPC or tcp check for its whole timeout.
func TestChecksEndWithTheirContext(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			defer c.Close() // held open, silent
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	r, _, err := grpcCheck(ctx, l.Addr().String(), "", false, time.Hour)
	if took := time.Since(start); took > 10*time.Second || err != nil || r != probe.Failure {
		t.Fatalf("silent server: %v %v after %v, want a failure as soon as the context ends", r, err, took)
	}
	done, stop := context.WithCancel(context.Background())
	stop()
	if r, _, _ := tcpCheck(done, l.Addr().String(), time.Hour); r != probe.Failure {
		t.Fatalf("tcp check with an ended context: %v", r)
	}
}
