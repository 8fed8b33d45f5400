package prober

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"time"

	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/kubernetes/pkg/probe"
	httpprobe "k8s.io/kubernetes/pkg/probe/http"
)

// httpOnce is the kubelet's HTTP probe transport for plain http: one
// request per connection, "Connection: close", no proxy, no compression.
// It writes the request and reads the answer on the caller's goroutine,
// where net/http's Transport starts a reader and a writer goroutine for
// every connection (keep-alives are off in the kubelet's prober, so every
// check has a connection of its own). At 20 pods with an httpGet readiness
// probe those goroutines and their stacks were a tenth of mqlet's idle
// CPU. Any other scheme (https after a redirect) goes to next, the
// kubelet's own transport.
type httpOnce struct {
	dial func(ctx context.Context, network, addr string) (net.Conn, error)
	next http.RoundTripper
}

func (t httpOnce) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Scheme != "http" {
		return t.next.RoundTrip(req)
	}
	addr := req.URL.Host
	if req.URL.Port() == "" {
		addr = net.JoinHostPort(req.URL.Hostname(), "80")
	}
	ctx := req.Context()
	conn, err := t.dial(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	if deadline, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(deadline)
	}
	// The client's timeout cancels the request's context: the connection is
	// closed under a blocked read or write.
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	closeConn := func() {
		stop()
		conn.Close()
	}
	out := req.Clone(ctx)
	out.Close = true // "Connection: close", as the kubelet's transport sends
	if err := out.Write(conn); err != nil {
		closeConn()
		return nil, fmt.Errorf("writing the probe request: %w", ctxErr(ctx, err))
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), req)
	if err != nil {
		closeConn()
		return nil, fmt.Errorf("reading the probe response: %w", ctxErr(ctx, err))
	}
	resp.Body = &connBody{ReadCloser: resp.Body, closeConn: closeConn}
	return resp, nil
}

// ctxErr prefers the context's reason (a timeout) to the error of the
// connection closed because of it.
func ctxErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

// connBody closes the connection with the response body.
type connBody struct {
	io.ReadCloser
	once      sync.Once
	closeConn func()
}

func (b *connBody) Close() error {
	err := b.ReadCloser.Close()
	b.once.Do(b.closeConn)
	return err
}

// kubeletTransport is the kubelet's prober transport (pkg/probe/http's
// New, built the same way), for what httpOnce does not take: a redirect to
// https. Built once, as the kubelet's prober is.
var kubeletTransport = utilnet.SetTransportDefaults(&http.Transport{
	TLSClientConfig:    &tls.Config{InsecureSkipVerify: true},
	DisableKeepAlives:  true,
	Proxy:              http.ProxyURL(nil),
	DisableCompression: true,
	DialContext:        probe.ProbeDialer().DialContext,
})

// httpCheck runs the kubelet's HTTP check (pkg/probe/http: 2xx and 3xx
// pass, redirects followed on the same host only, the body read up to its
// limit) through httpOnce.
func httpCheck(req *http.Request, timeout time.Duration) (probe.Result, string, error) {
	client := &http.Client{
		Timeout:       timeout,
		Transport:     httpOnce{dial: probe.ProbeDialer().DialContext, next: kubeletTransport},
		CheckRedirect: httpprobe.RedirectChecker(false),
	}
	return httpprobe.DoHTTPProbe(req, client)
}
