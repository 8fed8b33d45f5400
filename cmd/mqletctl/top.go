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
	statsapi "k8s.io/kubelet/pkg/apis/stats/v1alpha1"

	apiv1 "github.com/mqlet/mqlet/api/v1"
)

// runTop is `top node` / `top pods`: usage from the next metrics message
// (a kubelet stats Summary). Metrics are not retained, so it waits for the
// agent's next report, at most --timeout.
func runTop(ctx context.Context, cfg *globalConfig, args []string, e env) error {
	fs := newFlagSet("top", cfg)
	ns := namespaceFlag(fs, nsAll)
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usageError{errors.New("top: want `top node` or `top pods`")}
	}
	var pods bool
	switch strings.ToLower(pos[0]) {
	case "node", "nodes", "no":
	case "pod", "pods", "po":
		pods = true
	default:
		return usageError{fmt.Errorf("top: unknown kind %q (node or pods)", pos[0])}
	}
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
	subCtx, stop := context.WithCancel(ctx)
	defer stop()
	inbox := make(chan message, 8)
	topics := cfg.scheme()
	if err := c.subscribe(subCtx, inbox, topics.Metrics(), topics.NodeTopic(), topics.State()); err != nil {
		return err
	}
	// A node that never published its retained state will not send
	// metrics either: say so after --retained-wait, not after --timeout.
	noNode := time.NewTimer(cfg.RetainedWait)
	defer noNode.Stop()
	var node *v1.Node
	for {
		select {
		case <-noNode.C:
			return fmt.Errorf("no node named %q under prefix %s (no retained state after --retained-wait %v)", cfg.Node, cfg.Prefix, cfg.RetainedWait)
		case m := <-inbox:
			if m.Topic == topics.State() {
				if len(m.Payload) > 0 {
					noNode.Stop()
				}
				// An offline node sends no metrics: say so at once.
				var st apiv1.NodeState
				if json.Unmarshal(m.Payload, &st) == nil && st.State == apiv1.StateOffline {
					return fmt.Errorf("node %s is offline since %s: it sends no metrics", cfg.Node, st.TS.UTC().Format(time.RFC3339))
				}
				continue
			}
			if m.Topic == topics.NodeTopic() {
				var n v1.Node
				if json.Unmarshal(m.Payload, &n) == nil {
					node = &n
				}
				continue
			}
			var s statsapi.Summary
			if err := json.Unmarshal(m.Payload, &s); err != nil {
				return fmt.Errorf("decoding the metrics message on %s: %w", m.Topic, err)
			}
			if pods {
				return printTopPods(e, &s, *ns)
			}
			return printTopNode(e.stdout, cfg.Node, &s, node)
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return fmt.Errorf("no metrics message from node %q within --timeout %v (metrics are sent every telemetry.metricsInterval; 0 turns them off)", cfg.Node, cfg.Timeout)
			}
			return ctx.Err()
		}
	}
}

func printTopNode(w io.Writer, name string, s *statsapi.Summary, node *v1.Node) error {
	tw := tabwriter.NewWriter(w, 0, 8, 3, ' ', 0)
	fmt.Fprintln(tw, "NAME\tCPU(cores)\tCPU(%)\tMEMORY(bytes)\tMEMORY(%)")
	cpu, mem := "<unknown>", "<unknown>"
	cpuPct, memPct := "<unknown>", "<unknown>"
	if s.Node.CPU != nil && s.Node.CPU.UsageNanoCores != nil {
		nano := *s.Node.CPU.UsageNanoCores
		cpu = millicores(nano)
		if node != nil {
			if q, ok := node.Status.Allocatable[v1.ResourceCPU]; ok && q.MilliValue() > 0 {
				cpuPct = fmt.Sprintf("%d%%", int64(nano/1e6)*100/q.MilliValue())
			}
		}
	}
	if s.Node.Memory != nil && s.Node.Memory.WorkingSetBytes != nil {
		ws := *s.Node.Memory.WorkingSetBytes
		mem = mebibytes(ws)
		if node != nil {
			if q, ok := node.Status.Allocatable[v1.ResourceMemory]; ok && q.Value() > 0 {
				memPct = fmt.Sprintf("%d%%", int64(ws)*100/q.Value())
			}
		}
	}
	if s.Node.NodeName != "" {
		name = s.Node.NodeName
	}
	fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", printable(name), cpu, cpuPct, mem, memPct)
	return tw.Flush()
}

func printTopPods(e env, s *statsapi.Summary, ns string) error {
	pods := make([]statsapi.PodStats, 0, len(s.Pods))
	for _, p := range s.Pods {
		if ns == "" || p.PodRef.Namespace == ns {
			pods = append(pods, p)
		}
	}
	if len(pods) == 0 {
		return printer{errw: e.stderr, namespace: ns}.noResources()
	}
	sort.Slice(pods, func(i, j int) bool {
		return pods[i].PodRef.Namespace+"/"+pods[i].PodRef.Name < pods[j].PodRef.Namespace+"/"+pods[j].PodRef.Name
	})
	tw := tabwriter.NewWriter(e.stdout, 0, 8, 3, ' ', 0)
	header := "NAME\tCPU(cores)\tMEMORY(bytes)"
	if ns == "" {
		header = "NAMESPACE\t" + header
	}
	fmt.Fprintln(tw, header)
	for _, p := range pods {
		// A pod's usage is the sum of its containers', as metrics-server
		// reports it.
		var nano, ws uint64
		for _, c := range p.Containers {
			if c.CPU != nil && c.CPU.UsageNanoCores != nil {
				nano += *c.CPU.UsageNanoCores
			}
			if c.Memory != nil && c.Memory.WorkingSetBytes != nil {
				ws += *c.Memory.WorkingSetBytes
			}
		}
		row := printable(p.PodRef.Name) + "\t" + millicores(nano) + "\t" + mebibytes(ws)
		if ns == "" {
			row = printable(p.PodRef.Namespace) + "\t" + row
		}
		fmt.Fprintln(tw, row)
	}
	return tw.Flush()
}

func millicores(nano uint64) string { return fmt.Sprintf("%dm", nano/1e6) }

func mebibytes(b uint64) string { return fmt.Sprintf("%dMi", b/(1<<20)) }
