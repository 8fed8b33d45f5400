package cri

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

var (
	_ runtimeClient = (*instrumentedRuntime)(nil)
	_ imageClient   = (*instrumentedImage)(nil)
)

// deadlineRuntime records how long each call was given and fails with err.
type deadlineRuntime struct {
	runtimeClient
	mu   sync.Mutex
	left map[string]time.Duration // 0: no deadline
	err  error
}

func (d *deadlineRuntime) record(ctx context.Context, method string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	var left time.Duration
	if dl, ok := ctx.Deadline(); ok {
		left = time.Until(dl)
	}
	d.left[method] = left
	return d.err
}

func (d *deadlineRuntime) ListContainers(ctx context.Context, _ *runtimeapi.ContainerFilter) ([]*runtimeapi.Container, error) {
	return nil, d.record(ctx, "ListContainers")
}

func (d *deadlineRuntime) StopContainer(ctx context.Context, _ string, _ int64) error {
	return d.record(ctx, "StopContainer")
}

func (d *deadlineRuntime) ExecSync(ctx context.Context, _ string, _ []string, _ time.Duration) ([]byte, []byte, error) {
	return nil, nil, d.record(ctx, "ExecSync")
}

func (d *deadlineRuntime) GetContainerEvents(ctx context.Context, _ chan *runtimeapi.ContainerEventResponse, _ func(runtimeapi.RuntimeService_GetContainerEventsClient)) error {
	return d.record(ctx, "GetContainerEvents")
}

func (d *deadlineRuntime) RemoveContainer(ctx context.Context, _ string) error {
	return d.record(ctx, "RemoveContainer")
}

type deadlineImage struct {
	imageClient
	rt *deadlineRuntime
}

func (d *deadlineImage) PullImage(ctx context.Context, _ *runtimeapi.ImageSpec, _ *runtimeapi.AuthConfig, _ *runtimeapi.PodSandboxConfig) (string, error) {
	return "", d.rt.record(ctx, "PullImage")
}

func newDeadlineServices(t *testing.T, err error, unavailable func()) (*services, *deadlineRuntime, *instrumentation) {
	t.Helper()
	rt := &deadlineRuntime{left: map[string]time.Duration{}, err: err}
	in := newInstrumentation(Config{RequestTimeout: time.Minute, PullTimeout: time.Hour}, zerolog.Nop(), unavailable)
	return in.wrap(&services{runtime: rt, image: &deadlineImage{rt: rt}}), rt, in
}

func TestInstrumentedCallDeadlines(t *testing.T) {
	svc, rt, _ := newDeadlineServices(t, nil, nil)
	ctx := context.Background()
	_, _ = svc.runtime.ListContainers(ctx, nil)
	_ = svc.runtime.StopContainer(ctx, "c", 30)
	_, _, _ = svc.runtime.ExecSync(ctx, "c", []string{"true"}, 10*time.Second)
	_, _ = svc.image.PullImage(ctx, &runtimeapi.ImageSpec{Image: "x"}, nil, nil)
	_ = svc.runtime.GetContainerEvents(ctx, nil, nil)

	for method, want := range map[string]time.Duration{
		"ListContainers":     time.Minute,
		"StopContainer":      time.Minute + 30*time.Second, // the grace period on top
		"ExecSync":           time.Minute + 10*time.Second, // the command's timeout on top
		"PullImage":          time.Hour,
		"GetContainerEvents": 0, // a stream lasts as long as its context
	} {
		got := rt.left[method]
		if want == 0 {
			if got != 0 {
				t.Errorf("%s has a deadline %v from now, want none", method, got)
			}
			continue
		}
		// Generous slack: the machine is shared.
		if got > want || got < want-10*time.Second {
			t.Errorf("%s deadline %v from now, want about %v", method, got, want)
		}
	}

	// A caller's shorter deadline still wins.
	short, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	_, _ = svc.runtime.ListContainers(short, nil)
	if got := rt.left["ListContainers"]; got > time.Second {
		t.Errorf("ListContainers under a 1s context got %v", got)
	}
}

func TestInstrumentedClassifiesUnavailableAndAsksRecheck(t *testing.T) {
	rechecks := 0
	svc, rt, in := newDeadlineServices(t, status.Error(codes.Unavailable, "connection refused"), func() { rechecks++ })
	_, err := svc.runtime.ListContainers(context.Background(), nil)
	if !errors.Is(err, ErrUnavailable) || rechecks != 1 {
		t.Fatalf("Unavailable: err %v (ErrUnavailable %v), rechecks %d; want ErrUnavailable and 1 re-check", err, errors.Is(err, ErrUnavailable), rechecks)
	}
	if status.Code(err) != codes.Unavailable {
		t.Errorf("the gRPC code is lost: %v", status.Code(err))
	}

	rt.err = status.Error(codes.NotFound, "no such container")
	err = svc.runtime.RemoveContainer(context.Background(), "c")
	if errors.Is(err, ErrUnavailable) || !isNotFound(err) || rechecks != 1 {
		t.Fatalf("NotFound: err %v, rechecks %d; want NotFound as is and no re-check", err, rechecks)
	}
	rt.err = status.Error(codes.InvalidArgument, "bad")
	if err := svc.runtime.StopContainer(context.Background(), "c", 1); errors.Is(err, ErrUnavailable) || status.Code(err) != codes.InvalidArgument {
		t.Fatalf("InvalidArgument: err %v", err)
	}
	rt.err = nil
	_ = svc.runtime.StopContainer(context.Background(), "c", 1)

	got := in.snapshot()
	want := map[string]CallStat{
		"ListContainers":  {Calls: 1, Errors: 1},
		"RemoveContainer": {Calls: 1, Errors: 0}, // NotFound is an answer, not a failure
		"StopContainer":   {Calls: 2, Errors: 1},
	}
	if len(got) != len(want) {
		t.Fatalf("stats %v, want %v", got, want)
	}
	for m, w := range want {
		if got[m] != w {
			t.Errorf("%s: %+v, want %+v", m, got[m], w)
		}
	}
}

func TestInstrumentedLogsEachCallAtDebug(t *testing.T) {
	var buf bytes.Buffer
	rt := &deadlineRuntime{left: map[string]time.Duration{}, err: status.Error(codes.Unavailable, "down")}
	in := newInstrumentation(Config{RequestTimeout: time.Minute}, zerolog.New(&buf).Level(zerolog.DebugLevel), nil)
	svc := in.wrap(&services{runtime: rt, image: &deadlineImage{rt: rt}})
	_, _ = svc.runtime.ListContainers(context.Background(), nil)
	_ = svc.runtime.RemoveContainer(context.Background(), "c")
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], `"call":"ListContainers"`) || !strings.Contains(lines[0], `"code":"Unavailable"`) ||
		!strings.Contains(lines[1], `"call":"RemoveContainer"`) || !strings.Contains(lines[0], `"took"`) {
		t.Fatalf("log lines:\n%s", buf.String())
	}

	buf.Reset()
	in.log = zerolog.New(&buf).Level(zerolog.InfoLevel)
	_, _ = svc.runtime.ListContainers(context.Background(), nil)
	if buf.Len() != 0 {
		t.Fatalf("logged at info level: %s", buf.String())
	}
}

// Through the Manager: every call of a sync goes through the wrapper, and
// an Unavailable answer makes the connection re-check at once (its health
// interval here is an hour).
func TestManagerCallsAreInstrumentedAndUnavailableRechecks(t *testing.T) {
	fake := &scriptedCRI{}
	dial := func(context.Context, Config) (*services, error) {
		return &services{runtime: fake, image: fake}, nil
	}
	m := newManager(Config{HealthInterval: time.Hour, RuntimeRetryMin: time.Millisecond}, zerolog.Nop(), dial)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); m.Run(ctx) }()
	defer func() { cancel(); <-done }()
	waitFor(t, 10*time.Second, "runtime ready", m.Ready)

	svc, err := m.conn.get()
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := svc.runtime.(*instrumentedRuntime); !ok {
		t.Fatalf("the connection hands out %T, not the instrumented runtime", svc.runtime)
	}
	if _, ok := svc.image.(*instrumentedImage); !ok {
		t.Fatalf("the connection hands out %T, not the instrumented image service", svc.image)
	}

	// Counted by the wrapper, which records a call once it has returned.
	versions := func() uint64 { return m.CallStats()["Version"].Calls }
	before := versions()
	fake.mu.Lock()
	fake.fail = append(fake.fail, status.Error(codes.Unavailable, "gone"))
	fake.mu.Unlock()
	if _, err := m.GetPodStatus(ctx, "u1", "p", "ns"); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("GetPodStatus with the runtime unavailable: %v, want ErrUnavailable", err)
	}
	waitFor(t, 10*time.Second, "a re-check after Unavailable", func() bool { return versions() > before })

	if _, err := m.GetPodStatus(ctx, "u1", "p", "ns"); err != nil {
		t.Fatal(err)
	}
	st := m.CallStats()
	if st["ListPodSandbox"].Calls != 2 || st["ListPodSandbox"].Errors != 1 || st["ListContainers"].Calls != 1 || st["Version"].Calls < 2 {
		t.Fatalf("call stats %+v", st)
	}
}

// scriptedCRI answers a handshake and empty listings; ListPodSandbox
// fails with the errors queued in fail.
type scriptedCRI struct {
	runtimeClient
	imageClient
	mu   sync.Mutex
	fail []error
}

func (s *scriptedCRI) Version(context.Context, string) (*runtimeapi.VersionResponse, error) {
	return &runtimeapi.VersionResponse{RuntimeName: "fake", RuntimeVersion: "1"}, nil
}

func (s *scriptedCRI) ListPodSandbox(context.Context, *runtimeapi.PodSandboxFilter) ([]*runtimeapi.PodSandbox, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.fail) > 0 {
		err := s.fail[0]
		s.fail = s.fail[1:]
		return nil, err
	}
	return nil, nil
}

func (s *scriptedCRI) ListContainers(context.Context, *runtimeapi.ContainerFilter) ([]*runtimeapi.Container, error) {
	return nil, nil
}

func (s *scriptedCRI) Close(context.Context) error { return nil }

func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, timeout)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
