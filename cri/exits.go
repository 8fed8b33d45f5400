package cri

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	containerdevents "github.com/containerd/containerd/api/events"
	eventsapi "github.com/containerd/containerd/api/services/events/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/mqlet/mqlet/internal/liveperiod"
)

// Exit hints. containerd 1.6 has no CRI container events, so the PLEG
// relists; a container's exit would wait for the next relist (half the
// period on average). containerd publishes every task exit on its own
// events service, on the same socket: a relist is made as soon as one is
// told, and again shortly until the CRI plugin (which handles the same
// event asynchronously) reports the container exited. A runtime without
// that service (CRI-O) only has the periodic relist.

// containerd's topics of a task's (or an exec's) exit and of a container's
// removal. Between them they cover every change of a container that mqlet
// did not make itself, so while they are received the periodic relist is
// only a safety net and runs every EventedRelistPeriod (the kubelet's
// evented PLEG likewise relists every 5 minutes only).
const (
	taskExitTopic        = "/tasks/exit"
	containerDeleteTopic = "/containers/delete"
)

// Exit hint timings: a told exit is relisted after exitRelistEvery, then
// less and less often (a quarter of its age, at most exitRelistMaxGap)
// until the CRI reports it, for exitRelistFor at most: the periodic relist
// may be 10 s away, and a loaded node's CRI plugin can lag by seconds. Then
// the reconnect backoff of the event stream.
const (
	exitRelistEvery  = 30 * time.Millisecond
	exitRelistMaxGap = time.Second
	exitRelistFor    = 10 * time.Second
	exitStreamRetry  = time.Second
	exitStreamMaxGap = 30 * time.Second
)

// exitSubscriber is containerd's events service.
type exitSubscriber interface {
	Subscribe(ctx context.Context, in *eventsapi.SubscribeRequest, opts ...grpc.CallOption) (eventsapi.Events_SubscribeClient, error)
}

// exitStream says whether the runtime's events are being received, and
// tells the PLEG when that changes.
type exitStream struct {
	mu      sync.Mutex
	live    bool
	changed chan struct{} // closed at the next change
}

func newExitStream() *exitStream { return &exitStream{changed: make(chan struct{})} }

func (s *exitStream) set(live bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.live == live {
		return
	}
	s.live = live
	close(s.changed)
	s.changed = make(chan struct{})
}

// state is whether events are received now, and a channel closed when
// that changes.
func (s *exitStream) state() (bool, <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.live, s.changed
}

// relistPeriod is the PLEG's period: base, or evented (when longer) while
// the runtime's events are received.
func relistPeriod(base liveperiod.Source, evented time.Duration, stream *exitStream) liveperiod.Source {
	return liveperiod.Source{
		Period: func() time.Duration {
			if live, _ := stream.state(); live {
				return max(base.Period(), evented)
			}
			return base.Period()
		},
		Changes: base.Changes,
	}
}

// watchExits sends the id of each container (or sandbox) whose own process
// exits, or that is removed, to out, until ctx ends or the runtime turns out
// to have no events service; stream says when events are received. A hint
// is dropped when out is full: a relist is coming anyway.
func (m *Manager) watchExits(ctx context.Context, out chan<- containerChange, stream *exitStream) {
	if !m.conn.cfg.ExitEvents || !strings.HasPrefix(m.conn.cfg.Endpoint, "unix://") {
		return
	}
	cc, err := grpc.NewClient(m.conn.cfg.Endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		m.log.Debug().Err(err).Msg("no connection for task exit events; exits are seen at the relist")
		return
	}
	defer cc.Close()
	src := eventsapi.NewEventsClient(cc)
	wait := exitStreamRetry
	for {
		got, err := forwardExits(ctx, src, out, stream.set)
		if ctx.Err() != nil {
			return
		}
		if c := status.Code(err); c == codes.Unimplemented {
			m.log.Info().Msg("runtime publishes no task events; exits are seen at the relist")
			return
		}
		if got {
			wait = exitStreamRetry
		}
		m.log.Debug().Err(err).Dur("retryIn", wait).Msg("task exit event stream ended")
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		wait = min(2*wait, exitStreamMaxGap)
	}
}

// forwardExits subscribes to task exits and container removals and
// forwards them until the stream fails; got says at least one event came.
// live is told true once subscribed and false when the stream ends.
func forwardExits(ctx context.Context, src exitSubscriber, out chan<- containerChange, live func(bool)) (got bool, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := src.Subscribe(ctx, &eventsapi.SubscribeRequest{Filters: []string{
		`topic=="` + taskExitTopic + `"`, `topic=="` + containerDeleteTopic + `"`,
	}})
	if err != nil {
		return false, fmt.Errorf("subscribe to task exits: %w", err)
	}
	live(true)
	defer live(false)
	for {
		env, err := stream.Recv()
		if err != nil {
			return got, fmt.Errorf("receive a task exit: %w", err)
		}
		got = true
		change, ok := changedContainer(env)
		if !ok {
			continue
		}
		select {
		case out <- change:
		default:
		}
	}
}

// containerChange is what the runtime told of a container (or sandbox):
// its own process exited, or it was removed.
type containerChange struct {
	ID      string
	Removed bool
}

// changedContainer is the container whose own process a task exit event
// reports, or that a container delete event reports; an exec's exit (a
// probe, an exec command) is none.
func changedContainer(env *eventsapi.Envelope) (containerChange, bool) {
	if env.GetEvent() == nil {
		return containerChange{}, false
	}
	if env.GetTopic() == containerDeleteTopic {
		var ev containerdevents.ContainerDelete
		if err := proto.Unmarshal(env.GetEvent().GetValue(), &ev); err != nil || ev.ID == "" {
			return containerChange{}, false
		}
		return containerChange{ID: ev.ID, Removed: true}, true
	}
	if env.GetTopic() != taskExitTopic {
		return containerChange{}, false
	}
	var ev containerdevents.TaskExit
	if err := proto.Unmarshal(env.GetEvent().GetValue(), &ev); err != nil {
		return containerChange{}, false
	}
	if ev.ContainerID == "" || ev.ID != ev.ContainerID {
		return containerChange{}, false
	}
	return containerChange{ID: ev.ContainerID}, true
}

// toldExits are the changes told by the runtime that the relist has not
// seen yet, with when each was told.
type toldExits map[containerChange]time.Time

// settle forgets the changes the relist has seen (or that are not ours)
// and those told too long ago.
func (t toldExits) settle(seen func(containerChange) bool, now time.Time) {
	for c, at := range t {
		if seen(c) || now.Sub(at) > exitRelistFor {
			delete(t, c)
		}
	}
}

// retry fires when the exits still waiting should be relisted again; nil
// when none waits.
func (t toldExits) retry(now time.Time) <-chan time.Time {
	if len(t) == 0 {
		return nil
	}
	return time.After(t.retryDelay(now))
}

// retryDelay grows with the age of the newest change waiting: a quarter of
// it, from exitRelistEvery up to exitRelistMaxGap.
func (t toldExits) retryDelay(now time.Time) time.Duration {
	var newest time.Time
	for _, at := range t {
		if at.After(newest) {
			newest = at
		}
	}
	return min(max(now.Sub(newest)/4, exitRelistEvery), exitRelistMaxGap)
}
