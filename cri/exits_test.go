package cri

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"

	containerdevents "github.com/containerd/containerd/api/events"
	eventsapi "github.com/containerd/containerd/api/services/events/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/mqlet/mqlet/internal/liveperiod"
)

func exitEnvelope(t *testing.T, topic, container, process string) *eventsapi.Envelope {
	t.Helper()
	b, err := proto.Marshal(&containerdevents.TaskExit{ContainerID: container, ID: process, ExitStatus: 3})
	if err != nil {
		t.Fatal(err)
	}
	return &eventsapi.Envelope{Namespace: "k8s.io", Topic: topic, Event: &anypb.Any{TypeUrl: "containerd.events.TaskExit", Value: b}}
}

func TestExitedContainer(t *testing.T) {
	cases := []struct {
		name string
		env  *eventsapi.Envelope
		want string
	}{
		{"a container's own process", exitEnvelope(t, taskExitTopic, "c1", "c1"), "c1"},
		{"an exec in it (a probe)", exitEnvelope(t, taskExitTopic, "c1", "exec-7"), ""},
		{"another topic", exitEnvelope(t, "/tasks/start", "c1", "c1"), ""},
		{"no container", exitEnvelope(t, taskExitTopic, "", ""), ""},
		{"no event", &eventsapi.Envelope{Topic: taskExitTopic}, ""},
		{"not a TaskExit", &eventsapi.Envelope{Topic: taskExitTopic, Event: &anypb.Any{Value: []byte{0xff, 0xff, 0xff}}}, ""},
	}
	for _, c := range cases {
		id, ok := exitedContainer(c.env)
		if id != c.want || ok != (c.want != "") {
			t.Errorf("%s: got %q %v, want %q", c.name, id, ok, c.want)
		}
	}
}

// fakeExitStream replays envelopes, then ends with err.
type fakeExitStream struct {
	grpc.ClientStream
	envs []*eventsapi.Envelope
	err  error
}

func (f *fakeExitStream) Recv() (*eventsapi.Envelope, error) {
	if len(f.envs) == 0 {
		return nil, f.err
	}
	e := f.envs[0]
	f.envs = f.envs[1:]
	return e, nil
}

type fakeSubscriber struct {
	stream  *fakeExitStream
	filters []string
	err     error
}

func (f *fakeSubscriber) Subscribe(_ context.Context, in *eventsapi.SubscribeRequest, _ ...grpc.CallOption) (eventsapi.Events_SubscribeClient, error) {
	f.filters = in.Filters
	if f.err != nil {
		return nil, f.err
	}
	return f.stream, nil
}

// forwardExits passes on container exits only, never blocks on a full
// channel, and returns the stream's end.
func TestForwardExits(t *testing.T) {
	src := &fakeSubscriber{stream: &fakeExitStream{envs: []*eventsapi.Envelope{
		exitEnvelope(t, taskExitTopic, "c1", "exec-1"),
		exitEnvelope(t, taskExitTopic, "c1", "c1"),
		exitEnvelope(t, taskExitTopic, "c2", "c2"),
		exitEnvelope(t, taskExitTopic, "c3", "c3"),
	}, err: io.EOF}}
	out := make(chan string, 2)
	got, err := forwardExits(context.Background(), src, out)
	if !got || !errors.Is(err, io.EOF) {
		t.Fatalf("forwardExits: got %v, err %v; want true, EOF", got, err)
	}
	if len(src.filters) != 1 || src.filters[0] != `topic=="/tasks/exit"` {
		t.Errorf("filters %q", src.filters)
	}
	close(out)
	var ids []string
	for id := range out {
		ids = append(ids, id)
	}
	if len(ids) != 2 || ids[0] != "c1" || ids[1] != "c2" {
		t.Errorf("forwarded %v, want [c1 c2] (the exec's exit skipped, c3 dropped on a full channel)", ids)
	}
	refused := &fakeSubscriber{err: errors.New("unknown service containerd.services.events.v1.Events")}
	if got, err := forwardExits(context.Background(), refused, out); got || err == nil {
		t.Errorf("a refused subscription: got %v, err %v", got, err)
	}
}

func TestToldExitsSettle(t *testing.T) {
	now := time.Now()
	told := toldExits{"still": now, "seen": now, "old": now.Add(-exitRelistFor - time.Second)}
	told.settle(func(id string) bool { return id != "seen" }, now)
	if _, ok := told["still"]; !ok || len(told) != 1 {
		t.Errorf("after settle: %v, want only the exit not seen yet and told recently", told)
	}
	if told.retry() == nil {
		t.Error("no retry while an exit waits")
	}
	if (toldExits{}).retry() != nil {
		t.Error("a retry with no exit waiting")
	}
}

// waitRelist returns at once for a told exit (all those told together
// recorded), after the retry delay while one waits, and at the period.
func TestWaitRelist(t *testing.T) {
	ctx := context.Background()
	// waited runs waitRelist, failing the test if it does not return soon.
	waited := func(ctx context.Context, timer *liveperiod.Timer, exits <-chan string, told toldExits) bool {
		t.Helper()
		done := make(chan bool, 1)
		go func() { done <- waitRelist(ctx, timer, exits, told) }()
		select {
		case ok := <-done:
			return ok
		case <-time.After(10 * time.Second):
			t.Fatal("waitRelist did not return")
			return false
		}
	}
	timer := liveperiod.Fixed(time.Hour).NewTimer()
	defer timer.Stop()
	exits := make(chan string, 4)
	exits <- "a"
	exits <- "b"
	told := toldExits{}
	if !waited(ctx, timer, exits, told) {
		t.Fatal("waitRelist ended")
	}
	if len(told) != 2 || len(exits) != 0 {
		t.Errorf("told %v, %d left in the channel; want a and b, none left", told, len(exits))
	}
	// An exit still waiting: the retry fires, long before the hour.
	if !waited(ctx, timer, exits, told) {
		t.Fatal("waitRelist ended")
	}
	short := liveperiod.Fixed(time.Millisecond).NewTimer()
	defer short.Stop()
	if !waited(ctx, short, exits, toldExits{}) {
		t.Fatal("waitRelist ended")
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if waited(cancelled, timer, exits, toldExits{}) {
		t.Error("waitRelist went on after its context ended")
	}
}
