package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/duration"

	apiv1 "github.com/mqlet/mqlet/api/v1"
)

// statusReport is what status read; nil fields were not published.
type statusReport struct {
	Node  string           `json:"node"`
	State *apiv1.NodeState `json:"state"`
	Info  *v1.Node         `json:"nodeObject"`
}

func runStatus(ctx context.Context, cfg *globalConfig, args []string, e env) error {
	fs := newFlagSet("status", cfg, e.stderr)
	cfg.registerOutput(fs, "json or yaml (default: text)")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usageError{fmt.Errorf("status: unexpected arguments %q", pos)}
	}
	if err := cfg.checkOutput("json", "yaml"); err != nil {
		return err
	}
	if err := cfg.resolve(); err != nil {
		return err
	}
	rep, err := readStatus(ctx, cfg)
	if err != nil {
		return err
	}
	if cfg.Output != "" {
		if err := printObjects(e.stdout, cfg.Output, rep); err != nil {
			return err
		}
	} else if err := printStatus(e.stdout, rep, e.now); err != nil {
		return err
	}
	if rep.State == nil || rep.State.State != apiv1.StateOnline {
		return errReported // offline or unknown: a script can test the exit code
	}
	return nil
}

// readStatus reads the retained state and node topics. A retained message
// arrives right after the subscription is granted; when a topic has none,
// there is no signal for that, so it waits at most cfg.RetainedWait.
func readStatus(ctx context.Context, cfg *globalConfig) (*statusReport, error) {
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	c, err := dial(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer c.close()
	topics := cfg.scheme()
	inbox := make(chan message, 4)
	if err := c.subscribe(ctx, inbox, topics.State(), topics.NodeTopic()); err != nil {
		return nil, err
	}
	grace := time.NewTimer(cfg.RetainedWait)
	defer grace.Stop()
	rep := &statusReport{Node: cfg.Node}
	var gotState, gotNode bool
	for !(gotState && gotNode) {
		select {
		case m := <-inbox:
			if len(m.Payload) == 0 {
				continue // a cleared retained topic
			}
			switch m.Topic {
			case topics.State():
				var s apiv1.NodeState
				if err := json.Unmarshal(m.Payload, &s); err != nil {
					return nil, fmt.Errorf("decoding %s: %w", m.Topic, err)
				}
				rep.State, gotState = &s, true
			case topics.NodeTopic():
				var n v1.Node
				if err := json.Unmarshal(m.Payload, &n); err != nil {
					return nil, fmt.Errorf("decoding %s: %w", m.Topic, err)
				}
				rep.Info, gotNode = &n, true
			}
		case <-grace.C:
			return rep, nil
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return rep, nil
			}
			return nil, ctx.Err()
		}
	}
	return rep, nil
}

func printStatus(w io.Writer, rep *statusReport, now func() time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 8, 1, ' ', 0)
	field := func(k, v string) { fmt.Fprintf(tw, "%s:\t%s\n", k, v) }
	field("Node", rep.Node)
	if s := rep.State; s != nil {
		field("State", s.State)
		field("Seq", fmt.Sprint(s.Seq))
		field("Boot ID", s.BootID)
		field("Version", s.Version)
		if !s.StartedAt.IsZero() {
			field("Started", fmt.Sprintf("%s (%s ago)", s.StartedAt.UTC().Format(time.RFC3339), duration.HumanDuration(now().Sub(s.StartedAt))))
		}
		if !s.TS.IsZero() {
			field("Last state change", fmt.Sprintf("%s (%s ago)", s.TS.UTC().Format(time.RFC3339), duration.HumanDuration(now().Sub(s.TS))))
		}
	} else {
		field("State", "unknown (no retained state message: the agent never connected to this broker, or --node/--prefix is wrong)")
	}
	if n := rep.Info; n != nil {
		field("Ready", readyCondition(n))
		var pressure []string
		for _, c := range n.Status.Conditions {
			if c.Type != v1.NodeReady && c.Status == v1.ConditionTrue {
				pressure = append(pressure, string(c.Type))
			}
		}
		if len(pressure) > 0 {
			field("Pressure", strings.Join(pressure, ", "))
		}
		field("Capacity", resourceList(n.Status.Capacity))
		field("Allocatable", resourceList(n.Status.Allocatable))
		info := n.Status.NodeInfo
		if os := strings.TrimSpace(info.OSImage + " " + info.Architecture); os != "" {
			field("OS", os)
		}
		if info.ContainerRuntimeVersion != "" {
			field("Runtime", info.ContainerRuntimeVersion)
		}
		var addrs []string
		for _, a := range n.Status.Addresses {
			addrs = append(addrs, fmt.Sprintf("%s=%s", a.Type, a.Address))
		}
		if len(addrs) > 0 {
			field("Addresses", strings.Join(addrs, ", "))
		}
	} else {
		field("Ready", "unknown (no retained node message)")
	}
	return tw.Flush()
}

// readyCondition describes the node's Ready condition.
func readyCondition(n *v1.Node) string {
	for _, c := range n.Status.Conditions {
		if c.Type != v1.NodeReady {
			continue
		}
		s := string(c.Status)
		if c.Reason != "" || c.Message != "" {
			s += " (" + strings.TrimSuffix(c.Reason+": "+c.Message, ": ") + ")"
		}
		return s
	}
	return "unknown (no Ready condition)"
}

// resourceList prints a resource list sorted by name: "cpu=4, memory=...".
func resourceList(rl v1.ResourceList) string {
	if len(rl) == 0 {
		return "<none>"
	}
	names := make([]string, 0, len(rl))
	for name := range rl {
		names = append(names, string(name))
	}
	sort.Strings(names)
	parts := make([]string, 0, len(names))
	for _, name := range names {
		q := rl[v1.ResourceName(name)]
		parts = append(parts, name+"="+q.String())
	}
	return strings.Join(parts, ", ")
}
