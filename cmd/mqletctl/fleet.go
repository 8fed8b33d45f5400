package main

// Commands to many nodes at once: --group G sends one command on the
// group's topic, -L SELECTOR one command to each node whose labels match;
// either way every member's replies are collected and shown one row per
// node (docs/fleet.md).

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/duration"

	apiv1 "github.com/mqlet/mqlet/api/v1"
	"github.com/mqlet/mqlet/sealing"
)

// fleetFlags are --group and -L/--node-selector of a command.
type fleetFlags struct {
	group    optString
	selector optString
}

// optString is a string flag that knows whether it was given (so an empty
// selector is refused, not read as "every node").
type optString struct {
	value string
	set   bool
}

func (o *optString) String() string     { return o.value }
func (o *optString) Set(v string) error { o.value, o.set = v, true; return nil }

// registerFleet adds --group and -L to a command's flags, bound to the
// run's fleet flags (which `mqletctl --group G CMD` sets too).
func registerFleet(fs *flag.FlagSet, cfg *globalConfig) *fleetFlags {
	return registerFleetOn(fs, &cfg.fleet)
}

// fleetCommands are the commands that take --group and -L.
var fleetCommands = map[string]bool{"apply": true, "sync": true, "delete": true, "restart": true, "get": true, "logs": true, "rollout": true}

func registerFleetOn(fs *flag.FlagSet, f *fleetFlags) *fleetFlags {
	fs.Var(&f.group, "group", "send to every member of `GROUP` (its group topic; members known from their retained state)")
	fs.Var(&f.selector, "L", "send to every node whose labels (retained node objects) match `SELECTOR`, e.g. site=plant-3; one command per node")
	fs.Var(&f.selector, "node-selector", "same as -L")
	return f
}

// active reports whether the command goes to a fleet.
func (f *fleetFlags) active() bool { return f.group.set || f.selector.set }

// check refuses what cannot name a fleet: both flags, --node with one, a
// group name that is no group name, an empty or unparsable selector.
func (f *fleetFlags) check(cfg *globalConfig, verb string) error {
	if f.group.set && f.selector.set {
		return usageError{fmt.Errorf("%s: --group and -L exclude each other", verb)}
	}
	if cfg.explicit["node"] {
		return usageError{fmt.Errorf("%s: --node and --group/-L exclude each other", verb)}
	}
	if f.group.set {
		if err := apiv1.ValidateGroupName(f.group.value); err != nil {
			return usageError{fmt.Errorf("%s --group: %w", verb, err)}
		}
	}
	if f.selector.set {
		if strings.TrimSpace(f.selector.value) == "" {
			return usageError{fmt.Errorf("%s: -L is empty (an empty selector would name every node; give one, e.g. -L site=plant-3)", verb)}
		}
		if _, err := labels.Parse(f.selector.value); err != nil {
			return usageError{fmt.Errorf("%s -L %q: %w", verb, f.selector.value, err)}
		}
	}
	return cfg.resolveFleet()
}

// describe names the fleet in messages.
func (f *fleetFlags) describe() string {
	if f.group.set {
		return "group " + f.group.value
	}
	return "nodes matching -L " + f.selector.value
}

// inGroup reports whether a node's retained state names group.
func inGroup(r *nodeRow, group string) bool {
	if r.State == nil {
		return false
	}
	for _, g := range r.State.Groups {
		if g == group {
			return true
		}
	}
	return false
}

// members reads the fleet and returns the nodes the flags name, in name
// order: the group's members by their retained state, or the nodes whose
// retained node object's labels match. None is an error.
func (f *fleetFlags) members(ctx context.Context, cfg *globalConfig) ([]*nodeRow, error) {
	rows, err := readFleetTopics(ctx, cfg, false)
	if err != nil {
		return nil, err
	}
	return f.pick(rows, cfg.Prefix)
}

func (f *fleetFlags) pick(rows []*nodeRow, prefix string) ([]*nodeRow, error) {
	var out []*nodeRow
	if f.group.set {
		for _, r := range rows {
			if inGroup(r, f.group.value) {
				out = append(out, r)
			}
		}
		if len(out) == 0 {
			for _, r := range rows {
				if r.Node == f.group.value {
					return nil, fmt.Errorf("unknown group %q: %s is a node under prefix %s, not a group (use --node %s); no node names group %s in its retained state", f.group.value, f.group.value, prefix, f.group.value, f.group.value)
				}
			}
			return nil, fmt.Errorf("unknown group %q: no node under prefix %s names it in its retained state (check --group and --prefix; a node joins with its groups setting)", f.group.value, prefix)
		}
		return out, nil
	}
	sel, err := labels.Parse(f.selector.value)
	if err != nil {
		return nil, usageError{fmt.Errorf("-L %q: %w", f.selector.value, err)}
	}
	for _, r := range rows {
		if r.Info != nil && sel.Matches(labels.Set(r.Info.Labels)) {
			out = append(out, r)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no node under prefix %s has labels matching -L %q (labels are read from the retained node objects)", prefix, f.selector.value)
	}
	return out, nil
}

// memberResult is one member's answer to a fleet command.
type memberResult struct {
	Node    string        `json:"node"`
	Phase   string        `json:"phase"` // a reply phase, or Pending for an offline member
	Message string        `json:"message,omitempty"`
	Errors  []string      `json:"errors,omitempty"`
	TS      time.Time     `json:"ts,omitempty"`
	Offline *time.Time    `json:"offlineSince,omitempty"`
	Final   *apiv1.Reply  `json:"-"`
	replies []apiv1.Reply // every reply, in order (parts of a large result)
}

const phasePending = "Pending"

// maxMemberReplyBytes bounds what mqletctl keeps of one member's replies
// to one request (a get's parts, a log): a publisher flooding a reply
// topic fails that member instead of filling the memory.
var maxMemberReplyBytes = 64 << 20 // a variable for the tests

// fleetSend sends one command to the members (on the group's topic, or to
// each node) under one request id, and collects every member's replies
// until each online member gave a final one. A member whose retained
// state says offline is not waited for (the command waits at the broker
// in its session): it is Pending, offline since when its state says,
// unless --wait-offline. At the deadline, an online member that did not
// answer has failed.
func fleetSend(ctx context.Context, cfg *globalConfig, f *fleetFlags, members []*nodeRow, verb string, payload []byte) ([]*memberResult, error) {
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	c, err := dial(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer c.close()
	return fleetSendOn(ctx, c, cfg, f, members, verb, payload)
}

func fleetSendOn(ctx context.Context, c *client, cfg *globalConfig, f *fleetFlags, members []*nodeRow, verb string, payload []byte) ([]*memberResult, error) {
	id := newRequestID()
	results := map[string]*memberResult{}
	kept := map[string]int{} // reply bytes kept per member
	var filters []string
	replyOf := map[string]string{} // reply topic -> node
	stateOf := map[string]string{} // state topic -> node
	for _, m := range members {
		s := apiv1.Scheme{Prefix: cfg.Prefix, Node: m.Node}
		results[m.Node] = &memberResult{Node: m.Node}
		replyOf[s.Reply(id)] = m.Node
		stateOf[s.State()] = m.Node
		filters = append(filters, s.Reply(id), s.State())
	}
	subCtx, stop := context.WithCancel(ctx)
	defer stop()
	inbox := make(chan message, 64)
	if err := c.subscribe(subCtx, inbox, filters...); err != nil {
		return nil, err
	}
	defer c.mqtt.Unsubscribe(filters...)
	if f.group.set {
		sealed, err := cfg.sealAs(f.group.value, verb, id, payload)
		if err != nil {
			return nil, err
		}
		t := apiv1.Scheme{Prefix: cfg.Prefix}.CommandIn(apiv1.Scope{Group: f.group.value}, verb, id)
		if err := c.publish(ctx, t, sealed); err != nil {
			return nil, err
		}
	} else {
		for _, m := range members {
			sealed, err := cfg.sealAs(m.Node, verb, id, payload)
			if err != nil {
				return nil, err
			}
			if err := c.publish(ctx, apiv1.Scheme{Prefix: cfg.Prefix, Node: m.Node}.Command(verb, id), sealed); err != nil {
				return nil, err
			}
		}
	}
	for waitingForAnswers(results, cfg.WaitOffline) {
		select {
		case m := <-inbox:
			if n, ok := stateOf[m.Topic]; ok {
				results[n].stateSeen(m.Payload)
				continue
			}
			n, ok := replyOf[m.Topic]
			if !ok {
				continue
			}
			rep, err := apiv1.DecodeReply(m.Payload)
			if err != nil || (rep.RequestID != "" && rep.RequestID != id) {
				continue // one bad publisher must not hide the fleet's answers
			}
			r := results[n]
			if r.Final != nil {
				continue
			}
			if kept[n] += len(m.Payload); kept[n] > maxMemberReplyBytes {
				final := apiv1.Reply{Phase: apiv1.Failed, Message: fmt.Sprintf("replies to request %s over %d bytes: not kept", id, maxMemberReplyBytes)}
				r.Phase, r.Message, r.Final, r.replies = final.Phase, final.Message, &final, nil
				continue
			}
			r.replies = append(r.replies, rep)
			r.answered(rep)
		case <-ctx.Done():
			if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return nil, ctx.Err()
			}
			failUnanswered(results, "no reply", func(last string) string {
				return fmt.Sprintf("no final reply to request %s within --timeout %v (last: %s)", id, cfg.Timeout, last)
			})
			return sortedResults(results), nil
		}
	}
	return sortedResults(results), nil
}

func sortedResults(m map[string]*memberResult) []*memberResult {
	out := make([]*memberResult, 0, len(m))
	for _, r := range m {
		if r.Final == nil && r.Offline != nil {
			r.Phase = phasePending
			r.Message = "offline since " + r.Offline.UTC().Format(time.RFC3339) + ": the command waits at the broker and runs when the node is back"
		}
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Node < out[j].Node })
	return out
}

// waitingForAnswers reports whether a member still owes a final answer:
// an online one, or an offline one with --wait-offline.
func waitingForAnswers(results map[string]*memberResult, waitOffline bool) bool {
	for _, r := range results {
		if r.Final == nil && (r.Offline == nil || waitOffline) {
			return true
		}
	}
	return false
}

// stateSeen notes the member's state message: offline since when it says,
// or online again. Ignored once the member answered.
func (r *memberResult) stateSeen(payload []byte) {
	var st apiv1.NodeState
	if len(payload) == 0 || json.Unmarshal(payload, &st) != nil || r.Final != nil {
		return
	}
	if st.State == apiv1.StateOffline {
		since := st.TS
		r.Offline = &since
	} else {
		r.Offline = nil
	}
}

// answered notes one reply; a final one ends the member's wait.
func (r *memberResult) answered(rep apiv1.Reply) {
	r.Phase, r.Message, r.Errors, r.TS = rep.Phase, rep.Message, rep.Errors, rep.TS
	if rep.Final() {
		final := rep
		r.Final, r.Offline = &final, nil
	}
}

// failUnanswered fails every online member without a final answer at the
// deadline; why says why, given its last phase (or none).
func failUnanswered(results map[string]*memberResult, none string, why func(last string) string) {
	for _, r := range results {
		if r.Final == nil && r.Offline == nil {
			last := r.Phase
			if last == "" {
				last = none
			}
			r.Phase = apiv1.Failed
			r.Message = why(last)
		}
	}
}

// fleetOutcome is the exit of a fleet command: failed when a member
// failed, queued (exit 3) when every online member succeeded and some are
// offline, else success.
func fleetOutcome(results []*memberResult, what string) error {
	failed, pending := 0, 0
	for _, r := range results {
		switch r.Phase {
		case apiv1.Failed:
			failed++
		case phasePending:
			pending++
		}
	}
	switch {
	case failed > 0:
		return errReported
	case pending > 0:
		return fleetQueued{pending: pending, total: len(results), what: what}
	}
	return nil
}

// fleetQueued: every online member succeeded, some are offline (exit 3).
type fleetQueued struct {
	pending, total int
	what           string
}

func (q fleetQueued) Error() string {
	return fmt.Sprintf("queued: %d of %d member(s) of %s offline; the command waits at the broker for each and runs when it is back (--wait-offline waits for them)", q.pending, q.total, q.what)
}

// printFleetTable prints one row per node: NODE, PHASE, MESSAGE, AGE.
func printFleetTable(w io.Writer, results []*memberResult, now func() time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 8, 3, ' ', 0)
	fmt.Fprintln(tw, "NODE\tPHASE\tMESSAGE\tAGE")
	for _, r := range results {
		age := "<unknown>"
		at := r.TS
		if r.Final == nil && r.Offline != nil {
			at = *r.Offline
		}
		if !at.IsZero() {
			age = duration.HumanDuration(now().Sub(at))
		}
		msg := r.Message
		for _, e := range r.Errors {
			if !strings.Contains(msg, e) {
				msg += "; " + e
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", printable(r.Node), printable(r.Phase), printable(oneLine(msg)), age)
	}
	return tw.Flush()
}

// oneLine keeps a message on its table row.
func oneLine(s string) string {
	s = strings.ReplaceAll(s, "\n", " ")
	if len(s) > 300 {
		s = s[:300] + "..."
	}
	return s
}

// printFleetResults prints the table or, with -o json, one line per node.
func printFleetResults(cfg *globalConfig, e env, results []*memberResult) error {
	if cfg.Output == "json" {
		for _, r := range results {
			if err := printJSONLine(e.stdout, r); err != nil {
				return err
			}
		}
		return nil
	}
	return printFleetTable(e.stdout, results, e.now)
}

// runFleetVerb sends verb with payload to the fleet and prints one row
// per member.
func runFleetVerb(ctx context.Context, cfg *globalConfig, f *fleetFlags, verb string, payload []byte, sealTo *string, e env) error {
	members, err := f.members(ctx, cfg)
	if err != nil {
		return err
	}
	if sealTo != nil {
		if payload, err = sealForMembers(payload, *sealTo, members); err != nil {
			return err
		}
	}
	results, err := fleetSend(ctx, cfg, f, members, verb, payload)
	if err != nil {
		return err
	}
	if err := printFleetResults(cfg, e, results); err != nil {
		return err
	}
	return fleetOutcome(results, f.describe())
}

// sealForMembers seals the payload's Secrets to every member's sealing
// key (each opens them with its own), or to sealTo when given.
func sealForMembers(payload []byte, sealTo string, members []*nodeRow) ([]byte, error) {
	out, _, err := sealing.SealManifest(payload, "default", func() ([]sealing.Recipient, error) {
		var keys []string
		if sealTo != "" {
			keys = strings.Split(sealTo, ",")
		} else {
			for _, m := range members {
				if m.State == nil || m.State.SealingKey == "" {
					return nil, fmt.Errorf("node %s publishes no sealingKey in its state", m.Node)
				}
				keys = append(keys, m.State.SealingKey)
			}
		}
		rs := make([]sealing.Recipient, 0, len(keys))
		for _, k := range keys {
			r, err := sealing.ParseRecipient(k)
			if err != nil {
				return nil, err
			}
			rs = append(rs, r)
		}
		return rs, nil
	})
	if err != nil {
		return nil, fmt.Errorf("sealing Secrets to the members' keys: %w (--unsealed sends them in clear)", err)
	}
	return out, nil
}

// runFleetGet sends a get to the fleet and prints what each member holds,
// with a NODE column.
func runFleetGet(ctx context.Context, cfg *globalConfig, f *fleetFlags, req apiv1.GetRequest, sel labels.Selector, ns string, e env) error {
	members, err := f.members(ctx, cfg)
	if err != nil {
		return err
	}
	payload, _ := json.Marshal(req) // strings always encode
	results, err := fleetSend(ctx, cfg, f, members, apiv1.VerbGet, payload)
	if err != nil {
		return err
	}
	type nodeGet struct {
		Node   string           `json:"node"`
		Result *apiv1.GetResult `json:"result"`
	}
	var got []nodeGet
	var problems []*memberResult
	for _, r := range results {
		if r.Phase != apiv1.Succeeded {
			problems = append(problems, r)
			continue
		}
		raw := make([][]byte, 0, len(r.replies))
		for _, rep := range r.replies {
			if b, err := json.Marshal(rep); err == nil {
				raw = append(raw, b)
			}
		}
		data, _, err := apiv1.Assemble(raw)
		var res apiv1.GetResult
		if err == nil {
			err = json.Unmarshal(data, &res)
		}
		if err != nil {
			problems = append(problems, &memberResult{Node: r.Node, Phase: apiv1.Failed, Message: "undecodable get result: " + err.Error(), TS: r.TS})
			continue
		}
		filterResult(&res, sel)
		got = append(got, nodeGet{Node: r.Node, Result: &res})
	}
	switch cfg.Output {
	case "json", "yaml":
		out := map[string]any{"nodes": got}
		if len(problems) > 0 {
			out["unanswered"] = problems
		}
		if err := printObjects(e.stdout, cfg.Output, out); err != nil {
			return err
		}
	default:
		p := printer{w: e.stdout, errw: e.stderr, namespace: ns, now: e.now}
		tw := tabwriter.NewWriter(e.stdout, 0, 8, 3, ' ', 0)
		listed := 0
		if req.Kind == "" || req.Kind == apiv1.KindPod {
			fmt.Fprintln(tw, "NODE\tNAMESPACE\tNAME\tREADY\tSTATUS\tRESTARTS\tAGE")
			for _, g := range got {
				sortByKey(g.Result.Pods, func(pod *v1.Pod) string { return pod.Namespace + "/" + pod.Name })
				for _, pod := range g.Result.Pods {
					listed++
					fmt.Fprintln(tw, strings.Join([]string{printable(g.Node), printable(pod.Namespace), printable(pod.Name), podReady(pod), printable(podStatus(pod)), p.podRestarts(pod), p.age(pod.CreationTimestamp)}, "\t"))
				}
			}
		}
		if req.Kind == "" || req.Kind == apiv1.KindConfigMap || req.Kind == apiv1.KindSecret {
			if req.Kind == "" {
				fmt.Fprintln(tw)
			}
			fmt.Fprintln(tw, "NODE\tNAMESPACE\tNAME\tKIND\tDATA\tAGE")
			for _, g := range got {
				for _, cm := range g.Result.ConfigMaps {
					listed++
					fmt.Fprintln(tw, strings.Join([]string{printable(g.Node), printable(cm.Namespace), printable(cm.Name), "ConfigMap", fmt.Sprint(len(cm.Data) + len(cm.BinaryData)), p.age(cm.CreationTimestamp)}, "\t"))
				}
				for _, s := range g.Result.Secrets {
					listed++
					fmt.Fprintln(tw, strings.Join([]string{printable(g.Node), printable(s.Namespace), printable(s.Name), "Secret", fmt.Sprint(len(s.Data)), p.age(s.CreationTimestamp)}, "\t"))
				}
			}
		}
		if listed == 0 {
			if err := p.noResources(); err != nil {
				return err
			}
		} else if err := tw.Flush(); err != nil {
			return err
		}
		if len(problems) > 0 {
			fmt.Fprintln(e.stderr)
			if err := printFleetTable(e.stderr, problems, e.now); err != nil {
				return err
			}
		}
	}
	return fleetOutcome(problemsAndOK(problems, len(results)), f.describe())
}

// problemsAndOK is the members' outcomes for fleetOutcome: the problems,
// the others succeeded.
func problemsAndOK(problems []*memberResult, total int) []*memberResult {
	out := append([]*memberResult(nil), problems...)
	for len(out) < total {
		out = append(out, &memberResult{Phase: apiv1.Succeeded})
	}
	return out
}

// runFleetLogs sends a logs request to the fleet and prints each member's
// lines prefixed with its name.
func runFleetLogs(ctx context.Context, cfg *globalConfig, f *fleetFlags, req apiv1.LogsRequest, e env) error {
	members, err := f.members(ctx, cfg)
	if err != nil {
		return err
	}
	payload, _ := json.Marshal(req) // plain values always encode
	results, err := fleetSend(ctx, cfg, f, members, apiv1.VerbLogs, payload)
	if err != nil {
		return err
	}
	var problems []*memberResult
	for _, r := range results {
		if r.Phase != apiv1.Succeeded {
			problems = append(problems, r)
			continue
		}
		prefix := "[" + printable(r.Node) + "] "
		for _, rep := range r.replies {
			var lines []string
			if rep.Phase == apiv1.InProgress {
				var c apiv1.LogsChunk
				if json.Unmarshal(rep.RawResult(), &c) == nil {
					lines = c.Lines
				}
			} else if rep.Final() {
				var res apiv1.LogsResult
				if json.Unmarshal(rep.RawResult(), &res) == nil {
					lines = res.Lines
				}
			}
			for _, l := range lines {
				fmt.Fprintln(e.stdout, prefix+l)
			}
		}
	}
	if len(problems) > 0 {
		if err := printFleetTable(e.stderr, problems, e.now); err != nil {
			return err
		}
	}
	return fleetOutcome(problemsAndOK(problems, len(results)), f.describe())
}
