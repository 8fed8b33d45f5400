package main

import (
	"context"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"
)

type footprintResult struct {
	// The binary measured (bin/mqlet as make build ships it) and whether it
	// still holds a symbol table.
	BinaryBytes       int64     `json:"binaryBytes"`
	BinaryHasSymbols  bool      `json:"binaryHasSymbols"`
	UnstrippedBytes   int64     `json:"unstrippedBinaryBytes"`
	StrippedBytes     int64     `json:"strippedBinaryBytes"`
	UnstrippedFromArg bool      `json:"unstrippedFromSeparateBuild"`
	IdleRSSBytes      int64     `json:"idleRssBytes"`
	IdleRSSAfter      string    `json:"idleRssAfter"`
	Starts            int       `json:"starts"`
	StartToOnline     latencies `json:"startToOnline"`
	StartToOnlineMs   []float64 `json:"startToOnlineSamplesMs"`
}

// footprint measures the binary, an idle agent's memory and how long a
// start takes until the retained online state reaches a subscriber. It uses
// its own node (and state dir, kept across its starts like a real restart).
func (e *env) footprint(ctx context.Context) (*footprintResult, error) {
	res := &footprintResult{Starts: e.opts.starts, IdleRSSAfter: idleRSSAfter.String()}
	if err := e.binarySizes(ctx, res); err != nil {
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
	if err := waitOrDone(ctx, p, wait); err != nil {
		return 0, fmt.Errorf("mqlet idling: %w", err)
	}
	return procRSS(p.pid())
}

// binarySizes fills in the size of the measured binary, of an unstripped
// build (the binary itself when it has symbols, else --unstripped) and of
// that build stripped.
func (e *env) binarySizes(ctx context.Context, res *footprintResult) error {
	var err error
	if res.BinaryBytes, res.BinaryHasSymbols, err = elfSize(e.opts.mqlet); err != nil {
		return err
	}
	unstripped := e.opts.mqlet
	if !res.BinaryHasSymbols {
		if e.opts.unstripped == "" {
			return fmt.Errorf("%s is already stripped: pass --unstripped with a build without -s -w", e.opts.mqlet)
		}
		unstripped, res.UnstrippedFromArg = e.opts.unstripped, true
		var symbols bool
		if res.UnstrippedBytes, symbols, err = elfSize(unstripped); err != nil {
			return err
		}
		if !symbols {
			return fmt.Errorf("--unstripped %s has no symbol table", unstripped)
		}
	} else {
		res.UnstrippedBytes = res.BinaryBytes
	}
	data, err := os.ReadFile(unstripped)
	if err != nil {
		return fmt.Errorf("read %s: %w", unstripped, err)
	}
	stripped := filepath.Join(e.workDir, "mqlet.stripped")
	if err := os.WriteFile(stripped, data, 0o755); err != nil {
		return fmt.Errorf("copy mqlet binary: %w", err)
	}
	defer os.Remove(stripped)
	if out, err := exec.CommandContext(ctx, "strip", stripped).CombinedOutput(); err != nil {
		return fmt.Errorf("strip a copy of %s: %w: %s", unstripped, err, out)
	}
	res.StrippedBytes, _, err = elfSize(stripped)
	return err
}

// elfSize returns the file size of an ELF binary and whether it has a symbol table.
func elfSize(path string) (int64, bool, error) {
	st, err := os.Stat(path)
	if err != nil {
		return 0, false, fmt.Errorf("mqlet binary: %w", err)
	}
	f, err := elf.Open(path)
	if err != nil {
		return 0, false, fmt.Errorf("read ELF %s: %w", path, err)
	}
	defer f.Close()
	return st.Size(), f.Section(".symtab") != nil, nil
}
