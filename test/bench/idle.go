package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
)

type idleResult struct {
	Pods            int            `json:"pods"`
	Probed          bool           `json:"probed,omitempty"` // exec liveness + httpGet readiness every 10 s
	WindowSeconds   float64        `json:"windowSeconds"`
	RSSStartBytes   int64          `json:"rssStartBytes"`
	RSSEndBytes     int64          `json:"rssEndBytes"`
	RSSMaxBytes     int64          `json:"rssMaxBytes"`
	CPUPercentCore  float64        `json:"cpuPercentOfOneCore"`
	Messages        int            `json:"messages"`
	PayloadBytes    int64          `json:"payloadBytes"`
	WireBytes       int64          `json:"topicPlusPayloadBytes"`
	MessagesPerMin  float64        `json:"messagesPerMinute"`
	BytesPerMin     float64        `json:"payloadBytesPerMinute"`
	WireBytesPerMin float64        `json:"topicPlusPayloadBytesPerMinute"`
	ByKind          map[string]int `json:"messagesByKind"`
}

// idleSettle lets the tail of the burst's status updates pass before the window opens.
const idleSettle = 5 * time.Second

// idle watches mqlet with pods running and nothing to do for the window:
// memory, CPU, and what it publishes (messages live during the window, not
// retained ones delivered at subscribe).
func (e *env) idle(ctx context.Context, names []string) (*idleResult, error) {
	pods := len(names)
	if err := e.checkAgent(); err != nil {
		return nil, err
	}
	if e.opts.probePods {
		// A probed pod turns Ready at its first readiness check, up to a
		// period after it starts: that sync and status belong to the start,
		// not to the steady cost the window measures.
		if err := e.waitReady(ctx, names); err != nil {
			return nil, err
		}
	}
	if err := waitOrDone(ctx, e.agent, idleSettle); err != nil {
		return nil, err
	}
	rec, err := connect(ctx, e.broker.url, "bench-idle-"+e.run)
	if err != nil {
		return nil, err
	}
	defer rec.close()
	if err := rec.subscribe(ctx, e.t.all()); err != nil {
		return nil, err
	}
	pid := e.agent.pid()
	hz := clockTicks()
	res := &idleResult{Pods: pods, Probed: e.opts.probePods, ByKind: map[string]int{}}
	if res.RSSStartBytes, err = procRSS(pid); err != nil {
		return nil, err
	}
	res.RSSMaxBytes = res.RSSStartBytes
	ticksStart, err := procCPUTicks(pid)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	from := rec.mark() // retained messages delivered at subscribe are before this
	end := time.NewTimer(e.opts.duration)
	defer end.Stop()
	sample := time.NewTicker(time.Second)
	defer sample.Stop()
	for waiting := true; waiting; {
		select {
		case <-end.C:
			waiting = false
		case <-sample.C:
			rss, err := procRSS(pid)
			if err != nil {
				return nil, fmt.Errorf("mqlet during the idle window: %w", err)
			}
			res.RSSMaxBytes = max(res.RSSMaxBytes, rss)
		case <-e.agent.exited:
			return nil, fmt.Errorf("mqlet exited during the idle window")
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		}
	}
	ticksEnd, err := procCPUTicks(pid)
	if err != nil {
		return nil, err
	}
	wall := time.Since(start)
	msgs := rec.since(from)
	if res.RSSEndBytes, err = procRSS(pid); err != nil {
		return nil, err
	}
	res.RSSMaxBytes = max(res.RSSMaxBytes, res.RSSEndBytes)
	res.WindowSeconds = wall.Seconds()
	res.CPUPercentCore = 100 * float64(ticksEnd-ticksStart) / float64(hz) / wall.Seconds()
	for _, m := range msgs {
		if m.Retained {
			continue
		}
		res.Messages++
		res.PayloadBytes += int64(len(m.Payload))
		res.WireBytes += int64(len(m.Payload) + len(m.Topic))
		res.ByKind[kindOf(e.t, m.Topic)]++
	}
	perMin := 60 / wall.Seconds()
	res.MessagesPerMin = float64(res.Messages) * perMin
	res.BytesPerMin = float64(res.PayloadBytes) * perMin
	res.WireBytesPerMin = float64(res.WireBytes) * perMin
	return res, nil
}

// kindOf names the telemetry kind of a topic: state, node, pods, events, metrics, reply.
func kindOf(t topics, topic string) string {
	rest := strings.TrimPrefix(topic, t.prefix+"/"+t.node+"/")
	kind, _, _ := strings.Cut(rest, "/")
	return kind
}

// waitOrDone waits d unless mqlet exits or ctx ends first.
func waitOrDone(ctx context.Context, p *process, d time.Duration) error {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-p.exited:
		return fmt.Errorf("mqlet exited")
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// waitReady waits until the last published status of each named pod has
// the Ready condition True.
func (e *env) waitReady(ctx context.Context, names []string) error {
	ctx, cancel := context.WithTimeout(ctx, podTimeout)
	defer cancel()
	notReady := make(map[string]bool, len(names)) // topic → not Ready yet
	for _, n := range names {
		notReady[e.t.pod(e.ns, n)] = true
	}
	ready := 0
	err := e.mq.scan(ctx, 0, fmt.Sprintf("%d pods Ready", len(names)), func(m msg) (bool, error) {
		wasNotReady, ok := notReady[m.Topic]
		if !ok || len(m.Payload) == 0 {
			return false, nil
		}
		var p v1.Pod
		if err := json.Unmarshal(m.Payload, &p); err != nil {
			return false, fmt.Errorf("status on %s is not a v1.Pod: %w", m.Topic, err)
		}
		isReady := podReady(&p)
		switch {
		case isReady && wasNotReady:
			ready++
		case !isReady && !wasNotReady:
			ready--
		}
		notReady[m.Topic] = !isReady
		return ready == len(names), nil
	})
	if err != nil {
		return fmt.Errorf("%w (%d of %d pods Ready)", err, ready, len(names))
	}
	return nil
}

func podReady(p *v1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == v1.PodReady {
			return c.Status == v1.ConditionTrue
		}
	}
	return false
}
