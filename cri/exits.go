package cri

import (
	"context"
	"fmt"
	"strings"
	"time"

	containerdevents "github.com/containerd/containerd/api/events"
	eventsapi "github.com/containerd/containerd/api/services/events/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// Exit hints. containerd 1.6 has no CRI container events, so the PLEG
// relists; a container's exit would wait for the next relist (half the
// period on average). containerd publishes every task exit on its own
// events service, on the same socket: a relist is made as soon as one is
// told, and again shortly until the CRI plugin (which handles the same
// event asynchronously) reports the container exited. A runtime without
// that service (CRI-O) only has the periodic relist.

// taskExitTopic is containerd's topic of a task's (or an exec's) exit.
const taskExitTopic = "/tasks/exit"

// Exit hint timings: how often a told exit is relisted until the CRI
// reports it, and for how long at most; the reconnect backoff of the
// event stream.
const (
	exitRelistEvery  = 30 * time.Millisecond
	exitRelistFor    = 2 * time.Second
	exitStreamRetry  = time.Second
	exitStreamMaxGap = 30 * time.Second
)

// exitSubscriber is containerd's events service.
type exitSubscriber interface {
	Subscribe(ctx context.Context, in *eventsapi.SubscribeRequest, opts ...grpc.CallOption) (eventsapi.Events_SubscribeClient, error)
}

// watchExits sends the id of each container (or sandbox) whose own process
// exits to out, until ctx ends or the runtime turns out to have no events
// service. A hint is dropped when out is full: a relist is coming anyway.
func (m *Manager) watchExits(ctx context.Context, out chan<- string) {
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
		got, err := forwardExits(ctx, src, out)
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

// forwardExits subscribes to task exits and forwards them until the stream
// fails; got says at least one event came.
func forwardExits(ctx context.Context, src exitSubscriber, out chan<- string) (got bool, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := src.Subscribe(ctx, &eventsapi.SubscribeRequest{Filters: []string{`topic=="` + taskExitTopic + `"`}})
	if err != nil {
		return false, fmt.Errorf("subscribe to task exits: %w", err)
	}
	for {
		env, err := stream.Recv()
		if err != nil {
			return got, fmt.Errorf("receive a task exit: %w", err)
		}
		got = true
		id, ok := exitedContainer(env)
		if !ok {
			continue
		}
		select {
		case out <- id:
		default:
		}
	}
}

// exitedContainer is the container whose own process a task exit event
// reports; an exec's exit (a probe, an exec command) is none.
func exitedContainer(env *eventsapi.Envelope) (string, bool) {
	if env.GetTopic() != taskExitTopic || env.GetEvent() == nil {
		return "", false
	}
	var ev containerdevents.TaskExit
	if err := proto.Unmarshal(env.GetEvent().GetValue(), &ev); err != nil {
		return "", false
	}
	if ev.ContainerID == "" || ev.ID != ev.ContainerID {
		return "", false
	}
	return ev.ContainerID, true
}

// toldExits are the exits told by the runtime that the relist has not seen
// yet, with when each was told.
type toldExits map[string]time.Time

// settle forgets the exits the relist has seen (or that are not ours) and
// those told too long ago.
func (t toldExits) settle(stillRunning func(id string) bool, now time.Time) {
	for id, at := range t {
		if !stillRunning(id) || now.Sub(at) > exitRelistFor {
			delete(t, id)
		}
	}
}

// retry fires when the exits still waiting should be relisted again; nil
// when none waits.
func (t toldExits) retry() <-chan time.Time {
	if len(t) == 0 {
		return nil
	}
	return time.After(exitRelistEvery)
}
