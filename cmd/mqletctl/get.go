package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	apiv1 "github.com/mqlet/mqlet/api/v1"
)

// Defaults of the namespace flag, as each command reads an empty one.
const (
	nsAll     = "namespace (default: every namespace)"
	nsDefault = "namespace (default: default)"
)

// namespaceFlag registers -n and --namespace; usage says what an empty
// one means to this command.
func namespaceFlag(fs *flag.FlagSet, usage string) *string {
	ns := fs.String("n", "", usage)
	fs.StringVar(ns, "namespace", "", "same as -n")
	return ns
}

// canonicalKind maps the kubectl spellings to the agent's kinds.
func canonicalKind(s string) (string, bool) {
	switch strings.ToLower(s) {
	case "pod", "pods", "po":
		return "Pod", true
	case "configmap", "configmaps", "cm":
		return "ConfigMap", true
	case "secret", "secrets":
		return "Secret", true
	}
	return "", false
}

func isEventsKind(s string) bool {
	switch strings.ToLower(s) {
	case "event", "events", "ev":
		return true
	}
	return false
}

// runGetEventsArgs checks what get events takes: -n and --for select, the
// agent filters; names, selectors and watching are refused, not ignored.
func runGetEventsArgs(ctx context.Context, cfg *globalConfig, pos []string, ns, selector, forObject string, watch bool, e env) error {
	switch {
	case len(pos) > 1:
		return usageError{fmt.Errorf("get events takes no name (use --for pod/NAME)")}
	case selector != "":
		return usageError{fmt.Errorf("get events: -l is not supported")}
	case watch:
		return usageError{fmt.Errorf("get events: -w is not supported (use `mqletctl watch events`)")}
	case cfg.Output == "wide" || cfg.Output == "name":
		return usageError{fmt.Errorf("get events: -o %s is not supported (json or yaml)", cfg.Output)}
	}
	ref, err := parseFor(forObject, ns)
	if err != nil {
		return err
	}
	return getEvents(ctx, cfg, apiv1.GetRequest{Kind: apiv1.KindEvent, Namespace: ns, InvolvedObject: ref}, e)
}

func runGet(ctx context.Context, cfg *globalConfig, args []string, e env) error {
	fs := newFlagSet("get", cfg)
	ns := namespaceFlag(fs, nsAll)
	selector := fs.String("l", "", "label selector, e.g. app=web,tier!=db")
	fs.StringVar(selector, "selector", "", "same as -l")
	watch := fs.Bool("w", false, "pods only: list, then print a line for every change until Ctrl-C")
	fs.BoolVar(watch, "watch", false, "same as -w")
	forObject := fs.String("for", "", "events only: those of one object, pod/NAME or node/NAME")
	cfg.registerOutput(fs, "json, yaml, wide or name (default: table)")
	fleet := registerFleet(fs, cfg)
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	if err := cfg.checkOutput("json", "yaml", "wide", "name"); err != nil {
		return err
	}
	var req apiv1.GetRequest
	switch len(pos) {
	case 0:
		return usageError{fmt.Errorf("get: what? (pods, configmaps, secrets, events, nodes or all)")}
	case 1, 2:
		if isEventsKind(pos[0]) {
			return runGetEventsArgs(ctx, cfg, pos, *ns, *selector, *forObject, *watch, e)
		}
		if *forObject != "" {
			return usageError{fmt.Errorf("get: --for is for events only")}
		}
		if k := strings.ToLower(pos[0]); k == "nodes" || k == "node" || k == "no" {
			if *watch {
				return usageError{fmt.Errorf("get nodes: -w is not supported (use `mqletctl watch all`)")}
			}
			name := ""
			if len(pos) == 2 {
				name = pos[1]
			}
			if fleet.active() {
				return runGetFleetNodes(ctx, cfg, fleet, name, *selector, e)
			}
			return runGetNodes(ctx, cfg, name, *selector, e)
		}
		if strings.ToLower(pos[0]) != "all" {
			kind, ok := canonicalKind(pos[0])
			if !ok {
				return usageError{fmt.Errorf("get: unknown kind %q (pods, configmaps, secrets, events, nodes, all)", pos[0])}
			}
			req.Kind = kind
		}
		if len(pos) == 2 {
			if req.Kind == "" {
				return usageError{fmt.Errorf("get all takes no name")}
			}
			req.Name = pos[1]
		}
	default:
		return usageError{fmt.Errorf("get: too many arguments %q (want KIND [NAME])", pos)}
	}
	req.Namespace = *ns
	sel, err := parseSelector(*selector)
	if err != nil {
		return err
	}
	if fleet.active() {
		if *watch {
			return usageError{fmt.Errorf("get -w: watches one node (use `mqletctl watch` per node)")}
		}
		if cfg.Output == "name" || cfg.Output == "wide" {
			return usageError{fmt.Errorf("get --group/-L: -o %s is not supported (table, json or yaml)", cfg.Output)}
		}
		if err := fleet.check(cfg, "get"); err != nil {
			return err
		}
		return runFleetGet(ctx, cfg, fleet, req, sel, *ns, e)
	}
	if *watch {
		if req.Kind != apiv1.KindPod {
			return usageError{fmt.Errorf("get -w: only pods can be watched (their status topics are retained)")}
		}
		if cfg.Output != "" && cfg.Output != "wide" && cfg.Output != "name" {
			return usageError{fmt.Errorf("get -w: -o %s is not supported while watching (use `mqletctl watch pods -o json`)", cfg.Output)}
		}
		if err := cfg.resolve(); err != nil {
			return err
		}
		return watchPods(ctx, cfg, req, sel, e)
	}
	if err := cfg.resolve(); err != nil {
		return err
	}
	// The agent filters by the selector (only what matches is sent);
	// mqletctl applies it again for an agent older than that filter.
	if !sel.Empty() {
		req.LabelSelector = sel.String()
	}
	payload, _ := json.Marshal(req) // strings always encode
	res, err := requestGet(ctx, cfg, payload, e)
	if err != nil {
		return err
	}
	filterResult(res, sel)
	p := printer{w: e.stdout, errw: e.stderr, namespace: *ns, now: e.now, wide: cfg.Output == "wide", showNamespace: *ns == ""}
	switch cfg.Output {
	case "json", "yaml":
		return printObjects(e.stdout, cfg.Output, resultObjects(res, req.Name != ""))
	case "name":
		return printNames(e, res, *ns)
	}
	return p.printGet(res, req.Kind)
}

// filterResult keeps the objects whose labels match sel.
func filterResult(res *apiv1.GetResult, sel labels.Selector) {
	if sel.Empty() {
		return
	}
	pods := res.Pods[:0]
	for _, p := range res.Pods {
		if p != nil && sel.Matches(labels.Set(p.Labels)) {
			pods = append(pods, p)
		}
	}
	res.Pods = pods
	cms := res.ConfigMaps[:0]
	for _, c := range res.ConfigMaps {
		if c != nil && sel.Matches(labels.Set(c.Labels)) {
			cms = append(cms, c)
		}
	}
	res.ConfigMaps = cms
	secrets := res.Secrets[:0]
	for _, s := range res.Secrets {
		if s != nil && sel.Matches(labels.Set(s.Labels)) {
			secrets = append(secrets, s)
		}
	}
	res.Secrets = secrets
}

// printNames prints kind/name lines, as kubectl -o name does.
func printNames(e env, res *apiv1.GetResult, ns string) error {
	var names []string
	for _, p := range res.Pods {
		names = append(names, "pod/"+printable(p.Name))
	}
	for _, c := range res.ConfigMaps {
		names = append(names, "configmap/"+printable(c.Name))
	}
	for _, s := range res.Secrets {
		names = append(names, "secret/"+printable(s.Name))
	}
	if len(names) == 0 {
		return printer{errw: e.stderr, namespace: ns}.noResources()
	}
	for _, n := range names {
		if _, err := fmt.Fprintln(e.stdout, n); err != nil {
			return err
		}
	}
	return nil
}

// requestGet sends a get and decodes the succeeded reply's result. A
// failed reply is printed and reported.
func requestGet(ctx context.Context, cfg *globalConfig, payload []byte, e env) (*apiv1.GetResult, error) {
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	c, err := dial(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer c.close()
	return getOn(ctx, c, cfg, payload, e)
}

// getOn is requestGet on a connected client.
func getOn(ctx context.Context, c *client, cfg *globalConfig, payload []byte, e env) (*apiv1.GetResult, error) {
	var res apiv1.GetResult
	if err := getInto(ctx, c, payload, &res, e); err != nil {
		return nil, err
	}
	return &res, nil
}

// getInto sends a get on c and decodes the succeeded reply's result into
// out. A failed reply is printed and reported.
func getInto(ctx context.Context, c *client, payload []byte, out any, e env) error {
	final, result, err := getRaw(ctx, c, payload)
	if err != nil {
		return err
	}
	if final.Phase == apiv1.Failed {
		printReply(e, final)
		return errReported
	}
	if err := json.Unmarshal(result, out); err != nil {
		return fmt.Errorf("decoding the result of get %s: %w", final.RequestID, err)
	}
	return nil
}

// getRaw sends a get on c and returns its final reply and the assembled
// result (none when the reply failed).
func getRaw(ctx context.Context, c *client, payload []byte) (apiv1.Reply, []byte, error) {
	var final apiv1.Reply
	var all [][]byte // a large result comes in parts before the final reply
	if _, err := c.request(ctx, "get", payload, func(r apiv1.Reply) bool {
		final = r
		if b, err := json.Marshal(r); err == nil {
			all = append(all, b)
		}
		return false
	}); err != nil {
		return final, nil, err
	}
	if final.Phase == apiv1.Failed {
		return final, nil, nil
	}
	result, _, err := apiv1.Assemble(all)
	if err != nil {
		return final, nil, fmt.Errorf("assembling the result of get %s: %w", final.RequestID, err)
	}
	return final, result, nil
}

// objects returns the result as Kubernetes objects: the one object when a
// single name was asked for, else a v1 List.
func resultObjects(r *apiv1.GetResult, single bool) any {
	items := make([]any, 0, len(r.Pods)+len(r.ConfigMaps)+len(r.Secrets))
	for i := range r.Pods {
		items = append(items, r.Pods[i])
	}
	for i := range r.ConfigMaps {
		items = append(items, r.ConfigMaps[i])
	}
	for i := range r.Secrets {
		items = append(items, r.Secrets[i])
	}
	if single && len(items) == 1 {
		return items[0]
	}
	return map[string]any{"apiVersion": "v1", "kind": "List", "metadata": metav1.ListMeta{}, "items": items}
}
