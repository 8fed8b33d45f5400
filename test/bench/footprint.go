package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"
)

type footprintResult struct {
	BinaryBytes         int64     `json:"binaryBytes"`
	StrippedBinaryBytes int64     `json:"strippedBinaryBytes"`
	IdleRSSBytes        int64     `json:"idleRssBytes"`
	IdleRSSAfter        string    `json:"idleRssAfter"`
	Starts              int       `json:"starts"`
	StartToOnline       latencies `json:"startToOnline"`
	StartToOnlineMs     []float64 `json:"startToOnlineSamplesMs"`
}

// footprint measures the binary, an idle agent's memory and how long a
// start takes until the retained online state reaches a subscriber. It uses
// its own node (and state dir, kept across its starts like a real restart).
func (e *env) footprint(ctx context.Context) (*footprintResult, error) {
	res := &footprintResult{Starts: e.opts.starts, IdleRSSAfter: idleRSSAfter.String()}
	var err error
	if res.BinaryBytes, res.StrippedBinaryBytes, err = binarySizes(ctx, e.opts.mqlet, e.workDir); err != nil {
		return nil, err
	}
	node := "bench-fp-" + e.run
	stateDir := filepath.Join(e.workDir, "state-footprint")
	rec, err := connect(ctx, e.broker.url, "bench-footprint-"+e.run)
	if err != nil {
		return nil, err
	}
	defer rec.close()
	if err := rec.subscribe(ctx, topics{prefix: topicPrefix, node: node}.state()); err != nil {
		return nil, err
	}
	var samples []time.Duration
	for i := range e.opts.starts {
		from := rec.mark()
		p, started, err := e.startMqlet(node, stateDir)
		if err != nil {
			return nil, err
		}
		online, err := e.waitOnline(ctx, rec, node, from, p)
		if err == nil && i == 0 {
			res.IdleRSSBytes, err = rssAfter(ctx, p, idleRSSAfter)
		}
		stopErr := p.stop(stopTimeout)
		if err != nil {
			return nil, fmt.Errorf("start %d: %w", i+1, err)
		}
		if stopErr != nil {
			return nil, fmt.Errorf("start %d: %w", i+1, stopErr)
		}
		samples = append(samples, online.Sub(started))
		res.StartToOnlineMs = append(res.StartToOnlineMs, ms(online.Sub(started)))
		e.log.Info().Int("start", i+1).Dur("toOnline", online.Sub(started)).Msg("footprint: mqlet online")
	}
	res.StartToOnline = summarise(samples)
	return res, nil
}

// idleRSSAfter is how long an agent with no pods idles before its RSS is read.
const idleRSSAfter = 5 * time.Second

func rssAfter(ctx context.Context, p *process, wait time.Duration) (int64, error) {
	timer := time.NewTimer(wait)
	defer timer.Stop()
	select {
	case <-timer.C:
	case <-p.exited:
		return 0, fmt.Errorf("mqlet exited while idle")
	case <-ctx.Done():
		return 0, context.Cause(ctx)
	}
	return procRSS(p.pid())
}

// binarySizes returns the size of bin and of a stripped copy of it.
func binarySizes(ctx context.Context, bin, dir string) (int64, int64, error) {
	st, err := os.Stat(bin)
	if err != nil {
		return 0, 0, fmt.Errorf("mqlet binary: %w", err)
	}
	data, err := os.ReadFile(bin)
	if err != nil {
		return 0, 0, fmt.Errorf("read mqlet binary: %w", err)
	}
	stripped := filepath.Join(dir, "mqlet.stripped")
	if err := os.WriteFile(stripped, data, 0o755); err != nil {
		return 0, 0, fmt.Errorf("copy mqlet binary: %w", err)
	}
	defer os.Remove(stripped)
	if out, err := exec.CommandContext(ctx, "strip", stripped).CombinedOutput(); err != nil {
		return 0, 0, fmt.Errorf("strip a copy of mqlet: %w: %s", err, out)
	}
	sst, err := os.Stat(stripped)
	if err != nil {
		return 0, 0, fmt.Errorf("stat stripped mqlet: %w", err)
	}
	return st.Size(), sst.Size(), nil
}
