package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	apiv1 "github.com/mqlet/mqlet/api/v1"
)

// isNodeKind reports whether s names nodes, as kubectl spells them.
func isNodeKind(s string) bool {
	switch strings.ToLower(s) {
	case "node", "nodes", "no":
		return true
	}
	return false
}

// decommission clears what node left retained at the broker (its state,
// node and pod topics), so a node taken out of service no longer shows in
// get nodes or get pods. It refuses while the node's state says online,
// unless force: a running node would publish them again.
func decommission(ctx context.Context, cfg *globalConfig, node string, force bool, e env) error {
	if err := apiv1.ValidateNodeName(node); err != nil {
		return usageError{fmt.Errorf("delete node: %w", err)}
	}
	cfg.Node = node
	if err := cfg.resolve(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	c, err := dial(ctx, cfg)
	if err != nil {
		return err
	}
	defer c.close()
	topics := cfg.scheme()
	subCtx, stop := context.WithCancel(ctx)
	defer stop()
	inbox := make(chan message, 256)
	podFilter := topics.Pod("+", "+")
	if err := c.subscribe(subCtx, inbox, topics.State(), topics.NodeTopic(), podFilter); err != nil {
		return err
	}
	// Retained messages come at once after the subscription; wait
	// --retained-wait for them, from the last one heard.
	retained := map[string]bool{}
	var state apiv1.NodeState
	quiet := time.NewTimer(cfg.RetainedWait)
	defer quiet.Stop()
collect:
	for {
		select {
		case m := <-inbox:
			if !m.Retained || len(m.Payload) == 0 {
				continue
			}
			retained[m.Topic] = true
			if m.Topic == topics.State() {
				_ = json.Unmarshal(m.Payload, &state)
			}
			quiet.Reset(cfg.RetainedWait)
		case <-quiet.C:
			break collect
		case <-ctx.Done():
			return fmt.Errorf("delete node %s: reading its retained topics: %w", node, ctx.Err())
		}
	}
	if len(retained) == 0 {
		fmt.Fprintf(e.stderr, "Error from server (NotFound): nodes %q not found (nothing retained under %s)\n", node, cfg.Prefix)
		return errReported
	}
	if state.State == apiv1.StateOnline && !force {
		return fmt.Errorf("node %s is online (since %s): stop its mqlet first, or --force (a running node publishes its topics again)", node, state.TS.UTC().Format(time.RFC3339))
	}
	names := make([]string, 0, len(retained))
	for t := range retained {
		names = append(names, t)
	}
	sort.Strings(names)
	for _, t := range names {
		if err := wait(ctx, c.mqtt.Publish(t, 1, true, []byte{})); err != nil {
			return fmt.Errorf("delete node %s: clearing %s: %w", node, t, err)
		}
	}
	fmt.Fprintf(e.stdout, "node/%s deleted (%d retained topics cleared)\n", node, len(names))
	return nil
}

var errNodeFlag = errors.New("delete: --force applies to delete node only")
