package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// rssResult is mqlet's memory at rest with 0, 20 and 50 pods (--rss-pods).
type rssResult struct {
	SettleSeconds float64     `json:"settleSeconds"`
	Samples       []rssSample `json:"samples"`
}

type rssSample struct {
	Pods      int   `json:"pods"`
	RSSBytes  int64 `json:"rssBytes"`
	AnonBytes int64 `json:"rssAnonBytes"` // heap, stacks, the runtime's own
	FileBytes int64 `json:"rssFileBytes"` // the binary's pages
}

// rssSettle is how long mqlet rests before each reading, past the tail
// of the pods' first statuses.
const rssSettle = 10 * time.Second

// rssByPods reads the agent's RSS with no pods, then with each count of
// sleeping pods running (added in one List each), and deletes them.
func (e *env) rssByPods(ctx context.Context) (*rssResult, error) {
	res := &rssResult{SettleSeconds: rssSettle.Seconds()}
	var names []string
	defer func() {
		if len(names) > 0 {
			if err := e.deletePods(ctx, names); err != nil {
				e.log.Error().Err(err).Msg("rss: deleting the pods")
			}
		}
	}()
	for _, want := range e.opts.rssPods {
		if want > len(names) {
			var add, items []string
			for i := len(names); i < want; i++ {
				n := fmt.Sprintf("rss-%d", i)
				add = append(add, n)
				items = append(items, e.podJSON(n, "Always", sleeper))
			}
			_, err := e.applyPods(ctx, listOf(items), add, "Running", true)
			names = append(names, add...)
			if err != nil {
				return res, fmt.Errorf("rss: starting %d pods: %w", want, err)
			}
		}
		if err := waitOrDone(ctx, e.agent, rssSettle); err != nil {
			return res, err
		}
		s, err := procMemory(e.agent.pid())
		if err != nil {
			return res, err
		}
		s.Pods = len(names)
		res.Samples = append(res.Samples, s)
		e.log.Info().Int("pods", s.Pods).Str("rss", mib(s.RSSBytes)).Msg("rss: at rest")
	}
	return res, nil
}

// procMemory reads VmRSS, RssAnon and RssFile of pid.
func procMemory(pid int) (rssSample, error) {
	var s rssSample
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return s, fmt.Errorf("read status of pid %d: %w", pid, err)
	}
	found := 0
	for _, line := range strings.Split(string(data), "\n") {
		key, rest, ok := strings.Cut(line, ":")
		var dst *int64
		switch key {
		case "VmRSS":
			dst = &s.RSSBytes
		case "RssAnon":
			dst = &s.AnonBytes
		case "RssFile":
			dst = &s.FileBytes
		}
		if !ok || dst == nil {
			continue
		}
		fields := strings.Fields(rest)
		if len(fields) != 2 || fields[1] != "kB" {
			return s, fmt.Errorf("unexpected %s line %q", key, line)
		}
		kb, err := strconv.ParseInt(fields[0], 10, 64)
		if err != nil {
			return s, fmt.Errorf("parse %q: %w", line, err)
		}
		*dst = kb * 1024
		found++
	}
	if found != 3 {
		return s, errors.New("no VmRSS, RssAnon and RssFile in /proc status (process exited?)")
	}
	return s, nil
}
