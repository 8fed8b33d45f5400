package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	apiv1 "github.com/mqlet/mqlet/api/v1"
)

func namespaceFlag(fs *flag.FlagSet) *string {
	ns := fs.String("n", "", "namespace (default: all for get, default for delete)")
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

func runGet(ctx context.Context, cfg *globalConfig, args []string, e env) error {
	fs := newFlagSet("get", cfg, e.stderr)
	ns := namespaceFlag(fs)
	cfg.registerOutput(fs, "json, yaml or wide (default: table)")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	if err := cfg.checkOutput("json", "yaml", "wide"); err != nil {
		return err
	}
	var req apiv1.GetRequest
	switch len(pos) {
	case 0:
		return usageError{fmt.Errorf("get: what? (pods, configmaps, secrets or all)")}
	case 1, 2:
		if strings.ToLower(pos[0]) != "all" {
			kind, ok := canonicalKind(pos[0])
			if !ok {
				return usageError{fmt.Errorf("get: unknown kind %q (pods, configmaps, secrets, all)", pos[0])}
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
	if err := cfg.resolve(); err != nil {
		return err
	}
	payload, _ := json.Marshal(req) // strings always encode
	res, err := requestGet(ctx, cfg, payload, e)
	if err != nil {
		return err
	}
	p := printer{w: e.stdout, now: e.now, wide: cfg.Output == "wide", showNamespace: *ns == ""}
	switch cfg.Output {
	case "json", "yaml":
		return printObjects(e.stdout, cfg.Output, resultObjects(res, req.Name != ""))
	}
	return p.printGet(res, req.Kind)
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
	var final apiv1.Reply
	var all [][]byte // a large result comes in parts before the final reply
	if _, err := c.request(ctx, "get", payload, func(r apiv1.Reply) bool {
		final = r
		if b, err := json.Marshal(r); err == nil {
			all = append(all, b)
		}
		return false
	}); err != nil {
		return nil, err
	}
	if final.Phase == apiv1.Failed {
		printReply(e, final)
		return nil, errReported
	}
	result, _, err := apiv1.Assemble(all)
	if err != nil {
		return nil, fmt.Errorf("assembling the result of get %s: %w", final.RequestID, err)
	}
	var res apiv1.GetResult
	if err := json.Unmarshal(result, &res); err != nil {
		return nil, fmt.Errorf("decoding the result of get %s: %w", final.RequestID, err)
	}
	return &res, nil
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
