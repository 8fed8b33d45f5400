package main

import (
	"context"
	"fmt"
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
	var res intakeResult
	var err error
	if res.Pipelined, err = e.intakePipelined(ctx, e.opts.intakeN); err != nil {
		return nil, fmt.Errorf("pipelined: %w", err)
	}
	e.log.Info().Float64("perSecond", res.Pipelined.CommandsPerSecond).Msg("intake: pipelined done")
	if res.Sequential, err = e.intakeSequential(ctx, e.opts.intakeN); err != nil {
		return nil, fmt.Errorf("sequential: %w", err)
	}
	e.log.Info().Float64("perSecond", res.Sequential.CommandsPerSecond).Msg("intake: sequential done")
	return &res, nil
}

// intakePipelined publishes every command without waiting, then waits for all replies.
func (e *env) intakePipelined(ctx context.Context, n int) (intakeVariant, error) {
	ctx, cancel := context.WithTimeout(ctx, intakeTimeout)
	defer cancel()
	from := e.mq.mark()
	ids := make([]string, n)
	sent := make(map[string]time.Time, n)
	tokens := make([]paho.Token, n)
	for i := range n {
		ids[i] = e.nextID("cm")
		sent[ids[i]] = time.Now()
		tokens[i] = e.mq.publishAsync(e.t.cmd("apply", ids[i]), e.configMap("p", i))
	}
	for i, tok := range tokens {
		if err := waitToken(ctx, tok); err != nil {
			return intakeVariant{}, fmt.Errorf("publish command %d: %w", i, err)
		}
	}
	done, err := e.mq.finalReplies(ctx, e.t, from, ids)
	if err != nil {
		return intakeVariant{}, err
	}
	return variantOf(ids, sent, done), nil
}

// intakeSequential publishes one command and waits for its reply before the next.
func (e *env) intakeSequential(ctx context.Context, n int) (intakeVariant, error) {
	ctx, cancel := context.WithTimeout(ctx, intakeTimeout)
	defer cancel()
	ids := make([]string, n)
	sent := make(map[string]time.Time, n)
	done := make(map[string]time.Time, n)
	for i := range n {
		ids[i] = e.nextID("cm")
		from := e.mq.mark()
		sent[ids[i]] = time.Now()
		if err := e.mq.publish(ctx, e.t.cmd("apply", ids[i]), e.configMap("s", i)); err != nil {
			return intakeVariant{}, err
		}
		got, err := e.mq.finalReplies(ctx, e.t, from, ids[i:i+1])
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
