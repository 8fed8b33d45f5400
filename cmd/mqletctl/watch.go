package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"

	apiv1 "github.com/mqlet/mqlet/api/v1"
)

func runWatch(ctx context.Context, cfg *globalConfig, args []string, e env) error {
	fs := newFlagSet("watch", cfg, e.stderr)
	count := fs.Int("count", 0, "stop after N messages (0: until Ctrl-C)")
	cfg.registerOutput(fs, "json (one message per line; default: text)")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	what := "all"
	switch len(pos) {
	case 0:
	case 1:
		what = strings.ToLower(pos[0])
	default:
		return usageError{fmt.Errorf("watch: too many arguments %q (want pods, events or all)", pos)}
	}
	if err := cfg.checkOutput("json"); err != nil {
		return err
	}
	if *count < 0 {
		return usageError{fmt.Errorf("watch: --count %d must not be negative", *count)}
	}
	if err := cfg.resolve(); err != nil {
		return err
	}
	topics := cfg.scheme()
	podFilter := topics.Pod("+", "+")
	var filters []string
	switch what {
	case "pods", "pod", "po":
		filters = []string{podFilter}
	case "events", "event", "ev":
		filters = []string{topics.Events()}
	case "all":
		filters = []string{podFilter, topics.Events(), topics.State(), topics.NodeTopic()}
	default:
		return usageError{fmt.Errorf("watch: unknown target %q (pods, events or all)", what)}
	}

	// --timeout bounds connecting and subscribing; the watch itself runs
	// until Ctrl-C or --count.
	setupCtx, cancelSetup := context.WithTimeout(ctx, cfg.Timeout)
	c, err := dial(setupCtx, cfg)
	if err != nil {
		cancelSetup()
		return err
	}
	defer c.close()
	watchCtx, stop := context.WithCancel(ctx)
	defer stop()
	inbox := make(chan message, 64)
	err = c.subscribe(watchCtx, inbox, filters...)
	cancelSetup()
	if err != nil {
		return err
	}
	w := watchPrinter{e: e, cfg: cfg, p: printer{w: e.stdout, now: e.now}}
	for seen := 0; *count == 0 || seen < *count; seen++ {
		select {
		case m := <-inbox:
			if err := w.print(m); err != nil {
				return err
			}
		case <-ctx.Done():
			return nil // Ctrl-C ends a watch normally
		}
	}
	return nil
}

// watchPrinter writes one line per message.
type watchPrinter struct {
	e   env
	cfg *globalConfig
	p   printer
}

func (w watchPrinter) print(m message) error {
	if w.cfg.Output == "json" {
		payload := json.RawMessage("null")
		if len(m.Payload) > 0 && json.Valid(m.Payload) {
			payload = m.Payload
		}
		return printJSONLine(w.e.stdout, struct {
			Topic    string          `json:"topic"`
			Retained bool            `json:"retained"`
			Payload  json.RawMessage `json:"payload"`
		}{m.Topic, m.Retained, payload})
	}
	line, err := w.describe(m)
	if err != nil {
		// One bad message must not end a watch; say so and go on.
		fmt.Fprintf(w.e.stderr, "warning: %s: %v\n", m.Topic, err)
		return nil
	}
	_, err = fmt.Fprintln(w.e.stdout, line)
	return err
}

// describe turns one message into a line of text.
func (w watchPrinter) describe(m message) (string, error) {
	topics := w.cfg.scheme()
	switch {
	case m.Topic == topics.State():
		if len(m.Payload) == 0 {
			return "state   <cleared>", nil
		}
		var s apiv1.NodeState
		if err := json.Unmarshal(m.Payload, &s); err != nil {
			return "", fmt.Errorf("decoding state: %w", err)
		}
		return fmt.Sprintf("state   %s seq=%d bootId=%s version=%s", s.State, s.Seq, s.BootID, s.Version), nil
	case m.Topic == topics.NodeTopic():
		if len(m.Payload) == 0 {
			return "node    <cleared>", nil
		}
		var n v1.Node
		if err := json.Unmarshal(m.Payload, &n); err != nil {
			return "", fmt.Errorf("decoding node: %w", err)
		}
		return fmt.Sprintf("node    %s Ready=%s", n.Name, readyCondition(&n)), nil
	case m.Topic == topics.Events():
		var ev v1.Event
		if err := json.Unmarshal(m.Payload, &ev); err != nil {
			return "", fmt.Errorf("decoding event: %w", err)
		}
		return describeEvent(&ev), nil
	default:
		ns, name, ok := podKey(topics.Pod("", ""), m.Topic)
		if !ok {
			return "", fmt.Errorf("unexpected topic")
		}
		if len(m.Payload) == 0 {
			return fmt.Sprintf("pod     %s/%s deleted", ns, name), nil
		}
		var pod v1.Pod
		if err := json.Unmarshal(m.Payload, &pod); err != nil {
			return "", fmt.Errorf("decoding pod: %w", err)
		}
		return fmt.Sprintf("pod     %s/%s %s %s restarts=%s age=%s", ns, name, podReady(&pod), podStatus(&pod), w.p.podRestarts(&pod), w.p.age(pod.CreationTimestamp)), nil
	}
}

// podKey splits <base>/pods/<ns>/<name>, base given as Pod("","") = ".../pods//".
func podKey(emptyPodTopic, t string) (ns, name string, ok bool) {
	base := strings.TrimSuffix(emptyPodTopic, "/")
	rest, ok := strings.CutPrefix(t, base)
	if !ok {
		return "", "", false
	}
	ns, name, ok = strings.Cut(rest, "/")
	return ns, name, ok && ns != "" && name != "" && !strings.Contains(name, "/")
}

func describeEvent(ev *v1.Event) string {
	when := ev.LastTimestamp.Time
	if when.IsZero() {
		when = ev.EventTime.Time
	}
	ts := "-"
	if !when.IsZero() {
		ts = when.UTC().Format(time.RFC3339)
	}
	obj := ev.InvolvedObject.Kind + "/"
	if ev.InvolvedObject.Namespace != "" {
		obj += ev.InvolvedObject.Namespace + "/"
	}
	obj += ev.InvolvedObject.Name
	line := fmt.Sprintf("event   %s %s %s %s: %s", ts, ev.Type, ev.Reason, obj, ev.Message)
	if ev.Count > 1 {
		line += fmt.Sprintf(" (x%d)", ev.Count)
	}
	return line
}
