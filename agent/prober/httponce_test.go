package prober

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/kubernetes/pkg/probe"
)

// httpCheck gives the kubelet prober's verdict and output, case by case,
// on one connection per check that it closes.
func TestHTTPCheckAgreesWithTheKubeletProber(t *testing.T) {
	var conns atomic.Int32
	var closeHeader atomic.Value
	mux := http.NewServeMux()
	mux.HandleFunc("/ok", func(rw http.ResponseWriter, r *http.Request) {
		closeHeader.Store(r.Header.Get("Connection") + "|" + r.Header.Get("Accept-Encoding") + "|" + r.UserAgent())
		_, _ = rw.Write([]byte("fine"))
	})
	mux.HandleFunc("/bad", func(rw http.ResponseWriter, r *http.Request) { rw.WriteHeader(http.StatusServiceUnavailable) })
	mux.HandleFunc("/here", func(rw http.ResponseWriter, r *http.Request) { http.Redirect(rw, r, "/ok", http.StatusFound) })
	mux.HandleFunc("/away", func(rw http.ResponseWriter, r *http.Request) {
		http.Redirect(rw, r, "http://elsewhere.invalid/ok", http.StatusFound)
	})
	mux.HandleFunc("/big", func(rw http.ResponseWriter, r *http.Request) { _, _ = rw.Write([]byte(strings.Repeat("x", 64<<10))) })
	mux.HandleFunc("/slow", func(rw http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-time.After(5 * time.Second):
		}
	})
	srv := httptest.NewUnstartedServer(mux)
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()

	for _, path := range []string{"/ok", "/bad", "/here", "/away", "/big", "/missing"} {
		req, err := http.NewRequest(http.MethodGet, srv.URL+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("User-Agent", "kube-probe/1.37")
		wantR, wantOut, wantErr := httpProber.Probe(req.Clone(context.Background()), 5*time.Second)
		before := conns.Load()
		gotR, gotOut, gotErr := httpCheck(req.Clone(context.Background()), 5*time.Second)
		if gotR != wantR || gotOut != wantOut || (gotErr == nil) != (wantErr == nil) {
			t.Errorf("%s: got %v %.40q %v, the kubelet's prober %v %.40q %v", path, gotR, gotOut, gotErr, wantR, wantOut, wantErr)
		}
		if path == "/here" {
			if n := conns.Load() - before; n != 2 {
				t.Errorf("%s: %d connections, want one per request (2)", path, n)
			}
		}
	}
	if h, _ := closeHeader.Load().(string); h != "close||kube-probe/1.37" {
		t.Errorf("request headers Connection|Accept-Encoding|User-Agent = %q, want close||kube-probe/1.37", h)
	}

	// A server slower than the timeout fails the check at the timeout.
	req, _ := http.NewRequest(http.MethodGet, srv.URL+"/slow", nil)
	start := time.Now()
	r, out, err := httpCheck(req, 200*time.Millisecond)
	if took := time.Since(start); r != probe.Failure || err != nil || took > 3*time.Second {
		t.Errorf("slow server: %v %q %v after %v, want a failure at the 200 ms timeout", r, out, err, took)
	}
	// Nothing listening: a failure, as in the kubelet.
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := l.Addr().String()
	l.Close()
	req, _ = http.NewRequest(http.MethodGet, "http://"+addr+"/", nil)
	if r, _, err := httpCheck(req, time.Second); r != probe.Failure || err != nil {
		t.Errorf("refused connection: %v %v, want a failure", r, err)
	}
}
