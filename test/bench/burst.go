package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
)

// burstVariant is one burst of applies published as fast as the client can:
// how long until each was answered accepted (or refused as overloaded).
type burstVariant struct {
	Commands   int       `json:"commands"`
	PublishMs  float64   `json:"publishMs"` // first publish to last PUBACK
	Accepted   int       `json:"accepted"`
	Overloaded int       `json:"overloaded"`
	Within5s   int       `json:"acceptedWithin5s"`
	Latency    latencies `json:"publishToAccepted"`
	AnswerAll  latencies `json:"publishToFirstAnswer"` // accepted or overloaded
	// AgentCPUMs is the CPU time (user + system) mqlet spent from the first
	// publish to the last answer: what the collector's setting (GOGC) costs.
	AgentCPUMs float64 `json:"agentCpuMs"`
}

type burstResult struct {
	ConfigMaps burstVariant `json:"configMaps"`
	Pods       burstVariant `json:"pods"`
}

// burstPodNames is how many distinct pods the pod burst cycles over: the
// burst measures intake, not 2,000 sandboxes.
const burstPodNames = 10

// burst publishes --burst-commands ConfigMap applies, then as many pod
// applies (cycling over a few pods, each apply changing an annotation), and
// measures publish → accepted for each.
func (e *env) burst(ctx context.Context) (*burstResult, error) {
	if err := e.checkAgent(); err != nil {
		return nil, err
	}
	var res burstResult
	var err error
	n := e.opts.burstCommands
	if res.ConfigMaps, err = e.burstOf(ctx, n, func(i int) []byte { return e.configMap("burst", i) }); err != nil {
		return &res, fmt.Errorf("configmaps: %w", err)
	}
	e.log.Info().Float64("p50ms", res.ConfigMaps.Latency.P50Ms).Msg("burst: configmaps done")
	names := make([]string, burstPodNames)
	for i := range names {
		names[i] = fmt.Sprintf("burst-%d", i)
	}
	defer func() {
		if derr := e.deletePods(ctx, names); derr != nil {
			e.log.Error().Err(derr).Msg("deleting the burst pods")
		}
	}()
	pod := func(i int) []byte {
		p := e.podJSON(names[i%len(names)], "Always", "sleep 3600")
		// An annotation that changes with every apply: each is a real update.
		return []byte(strings.Replace(p, `"metadata":{`, fmt.Sprintf(`"metadata":{"annotations":{"bench/seq":"%d"},`, i), 1))
	}
	if res.Pods, err = e.burstOf(ctx, n, pod); err != nil {
		return &res, fmt.Errorf("pods: %w", err)
	}
	e.log.Info().Float64("p50ms", res.Pods.Latency.P50Ms).Msg("burst: pods done")
	return &res, nil
}

func (e *env) burstOf(ctx context.Context, n int, payload func(i int) []byte) (burstVariant, error) {
	ctx, cancel := context.WithTimeout(ctx, intakeTimeout)
	defer cancel()
	from := e.mq.mark()
	ids := make([]string, n)
	want := make(map[string]int, n)
	sent := make([]time.Time, n)
	tokens := make([]paho.Token, n)
	for i := range n {
		ids[i] = e.nextID("burst")
		want[ids[i]] = i
	}
	pid := e.agent.pid()
	ticksStart, err := procCPUTicks(pid)
	if err != nil {
		return burstVariant{}, fmt.Errorf("mqlet's CPU time: %w", err)
	}
	start := time.Now()
	for i := range n {
		sent[i] = time.Now()
		tokens[i] = e.mq.publishAsync(e.t.cmd("apply", ids[i]), payload(i))
	}
	for i, tok := range tokens {
		if err := waitToken(ctx, tok); err != nil {
			return burstVariant{}, fmt.Errorf("publish command %d: %w", i, err)
		}
	}
	v := burstVariant{Commands: n, PublishMs: ms(time.Since(start))}
	answered := make(map[string]bool, n)
	var accepted, first []time.Duration
	err = e.mq.scan(ctx, from, fmt.Sprintf("%d accepted or overloaded replies", n), func(m msg) (bool, error) {
		rep, ok := e.t.parseReply(m)
		if !ok {
			return false, nil
		}
		i, mine := want[rep.RequestID]
		if !mine || answered[rep.RequestID] {
			return false, nil
		}
		d := m.At.Sub(sent[i])
		switch {
		case rep.Phase == "accepted":
			v.Accepted++
			accepted = append(accepted, d)
			if d <= 5*time.Second {
				v.Within5s++
			}
		case rep.Phase == "failed" && strings.HasPrefix(rep.Message, "overloaded"):
			v.Overloaded++
		default:
			return false, fmt.Errorf("request %s answered %s first: %s %v", rep.RequestID, rep.Phase, rep.Message, rep.Errors)
		}
		answered[rep.RequestID] = true
		first = append(first, d)
		return len(answered) == n, nil
	})
	v.Latency, v.AnswerAll = summarise(accepted), summarise(first)
	if ticksEnd, terr := procCPUTicks(pid); terr == nil {
		v.AgentCPUMs = float64(ticksEnd-ticksStart) * 1000 / float64(clockTicks())
	}
	if err != nil {
		return v, fmt.Errorf("%w (%d of %d answered)", err, len(answered), n)
	}
	return v, nil
}
