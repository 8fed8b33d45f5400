package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"

	apiv1 "github.com/mqlet/mqlet/api/v1"
)

// watchPods is `get pods -w`: the pods' retained status topics give the
// current list at once, and every later publication is a change. It prints
// one row per message (kubectl's watch format) until Ctrl-C.
func watchPods(ctx context.Context, cfg *globalConfig, req apiv1.GetRequest, sel labels.Selector, e env) error {
	setupCtx, cancelSetup := context.WithTimeout(ctx, cfg.Timeout)
	c, err := dial(setupCtx, cfg)
	if err != nil {
		cancelSetup()
		return err
	}
	defer c.close()
	watchCtx, stop := context.WithCancel(ctx)
	defer stop()
	ns, name := req.Namespace, req.Name
	if ns == "" {
		ns = "+"
	}
	if name == "" {
		name = "+"
	}
	topics := cfg.scheme()
	inbox := make(chan message, 64)
	err = c.subscribe(watchCtx, inbox, topics.Pod(ns, name))
	cancelSetup()
	if err != nil {
		return err
	}
	p := printer{now: e.now, wide: cfg.Output == "wide", showNamespace: req.Namespace == ""}
	header := []string{"NAME", "READY", "STATUS", "RESTARTS", "AGE"}
	if p.wide {
		header = append(header, "IP")
	}
	if p.showNamespace {
		header = append([]string{"NAMESPACE"}, header...)
	}
	widths := []int{}
	for _, h := range header {
		w := 10
		switch h {
		case "NAME":
			w = 28
		case "STATUS":
			w = 18
		case "NAMESPACE":
			w = 14
		}
		widths = append(widths, w)
	}
	line := func(cells []string) string {
		var b strings.Builder
		for i, c := range cells {
			if i == len(cells)-1 {
				b.WriteString(c)
				break
			}
			fmt.Fprintf(&b, "%-*s ", widths[i], c)
		}
		return strings.TrimRight(b.String(), " ")
	}
	if cfg.Output != "name" {
		fmt.Fprintln(e.stdout, line(header))
	}
	// A republished status that shows no change (a resync, a redelivery)
	// prints nothing, as a row per message would only repeat itself.
	last := map[string]string{}
	for {
		select {
		case m := <-inbox:
			pns, pname, ok := podKey(topics.Pod("", ""), m.Topic)
			if !ok {
				continue
			}
			var cells []string
			if len(m.Payload) == 0 {
				cells = []string{pname, "-", "Deleted", "-", "-"}
				if p.wide {
					cells = append(cells, "-")
				}
			} else {
				var pod v1.Pod
				if err := json.Unmarshal(m.Payload, &pod); err != nil {
					fmt.Fprintf(e.stderr, "warning: %s: decoding pod: %v\n", m.Topic, err)
					continue
				}
				if !sel.Matches(labels.Set(pod.Labels)) {
					continue
				}
				cells = []string{pname, podReady(&pod), podStatus(&pod), p.podRestarts(&pod), p.age(pod.CreationTimestamp)}
				if p.wide {
					cells = append(cells, orNone(pod.Status.PodIP))
				}
			}
			if cfg.Output == "name" {
				fmt.Fprintf(e.stdout, "pod/%s\n", printable(pname))
				continue
			}
			if p.showNamespace {
				cells = append([]string{pns}, cells...)
			}
			for i := range cells {
				cells[i] = printable(cells[i])
			}
			row := line(cells)
			if last[m.Topic] == row {
				continue
			}
			last[m.Topic] = row
			if _, err := fmt.Fprintln(e.stdout, row); err != nil {
				return err
			}
		case <-ctx.Done():
			return nil // Ctrl-C ends a watch normally
		}
	}
}
