package cri

import (
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// floodSource sends events the way cri-client does: without a select, so
// it blocks until each one is read, and ends only when it sees ctx ended.
type floodSource struct{ uid string }

func (f floodSource) GetContainerEvents(ctx context.Context, ch chan *runtimeapi.ContainerEventResponse, _ func(runtimeapi.RuntimeService_GetContainerEventsClient)) error {
	for ctx.Err() == nil {
		ch <- &runtimeapi.ContainerEventResponse{
			ContainerId:        "c1",
			ContainerEventType: runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT,
			PodSandboxStatus:   &runtimeapi.PodSandboxStatus{Labels: map[string]string{LabelManaged: "true", LabelPodUID: f.uid}},
		}
	}
	return ctx.Err()
}

func TestEventStreamForwardsAndLeavesNoGoroutine(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	ctx, cancel := context.WithCancel(context.Background())
	out := make(chan PodLifecycleEvent) // read once, then never again
	ended := make(chan error, 1)
	go func() { ended <- forwardEvents(ctx, floodSource{uid: "u1"}, out) }()
	select {
	case ev := <-out:
		if ev.PodUID != "u1" || ev.Type != ContainerDied || ev.ContainerID != "c1" {
			t.Fatalf("event %+v", ev)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no event forwarded")
	}
	// The source is now blocked sending; ending ctx must still end it.
	cancel()
	select {
	case <-ended:
	case <-time.After(5 * time.Second):
		t.Fatal("forwardEvents did not return after its context ended")
	}
}
