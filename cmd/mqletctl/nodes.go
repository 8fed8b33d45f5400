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
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	apiv1 "github.com/mqlet/mqlet/api/v1"
)

// nodeRow is what the broker holds retained for one node.
type nodeRow struct {
	Node  string           `json:"node"`
	State *apiv1.NodeState `json:"state"`
	Info  *v1.Node         `json:"nodeObject"`
	Pods  int              `json:"pods"` // retained pod status topics
}

// fleetTopic splits <prefix>/<node>/<rest> into node and rest.
func fleetTopic(prefix, t string) (node, rest string, ok bool) {
	after, ok := strings.CutPrefix(t, prefix+"/")
	if !ok {
		return "", "", false
	}
	node, rest, ok = strings.Cut(after, "/")
	if !ok || apiv1.ValidateNodeName(node) != nil {
		return "", "", false
	}
	return node, rest, true
}

// readFleet reads the retained state, node and pod topics of every node
// under the prefix. Retained messages come as one burst right after the
// subscription; there is no end marker, so it stops when the burst has
// been quiet for a quarter of --retained-wait (at most 500ms), or after
// --retained-wait in all.
func readFleet(ctx context.Context, cfg *globalConfig) ([]*nodeRow, error) {
	return readFleetTopics(ctx, cfg, true)
}

// readFleetTopics is readFleet; without withPods it reads the state and
// node topics only (a fleet command needs no pod counts, and a large
// fleet retains many pods).
func readFleetTopics(ctx context.Context, cfg *globalConfig, withPods bool) ([]*nodeRow, error) {
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	c, err := dial(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer c.close()
	all := apiv1.Scheme{Prefix: cfg.Prefix, Node: "+"}
	filters := []string{all.State(), all.NodeTopic()}
	if withPods {
		filters = append(filters, all.Pod("+", "+"))
	}
	rows := map[string]*nodeRow{}
	row := func(n string) *nodeRow {
		if rows[n] == nil {
			rows[n] = &nodeRow{Node: n}
		}
		return rows[n]
	}
	pods := map[string]map[string]bool{}
	err = c.collectRetained(ctx, cfg.Prefix, cfg.RetainedWait, filters, func(m message) {
		node, rest, ok := fleetTopic(cfg.Prefix, m.Topic)
		if !ok {
			return
		}
		switch {
		case rest == "state":
			if len(m.Payload) == 0 {
				return
			}
			var s apiv1.NodeState
			if err := json.Unmarshal(m.Payload, &s); err != nil {
				return // one bad publisher must not hide the fleet
			}
			row(node).State = &s
		case rest == "node":
			if len(m.Payload) == 0 {
				return
			}
			var n v1.Node
			if err := json.Unmarshal(m.Payload, &n); err != nil {
				return
			}
			row(node).Info = &n
		case strings.HasPrefix(rest, "pods/"):
			if pods[node] == nil {
				pods[node] = map[string]bool{}
			}
			if len(m.Payload) == 0 {
				delete(pods[node], rest)
			} else {
				pods[node][rest] = true
			}
		}
	})
	if err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return nil, err
	}
	out := make([]*nodeRow, 0, len(rows))
	for n, r := range rows {
		if r.State == nil && r.Info == nil {
			continue // pods without a node: leftovers, not a node
		}
		r.Pods = len(pods[n])
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Node < out[j].Node })
	return out, nil
}

// nodeStatus is online, offline or NotReady (online but its Ready
// condition is not True), or unknown without a state message.
func nodeStatus(r *nodeRow) string {
	if r.State == nil {
		return "unknown"
	}
	if r.State.State != apiv1.StateOnline {
		return r.State.State
	}
	if r.Info != nil {
		for _, c := range r.Info.Status.Conditions {
			if c.Type == v1.NodeReady && c.Status != v1.ConditionTrue {
				return "NotReady"
			}
		}
	}
	return "online"
}

func runGetNodes(ctx context.Context, cfg *globalConfig, name, selector string, e env) error {
	if err := cfg.resolveFleet(); err != nil {
		return err
	}
	sel, err := parseSelector(selector)
	if err != nil {
		return err
	}
	rows, err := readFleet(ctx, cfg)
	if err != nil {
		return err
	}
	kept := rows[:0]
	for _, r := range rows {
		var l map[string]string
		if r.Info != nil {
			l = r.Info.Labels
		}
		if (name == "" || r.Node == name) && sel.Matches(labels.Set(l)) {
			kept = append(kept, r)
		}
	}
	rows = kept
	if name != "" && len(rows) == 0 {
		fmt.Fprintf(e.stderr, "Error from server (NotFound): no node named %q under prefix %s\n", name, cfg.Prefix)
		return errReported
	}
	switch cfg.Output {
	case "json", "yaml":
		if name != "" {
			return printObjects(e.stdout, cfg.Output, rows[0])
		}
		return printObjects(e.stdout, cfg.Output, map[string]any{"prefix": cfg.Prefix, "nodes": rows})
	case "name":
		for _, r := range rows {
			fmt.Fprintf(e.stdout, "node/%s\n", printable(r.Node))
		}
		return nil
	}
	if len(rows) == 0 {
		fmt.Fprintf(e.stderr, "No resources found under prefix %s\n", cfg.Prefix)
		return nil
	}
	return printNodes(e.stdout, rows, cfg.Output == "wide", e.now)
}

// runGetFleetNodes is get nodes --group G (or -L): the members, as get
// nodes prints them; an unknown group is an error.
func runGetFleetNodes(ctx context.Context, cfg *globalConfig, f *fleetFlags, name, selector string, e env) error {
	if err := f.check(cfg, "get nodes"); err != nil {
		return err
	}
	sel, err := parseSelector(selector)
	if err != nil {
		return err
	}
	rows, err := readFleet(ctx, cfg) // with the pod counts get nodes shows
	if err != nil {
		return err
	}
	members, err := f.pick(rows, cfg.Prefix)
	if err != nil {
		return err
	}
	kept := members[:0]
	for _, r := range members {
		var l map[string]string
		if r.Info != nil {
			l = r.Info.Labels
		}
		if (name == "" || r.Node == name) && sel.Matches(labels.Set(l)) {
			kept = append(kept, r)
		}
	}
	switch cfg.Output {
	case "json", "yaml":
		return printObjects(e.stdout, cfg.Output, map[string]any{"prefix": cfg.Prefix, "nodes": kept})
	case "name":
		for _, r := range kept {
			fmt.Fprintf(e.stdout, "node/%s\n", printable(r.Node))
		}
		return nil
	}
	if len(kept) == 0 {
		fmt.Fprintf(e.stderr, "No resources found in %s\n", f.describe())
		return nil
	}
	return printNodes(e.stdout, kept, cfg.Output == "wide", e.now)
}

func printNodes(w io.Writer, rows []*nodeRow, wide bool, now func() time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 8, 3, ' ', 0)
	header := "NAME\tSTATUS\tAGE\tVERSION\tPODS"
	if wide {
		header += "\tINTERNAL-IP\tOS-IMAGE\tCONTAINER-RUNTIME"
	}
	fmt.Fprintln(tw, header)
	p := printer{now: now}
	for _, r := range rows {
		age, version := "<unknown>", "<unknown>"
		if r.Info != nil && !r.Info.CreationTimestamp.IsZero() {
			age = p.age(r.Info.CreationTimestamp)
		} else if r.State != nil && !r.State.StartedAt.IsZero() {
			age = p.age(metav1.NewTime(r.State.StartedAt))
		}
		if r.State != nil && r.State.Version != "" {
			version = r.State.Version
		} else if r.Info != nil && r.Info.Status.NodeInfo.KubeletVersion != "" {
			version = r.Info.Status.NodeInfo.KubeletVersion
		}
		cells := []string{r.Node, nodeStatus(r), age, version, fmt.Sprint(r.Pods)}
		if wide {
			ip, osImage, rt := "<none>", "<unknown>", "<unknown>"
			if n := r.Info; n != nil {
				for _, a := range n.Status.Addresses {
					if a.Type == v1.NodeInternalIP {
						ip = a.Address
						break
					}
				}
				if n.Status.NodeInfo.OSImage != "" {
					osImage = n.Status.NodeInfo.OSImage
				}
				if n.Status.NodeInfo.ContainerRuntimeVersion != "" {
					rt = n.Status.NodeInfo.ContainerRuntimeVersion
				}
			}
			cells = append(cells, ip, osImage, rt)
		}
		for i := range cells {
			cells[i] = printable(cells[i])
		}
		fmt.Fprintln(tw, strings.Join(cells, "\t"))
	}
	return tw.Flush()
}

// parseSelector parses a kubectl label selector ("app=web,tier!=db").
func parseSelector(s string) (labels.Selector, error) {
	if s == "" {
		return labels.Everything(), nil
	}
	sel, err := labels.Parse(s)
	if err != nil {
		return nil, usageError{fmt.Errorf("-l %q: %w", s, err)}
	}
	return sel, nil
}

// printable replaces control characters, so a hostile name or version in a
// retained message cannot drive the terminal.
func printable(s string) string {
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) {
			return '?'
		}
		return r
	}, s)
}
