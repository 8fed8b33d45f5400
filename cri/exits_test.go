package cri

import (
	"context"
	"errors"
	"io"
	"reflect"
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

func deleteEnvelope(t *testing.T, container string) *eventsapi.Envelope {
	t.Helper()
	b, err := proto.Marshal(&containerdevents.ContainerDelete{ID: container})
	if err != nil {
		t.Fatal(err)
	}
	return &eventsapi.Envelope{Namespace: "k8s.io", Topic: containerDeleteTopic, Event: &anypb.Any{TypeUrl: "containerd.events.ContainerDelete", Value: b}}
}

func TestChangedContainer(t *testing.T) {
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
		{"a container removed", deleteEnvelope(t, "c2"), "c2"},
		{"a removal naming none", deleteEnvelope(t, ""), ""},
		{"not a ContainerDelete", &eventsapi.Envelope{Topic: containerDeleteTopic, Event: &anypb.Any{Value: []byte{0xff, 0xff, 0xff}}}, ""},
	}
	for _, c := range cases {
		change, ok := changedContainer(c.env)
		if change.ID != c.want || ok != (c.want != "") || change.Removed != (c.env.Topic == containerDeleteTopic && ok) {
			t.Errorf("%s: got %+v %v, want %q", c.name, change, ok, c.want)
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

// forwardExits passes on container exits and removals only, never blocks
// on a full channel, says the stream is live while it is, and returns the
// stream's end.
func TestForwardExits(t *testing.T) {
	src := &fakeSubscriber{stream: &fakeExitStream{envs: []*eventsapi.Envelope{
		exitEnvelope(t, taskExitTopic, "c1", "exec-1"),
		exitEnvelope(t, taskExitTopic, "c1", "c1"),
		deleteEnvelope(t, "c2"),
		exitEnvelope(t, taskExitTopic, "c3", "c3"),
	}, err: io.EOF}}
	out := make(chan containerChange, 2)
	var live []bool
	got, err := forwardExits(context.Background(), src, out, func(l bool) { live = append(live, l) })
	if !got || !errors.Is(err, io.EOF) {
		t.Fatalf("forwardExits: got %v, err %v; want true, EOF", got, err)
	}
	if len(src.filters) != 2 || src.filters[0] != `topic=="/tasks/exit"` || src.filters[1] != `topic=="/containers/delete"` {
		t.Errorf("filters %q", src.filters)
	}
	if len(live) != 2 || !live[0] || live[1] {
		t.Errorf("live told %v, want [true false]", live)
	}
	close(out)
	var changes []containerChange
	for c := range out {
		changes = append(changes, c)
	}
	if want := []containerChange{{ID: "c1"}, {ID: "c2", Removed: true}}; !reflect.DeepEqual(changes, want) {
		t.Errorf("forwarded %+v, want %+v (the exec's exit skipped, c3 dropped on a full channel)", changes, want)
	}
	refused := &fakeSubscriber{err: errors.New("unknown service containerd.services.events.v1.Events")}
	live = nil
	if got, err := forwardExits(context.Background(), refused, out, func(l bool) { live = append(live, l) }); got || err == nil || len(live) != 0 {
		t.Errorf("a refused subscription: got %v, err %v, live told %v", got, err, live)
	}
}

// A told exit is seen once the container no longer runs; a told removal
// once it is no longer listed at all.
func TestRelisterShowsToldChanges(t *testing.T) {
	r := &relister{
		containers: map[string]plegRecord{"up": {state: ContainerRunning}, "down": {state: ContainerExited}},
		sandboxes:  map[string]plegRecord{"sb": {state: ContainerRunning}},
	}
	for _, c := range []struct {
		change containerChange
		want   bool
	}{
		{containerChange{ID: "up"}, false},
		{containerChange{ID: "down"}, true},
		{containerChange{ID: "sb"}, false},
		{containerChange{ID: "gone"}, true},
		{containerChange{ID: "down", Removed: true}, false},
		{containerChange{ID: "sb", Removed: true}, false},
		{containerChange{ID: "gone", Removed: true}, true},
	} {
		if got := r.shows(c.change); got != c.want {
			t.Errorf("shows(%+v) = %v, want %v", c.change, got, c.want)
		}
	}
}

// While the runtime's events are received the PLEG relists at the evented
// period (never shorter than its own), and at its own period otherwise;
// every change of the stream is told.
func TestRelistPeriodFollowsTheEventStream(t *testing.T) {
	stream := newExitStream()
	period := relistPeriod(liveperiod.Fixed(time.Second), 10*time.Second, stream)
	live, changed := stream.state()
	if live || period.Period() != time.Second {
		t.Fatalf("no stream: live %v, period %v; want false, 1s", live, period.Period())
	}
	stream.set(true)
	select {
	case <-changed:
	default:
		t.Fatal("the stream coming up was not told")
	}
	if p := period.Period(); p != 10*time.Second {
		t.Errorf("stream live: period %v, want 10s", p)
	}
	if p := relistPeriod(liveperiod.Fixed(time.Minute), 10*time.Second, stream).Period(); p != time.Minute {
		t.Errorf("stream live, own period a minute: period %v, want 1m", p)
	}
	if p := relistPeriod(liveperiod.Fixed(time.Second), 0, stream).Period(); p != time.Second {
		t.Errorf("no evented period: %v, want 1s", p)
	}
	_, changed = stream.state()
	stream.set(true)
	select {
	case <-changed:
		t.Error("a change told when nothing changed")
	default:
	}
	stream.set(false)
	select {
	case <-changed:
	default:
		t.Fatal("the stream ending was not told")
	}
	if p := period.Period(); p != time.Second {
		t.Errorf("stream ended: period %v, want 1s", p)
	}
}

func TestToldExitsSettle(t *testing.T) {
	now := time.Now()
	still, seen, old := containerChange{ID: "still"}, containerChange{ID: "seen", Removed: true}, containerChange{ID: "old"}
	told := toldExits{still: now, seen: now, old: now.Add(-exitRelistFor - time.Second)}
	told.settle(func(c containerChange) bool { return c == seen }, now)
	if _, ok := told[still]; !ok || len(told) != 1 {
		t.Errorf("after settle: %v, want only the exit not seen yet and told recently", told)
	}
	if told.retry(now) == nil {
		t.Error("no retry while an exit waits")
	}
	if (toldExits{}).retry(now) != nil {
		t.Error("a retry with no exit waiting")
	}
	// Relisted soon at first, then less often, never more than a second apart.
	for _, c := range []struct {
		age, want time.Duration
	}{
		{0, exitRelistEvery},
		{time.Second, 250 * time.Millisecond},
		{8 * time.Second, exitRelistMaxGap},
	} {
		if got := told.retryDelay(now.Add(c.age)); got != c.want {
			t.Errorf("retry delay %v after the exit: %v, want %v", c.age, got, c.want)
		}
	}
}

// waitRelist returns at once for a told exit (all those told together
// recorded), after the retry delay while one waits, and at the period.
func TestWaitRelist(t *testing.T) {
	ctx := context.Background()
	// waited runs waitRelist, failing the test if it does not return soon.
	waited := func(ctx context.Context, timer *liveperiod.Timer, exits <-chan containerChange, told toldExits) bool {
		t.Helper()
		done := make(chan bool, 1)
		go func() { done <- waitRelist(ctx, timer, exits, told, nil) }()
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
	exits := make(chan containerChange, 4)
	exits <- containerChange{ID: "a"}
	exits <- containerChange{ID: "b", Removed: true}
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
	// The event stream coming or going makes a relist at once.
	streamChanged := make(chan struct{})
	close(streamChanged)
	done := make(chan bool, 1)
	go func() { done <- waitRelist(ctx, timer, exits, toldExits{}, streamChanged) }()
	select {
	case ok := <-done:
		if !ok {
			t.Error("waitRelist ended at a stream change")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("waitRelist did not return at a stream change")
	}
}
