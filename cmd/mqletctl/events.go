package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/duration"

	apiv1 "github.com/mqlet/mqlet/api/v1"
)

// parseFor reads --for TYPE/NAME (kubectl's spelling) into the object whose
// events get asks for; a pod's namespace is the -n given, else default.
func parseFor(s, namespace string) (*apiv1.ObjectRef, error) {
	if s == "" {
		return nil, nil
	}
	typ, name, ok := strings.Cut(s, "/")
	if !ok || name == "" || strings.Contains(name, "/") {
		return nil, usageError{fmt.Errorf("get events --for: want TYPE/NAME (pod/web or node/gw1), got %q", s)}
	}
	switch strings.ToLower(typ) {
	case "pod", "pods", "po":
		if namespace == "" {
			namespace = v1.NamespaceDefault
		}
		return &apiv1.ObjectRef{Kind: "Pod", Namespace: namespace, Name: name}, nil
	case "node", "nodes", "no":
		return &apiv1.ObjectRef{Kind: "Node", Name: name}, nil
	}
	return nil, usageError{fmt.Errorf("get events --for: unknown type %q (pod or node)", typ)}
}

// getEvents prints the node's kept events, oldest first, as kubectl get
// events does; -o json|yaml print them as a v1 List.
func getEvents(ctx context.Context, cfg *globalConfig, req apiv1.GetRequest, e env) error {
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
	payload, _ := json.Marshal(req) // strings always encode
	var list apiv1.EventList
	if err := getInto(ctx, c, payload, &list, e); err != nil {
		return err
	}
	events := make([]*v1.Event, 0, len(list.Events))
	for _, ev := range list.Events {
		if ev != nil {
			events = append(events, ev)
		}
	}
	switch cfg.Output {
	case "json", "yaml":
		items := make([]any, len(events))
		for i, ev := range events {
			items[i] = ev
		}
		return printObjects(e.stdout, cfg.Output, map[string]any{"apiVersion": "v1", "kind": "List", "metadata": metav1.ListMeta{}, "items": items})
	}
	p := printer{w: e.stdout, errw: e.stderr, namespace: req.Namespace, now: e.now, showNamespace: req.Namespace == ""}
	if len(events) == 0 {
		return p.noResources()
	}
	tw := tabwriter.NewWriter(p.w, 0, 8, 3, ' ', 0)
	p.row(tw, "NAMESPACE", "LAST SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE")
	for _, ev := range events {
		o := ev.InvolvedObject
		p.row(tw, printable(o.Namespace), lastSeen(ev, p.now), printable(ev.Type), printable(ev.Reason),
			printable(strings.ToLower(o.Kind)+"/"+o.Name), printable(ev.Message))
	}
	return tw.Flush()
}

// lastSeen is kubectl's LAST SEEN: the age of the latest occurrence, and
// how many over how long for a repeated event.
func lastSeen(ev *v1.Event, now func() time.Time) string {
	t := eventTime(ev)
	if t.IsZero() {
		return "<unknown>"
	}
	s := duration.HumanDuration(now().Sub(t))
	if ev.Count > 1 && !ev.FirstTimestamp.IsZero() {
		s = fmt.Sprintf("%s (x%d over %s)", s, ev.Count, duration.HumanDuration(now().Sub(ev.FirstTimestamp.Time)))
	}
	return s
}
