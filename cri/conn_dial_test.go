package cri

import (
	"context"
	"net"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// slowCRI answers Version only once released, like a runtime too loaded
// to answer within the connect timeout.
type slowCRI struct {
	runtimeapi.UnimplementedRuntimeServiceServer
	runtimeapi.UnimplementedImageServiceServer
	release chan struct{}
}

func (s *slowCRI) Version(ctx context.Context, _ *runtimeapi.VersionRequest) (*runtimeapi.VersionResponse, error) {
	select {
	case <-s.release:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return &runtimeapi.VersionResponse{Version: "0.1.0", RuntimeName: "slow", RuntimeVersion: "1", RuntimeApiVersion: "v1"}, nil
}

func (s *slowCRI) ImageFsInfo(context.Context, *runtimeapi.ImageFsInfoRequest) (*runtimeapi.ImageFsInfoResponse, error) {
	return &runtimeapi.ImageFsInfoResponse{}, nil
}

// openConns counts the server side's open connections.
type openConns struct {
	net.Listener
	open atomic.Int64
}

func (l *openConns) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.open.Add(1)
	return &countedConn{Conn: c, l: l}, nil
}

type countedConn struct {
	net.Conn
	l    *openConns
	once sync.Once
}

func (c *countedConn) Close() error {
	c.once.Do(func() { c.l.open.Add(-1) })
	return c.Conn.Close()
}

// TestDialLeaksNoConnectionWhenTheHandshakeTimesOut: every dial of a
// runtime that does not answer within ConnectTimeout fails, and leaves no
// connection open behind it (cri-client's Build would leave one per
// attempt); once the runtime answers, a dial succeeds and holds its one.
func TestDialLeaksNoConnectionWhenTheHandshakeTimesOut(t *testing.T) {
	socket := filepath.Join(t.TempDir(), "cri.sock")
	lis, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	counted := &openConns{Listener: lis}
	fake := &slowCRI{release: make(chan struct{})}
	srv := grpc.NewServer()
	runtimeapi.RegisterRuntimeServiceServer(srv, fake)
	runtimeapi.RegisterImageServiceServer(srv, fake)
	go func() { _ = srv.Serve(counted) }()
	t.Cleanup(srv.Stop)

	cfg := Config{Endpoint: "unix://" + socket, ConnectTimeout: 100 * time.Millisecond, RequestTimeout: 5 * time.Second}
	for i := 0; i < 5; i++ {
		if svc, err := dialCRI(context.Background(), cfg); err == nil {
			_ = svc.runtime.Close(context.Background())
			_ = svc.image.Close(context.Background())
			t.Fatal("a dial succeeded against a runtime that does not answer")
		}
	}
	// The server sees each closed connection go once its reader ends.
	deadline := time.Now().Add(10 * time.Second)
	for counted.open.Load() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d connections still open after 5 failed dials, want 0", counted.open.Load())
		}
		time.Sleep(20 * time.Millisecond)
	}
	close(fake.release)
	svc, err := dialCRI(context.Background(), cfg)
	if err != nil {
		t.Fatalf("dial once the runtime answers: %v", err)
	}
	defer svc.image.Close(context.Background())
	defer svc.runtime.Close(context.Background())
	if _, err := svc.runtime.Version(context.Background(), "v1"); err != nil {
		t.Fatal(err)
	}
}
