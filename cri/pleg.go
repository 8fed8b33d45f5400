package cri

import (
	"context"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/mqlet/mqlet/internal/liveperiod"
)

// plegRecord is what a relist remembers about one container or sandbox.
type plegRecord struct {
	podUID string
	state  ContainerState
}

// RunPLEG reports pod lifecycle changes on out until ctx ends. It uses the
// runtime's container event stream when available and otherwise relists
// every period, comparing container and sandbox states.
func (m *Manager) RunPLEG(ctx context.Context, period liveperiod.Source, out chan<- PodLifecycleEvent) {
	// Pods that waited on an image pull are woken when it ends (ImagePulled).
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-ctx.Done():
				return
			case uid := <-m.puller.wake:
				if !send(ctx, out, PodLifecycleEvent{PodUID: uid, Type: ImagePulled}) {
					return
				}
			}
		}
	}()
	// The runtime's task exits make a relist at once (see exits.go).
	exits := make(chan containerChange, 64)
	stream := newExitStream()
	wg.Add(1)
	go func() {
		defer wg.Done()
		m.watchExits(ctx, exits, stream)
	}()
	relister := &relister{m: m, out: out}
	told := toldExits{}
	// The period is re-read at each wait: plegPeriod may change live, and
	// the event stream may come and go.
	timer := relistPeriod(period, m.conn.cfg.EventedRelistPeriod, stream).NewTimer()
	defer timer.Stop()
	evented := true
	for {
		if evented {
			if svc, err := m.conn.get(); err == nil {
				err := m.streamEvents(ctx, svc, out)
				if status.Code(err) == codes.Unimplemented {
					m.log.Info().Msg("runtime has no container events; PLEG relists every " + period.Period().String() + " and at each task exit it publishes")
					evented = false
				} else if ctx.Err() == nil {
					m.log.Debug().Err(err).Msg("container event stream ended; relisting")
				}
			}
		}
		// Read before the relist: a stream that comes up after it relists
		// again, so that an exit just before the subscription is not left
		// to the long period.
		_, streamChanged := stream.state()
		relister.relist(ctx)
		told.settle(relister.shows, time.Now())
		timer.Reset()
		if !waitRelist(ctx, timer, exits, told, streamChanged) {
			return
		}
	}
}

// waitRelist waits until the next relist is due: the period has passed,
// the runtime told of an exit, an exit told before is to be relisted
// again, or the runtime's event stream came or went. It returns false when
// ctx ends.
func waitRelist(ctx context.Context, timer *liveperiod.Timer, exits <-chan containerChange, told toldExits, streamChanged <-chan struct{}) bool {
	retry := told.retry(time.Now())
	for {
		select {
		case <-ctx.Done():
			return false
		case <-timer.C():
			return true
		case <-streamChanged:
			return true
		case <-timer.Changed():
			timer.Update()
		case <-retry:
			return true
		case c := <-exits:
			now := time.Now()
			told[c] = now
			// Exits told together make one relist (this loop is the only reader).
			for len(exits) > 0 {
				told[<-exits] = now
			}
			return true
		}
	}
}

// streamEvents forwards mqlet containers' events until the stream fails.
func (m *Manager) streamEvents(ctx context.Context, svc *services, out chan<- PodLifecycleEvent) error {
	return forwardEvents(quietContext(ctx), svc.runtime, out)
}

// eventSource is the runtime's container event stream (cri-client's
// GetContainerEvents, which sends on ch without a select).
type eventSource interface {
	GetContainerEvents(ctx context.Context, ch chan *runtimeapi.ContainerEventResponse, connected func(runtimeapi.RuntimeService_GetContainerEventsClient)) error
}

// forwardEvents turns src's events into lifecycle events on out until the
// stream fails or ctx ends. It returns only once src has: src blocks on ch
// until it is read, so ch is drained until then.
func forwardEvents(ctx context.Context, src eventSource, out chan<- PodLifecycleEvent) (err error) {
	ctx, cancel := context.WithCancel(ctx)
	events := make(chan *runtimeapi.ContainerEventResponse)
	done := make(chan error, 1)
	go func() { done <- src.GetContainerEvents(ctx, events, nil) }()
	ended := false
	defer func() {
		cancel()
		for !ended {
			select {
			case <-events:
			case <-done:
				ended = true
			}
		}
	}()
	for {
		select {
		case err := <-done:
			ended = true
			return err
		case ev := <-events:
			labels := ev.GetPodSandboxStatus().GetLabels()
			if labels[LabelManaged] != "true" {
				continue
			}
			var t PodLifecycleEventType
			switch ev.ContainerEventType {
			case runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT:
				t = ContainerStarted
			case runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT:
				t = ContainerDied
			case runtimeapi.ContainerEventType_CONTAINER_DELETED_EVENT:
				t = ContainerRemoved
			default:
				continue
			}
			if !send(ctx, out, PodLifecycleEvent{PodUID: labels[LabelPodUID], Type: t, ContainerID: ev.ContainerId}) {
				return ctx.Err()
			}
		}
	}
}

func send(ctx context.Context, out chan<- PodLifecycleEvent, ev PodLifecycleEvent) bool {
	select {
	case out <- ev:
		return true
	case <-ctx.Done():
		return false
	}
}

// relister compares successive listings.
type relister struct {
	m          *Manager
	out        chan<- PodLifecycleEvent
	containers map[string]plegRecord
	sandboxes  map[string]plegRecord
}

func (r *relister) relist(ctx context.Context) {
	svc, err := r.m.conn.get()
	if err != nil {
		return
	}
	qctx := quietContext(ctx)
	list, err := svc.runtime.ListContainers(qctx, &runtimeapi.ContainerFilter{LabelSelector: managedSelector()})
	if err != nil {
		r.m.log.Debug().Err(err).Msg("PLEG relist containers")
		return
	}
	sbs, err := svc.runtime.ListPodSandbox(qctx, &runtimeapi.PodSandboxFilter{LabelSelector: managedSelector()})
	if err != nil {
		r.m.log.Debug().Err(err).Msg("PLEG relist sandboxes")
		return
	}
	containers := make(map[string]plegRecord, len(list))
	for _, c := range list {
		containers[c.Id] = plegRecord{podUID: c.Labels[LabelPodUID], state: toContainerState(c.State)}
	}
	sandboxes := make(map[string]plegRecord, len(sbs))
	for _, sb := range sbs {
		st := ContainerExited
		if sb.State == runtimeapi.PodSandboxState_SANDBOX_READY {
			st = ContainerRunning
		}
		sandboxes[sb.Id] = plegRecord{podUID: sb.Labels[LabelPodUID], state: st}
	}
	for _, ev := range diffContainers(r.containers, containers) {
		if !send(ctx, r.out, ev) {
			return
		}
	}
	for _, ev := range diffSandboxes(r.sandboxes, sandboxes) {
		if !send(ctx, r.out, ev) {
			return
		}
	}
	r.containers, r.sandboxes = containers, sandboxes
}

// shows reports whether the last listing reflects a change the runtime
// told: the container (or sandbox) is not running after an exit, or not
// listed at all after a removal. A container the listing never had (not
// mqlet's) shows either.
func (r *relister) shows(c containerChange) bool {
	if c.Removed {
		_, container := r.containers[c.ID]
		_, sandbox := r.sandboxes[c.ID]
		return !container && !sandbox
	}
	return r.containers[c.ID].state != ContainerRunning && r.sandboxes[c.ID].state != ContainerRunning
}

// diffContainers turns two listings into lifecycle events, the kubelet way.
func diffContainers(old, cur map[string]plegRecord) []PodLifecycleEvent {
	var evs []PodLifecycleEvent
	for id, c := range cur {
		o, seen := old[id]
		if seen && o.state == c.state {
			continue
		}
		switch c.state {
		case ContainerRunning:
			evs = append(evs, PodLifecycleEvent{PodUID: c.podUID, Type: ContainerStarted, ContainerID: id})
		case ContainerExited:
			evs = append(evs, PodLifecycleEvent{PodUID: c.podUID, Type: ContainerDied, ContainerID: id})
		}
	}
	for id, o := range old {
		if _, ok := cur[id]; ok {
			continue
		}
		if o.state == ContainerRunning {
			evs = append(evs, PodLifecycleEvent{PodUID: o.podUID, Type: ContainerDied, ContainerID: id})
		}
		evs = append(evs, PodLifecycleEvent{PodUID: o.podUID, Type: ContainerRemoved, ContainerID: id})
	}
	return evs
}

func diffSandboxes(old, cur map[string]plegRecord) []PodLifecycleEvent {
	var evs []PodLifecycleEvent
	for id, s := range cur {
		if o, seen := old[id]; !seen || o.state != s.state {
			evs = append(evs, PodLifecycleEvent{PodUID: s.podUID, Type: SandboxChanged, ContainerID: id})
		}
	}
	for id, o := range old {
		if _, ok := cur[id]; !ok {
			evs = append(evs, PodLifecycleEvent{PodUID: o.podUID, Type: SandboxChanged, ContainerID: id})
		}
	}
	return evs
}
