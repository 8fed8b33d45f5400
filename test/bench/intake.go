package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
)

type intakeVariant struct {
	Commands          int       `json:"commands"`
	WallMs            float64   `json:"wallMs"`
	CommandsPerSecond float64   `json:"commandsPerSecond"`
	Latency           latencies `json:"publishToSucceeded"`
}

type intakeResult struct {
	Pipelined  intakeVariant `json:"pipelined"`
	Sequential intakeVariant `json:"sequential"`
	// The same through a mosquitto with set_tcp_nodelay true (its default is
	// false: Nagle plus delayed ACK then holds small replies about 40 ms).
	NoDelay *intakePair `json:"brokerTcpNoDelay,omitempty"`
}

type intakePair struct {
	Pipelined  intakeVariant `json:"pipelined"`
	Sequential intakeVariant `json:"sequential"`
}

// intakeTarget is the broker connection and node the commands go to.
type intakeTarget struct {
	rec *recorder
	t   topics
}

// intakeTimeout bounds one variant; at even 10 commands/s 500 fit.
const intakeTimeout = 3 * time.Minute

func (e *env) configMap(variant string, i int) []byte {
	return fmt.Appendf(nil, `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"bench-%s-%d","namespace":%q},"data":{"key":"value %d of %s"}}`,
		variant, i, e.ns, i, e.run)
}

// intake measures ConfigMap applies (no containers) end to end: publish at
// QoS 1 until the succeeded reply arrives.
func (e *env) intake(ctx context.Context) (*intakeResult, error) {
	if err := e.checkAgent(); err != nil {
		return nil, err
	}
	pair, err := e.intakePair(ctx, intakeTarget{rec: e.mq, t: e.t}, "")
	if err != nil {
		return nil, err
	}
	res := &intakeResult{Pipelined: pair.Pipelined, Sequential: pair.Sequential}
	if e.opts.brokerNoDelay || !e.opts.intakeNoDelay {
		return res, nil
	}
	if res.NoDelay, err = e.intakeOnNoDelayBroker(ctx); err != nil {
		return res, fmt.Errorf("with set_tcp_nodelay: %w", err)
	}
	return res, nil
}

func (e *env) intakePair(ctx context.Context, to intakeTarget, label string) (*intakePair, error) {
	var res intakePair
	var err error
	if res.Pipelined, err = e.intakePipelined(ctx, to, e.opts.intakeN); err != nil {
		return nil, fmt.Errorf("pipelined%s: %w", label, err)
	}
	e.log.Info().Float64("perSecond", res.Pipelined.CommandsPerSecond).Msg("intake: pipelined done" + label)
	if res.Sequential, err = e.intakeSequential(ctx, to, e.opts.intakeN); err != nil {
		return nil, fmt.Errorf("sequential%s: %w", label, err)
	}
	e.log.Info().Float64("perSecond", res.Sequential.CommandsPerSecond).Msg("intake: sequential done" + label)
	return &res, nil
}

// intakeOnNoDelayBroker repeats the intake through a second mosquitto that
// disables Nagle, with a second mqlet of its own, both stopped afterwards.
func (e *env) intakeOnNoDelayBroker(ctx context.Context) (res *intakePair, err error) {
	dir := filepath.Join(e.workDir, "nodelay")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("make %s: %w", dir, err)
	}
	broker, err := startMosquitto(ctx, e.opts.mosquitto, dir, true)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, broker.stop(5*time.Second)) }()
	node := "bench-nd-" + e.run
	to := intakeTarget{t: topics{prefix: topicPrefix, node: node}}
	if to.rec, err = connect(ctx, broker.url, "bench-nodelay-"+e.run); err != nil {
		return nil, err
	}
	defer to.rec.close()
	if err := to.rec.subscribe(ctx, to.t.all()); err != nil {
		return nil, err
	}
	from := to.rec.mark()
	agent, _, err := e.startMqletOn(broker.url, node, filepath.Join(dir, "state"))
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, agent.stop(stopTimeout)) }()
	if _, err := e.waitOnline(ctx, to.rec, node, from, agent); err != nil {
		return nil, err
	}
	return e.intakePair(ctx, to, " (broker tcp nodelay)")
}

// intakePipelined publishes every command without waiting, then waits for all replies.
func (e *env) intakePipelined(ctx context.Context, to intakeTarget, n int) (intakeVariant, error) {
	ctx, cancel := context.WithTimeout(ctx, intakeTimeout)
	defer cancel()
	from := to.rec.mark()
	ids := make([]string, n)
	sent := make(map[string]time.Time, n)
	tokens := make([]paho.Token, n)
	for i := range n {
		ids[i] = e.nextID("cm")
		sent[ids[i]] = time.Now()
		tokens[i] = to.rec.publishAsync(to.t.cmd("apply", ids[i]), e.configMap("p", i))
	}
	for i, tok := range tokens {
		if err := waitToken(ctx, tok); err != nil {
			return intakeVariant{}, fmt.Errorf("publish command %d: %w", i, err)
		}
	}
	done, err := to.rec.finalReplies(ctx, to.t, from, ids)
	if err != nil {
		return intakeVariant{}, err
	}
	return variantOf(ids, sent, done), nil
}

// intakeSequential publishes one command and waits for its reply before the next.
func (e *env) intakeSequential(ctx context.Context, to intakeTarget, n int) (intakeVariant, error) {
	ctx, cancel := context.WithTimeout(ctx, intakeTimeout)
	defer cancel()
	ids := make([]string, n)
	sent := make(map[string]time.Time, n)
	done := make(map[string]time.Time, n)
	for i := range n {
		ids[i] = e.nextID("cm")
		from := to.rec.mark()
		sent[ids[i]] = time.Now()
		if err := to.rec.publish(ctx, to.t.cmd("apply", ids[i]), e.configMap("s", i)); err != nil {
			return intakeVariant{}, err
		}
		got, err := to.rec.finalReplies(ctx, to.t, from, ids[i:i+1])
		if err != nil {
			return intakeVariant{}, fmt.Errorf("command %d: %w", i, err)
		}
		done[ids[i]] = got[ids[i]]
	}
	return variantOf(ids, sent, done), nil
}

func variantOf(ids []string, sent, done map[string]time.Time) intakeVariant {
	var first, last time.Time
	lat := make([]time.Duration, 0, len(ids))
	for _, id := range ids {
		s, d := sent[id], done[id]
		if first.IsZero() || s.Before(first) {
			first = s
		}
		if d.After(last) {
			last = d
		}
		lat = append(lat, d.Sub(s))
	}
	wall := last.Sub(first)
	return intakeVariant{
		Commands:          len(ids),
		WallMs:            ms(wall),
		CommandsPerSecond: float64(len(ids)) / wall.Seconds(),
		Latency:           summarise(lat),
	}
}
