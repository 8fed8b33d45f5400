package main

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/duration"
	"sigs.k8s.io/yaml"

	apiv1 "github.com/mqlet/mqlet/api/v1"
)

// printObjects writes v as indented JSON or as YAML.
func printObjects(w io.Writer, format string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding output: %w", err)
	}
	if format == "yaml" {
		if b, err = yaml.JSONToYAML(b); err != nil {
			return fmt.Errorf("encoding output as YAML: %w", err)
		}
		_, err = w.Write(b)
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

// printer writes kubectl-like tables.
type printer struct {
	w             io.Writer
	now           func() time.Time
	wide          bool
	showNamespace bool
}

// printGet prints one table per kind present (or asked for).
func (p printer) printGet(res *apiv1.GetResult, kind string) error {
	sections := 0
	section := func(print func(tw *tabwriter.Writer)) error {
		if sections > 0 {
			fmt.Fprintln(p.w)
		}
		sections++
		tw := tabwriter.NewWriter(p.w, 0, 8, 3, ' ', 0)
		print(tw)
		return tw.Flush()
	}
	if (kind == "Pod" || kind == "") && (len(res.Pods) > 0 || kind == "Pod") {
		if err := section(func(tw *tabwriter.Writer) { p.podTable(tw, res.Pods) }); err != nil {
			return err
		}
	}
	if (kind == "ConfigMap" || kind == "") && (len(res.ConfigMaps) > 0 || kind == "ConfigMap") {
		if err := section(func(tw *tabwriter.Writer) { p.configMapTable(tw, res.ConfigMaps) }); err != nil {
			return err
		}
	}
	if (kind == "Secret" || kind == "") && (len(res.Secrets) > 0 || kind == "Secret") {
		if err := section(func(tw *tabwriter.Writer) { p.secretTable(tw, res.Secrets) }); err != nil {
			return err
		}
	}
	if sections == 0 {
		_, err := fmt.Fprintln(p.w, "No resources found.")
		return err
	}
	return nil
}

func (p printer) row(tw io.Writer, namespace string, cells ...string) {
	if p.showNamespace {
		cells = append([]string{namespace}, cells...)
	}
	fmt.Fprintln(tw, strings.Join(cells, "\t"))
}

func (p printer) podTable(tw io.Writer, pods []*v1.Pod) {
	sortByKey(pods, func(pod *v1.Pod) string { return pod.Namespace + "/" + pod.Name })
	header := []string{"NAME", "READY", "STATUS", "RESTARTS", "AGE"}
	if p.wide {
		header = append(header, "IP", "NODE")
	}
	p.row(tw, "NAMESPACE", header...)
	for i := range pods {
		pod := pods[i]
		cells := []string{pod.Name, podReady(pod), podStatus(pod), p.podRestarts(pod), p.age(pod.CreationTimestamp)}
		if p.wide {
			cells = append(cells, orNone(pod.Status.PodIP), orNone(pod.Spec.NodeName))
		}
		p.row(tw, pod.Namespace, cells...)
	}
}

func (p printer) configMapTable(tw io.Writer, cms []*v1.ConfigMap) {
	sortByKey(cms, func(cm *v1.ConfigMap) string { return cm.Namespace + "/" + cm.Name })
	p.row(tw, "NAMESPACE", "NAME", "DATA", "AGE")
	for _, cm := range cms {
		p.row(tw, cm.Namespace, cm.Name, fmt.Sprint(len(cm.Data)+len(cm.BinaryData)), p.age(cm.CreationTimestamp))
	}
}

func (p printer) secretTable(tw io.Writer, secrets []*v1.Secret) {
	sortByKey(secrets, func(s *v1.Secret) string { return s.Namespace + "/" + s.Name })
	p.row(tw, "NAMESPACE", "NAME", "TYPE", "DATA", "AGE")
	for _, s := range secrets {
		typ := string(s.Type)
		if typ == "" {
			typ = string(v1.SecretTypeOpaque)
		}
		p.row(tw, s.Namespace, s.Name, typ, fmt.Sprint(len(s.Data)), p.age(s.CreationTimestamp))
	}
}

func sortByKey[T any](items []T, key func(T) string) {
	sort.SliceStable(items, func(i, j int) bool { return key(items[i]) < key(items[j]) })
}

func orNone(s string) string {
	if s == "" {
		return "<none>"
	}
	return s
}

// age is kubectl's short human duration since t.
func (p printer) age(t metav1.Time) string {
	if t.IsZero() {
		return "<unknown>"
	}
	return duration.HumanDuration(p.now().Sub(t.Time))
}

// podReady is "ready/total" over the regular containers.
func podReady(pod *v1.Pod) string {
	ready := 0
	for _, cs := range pod.Status.ContainerStatuses {
		if cs.Ready {
			ready++
		}
	}
	return fmt.Sprintf("%d/%d", ready, len(pod.Spec.Containers))
}

// podRestarts sums the containers' restarts, with how long ago the last
// one happened when known ("3 (42s ago)").
func (p printer) podRestarts(pod *v1.Pod) string {
	restarts := 0
	var last time.Time
	for _, list := range [][]v1.ContainerStatus{pod.Status.InitContainerStatuses, pod.Status.ContainerStatuses} {
		for _, cs := range list {
			restarts += int(cs.RestartCount)
			if t := cs.LastTerminationState.Terminated; t != nil && t.FinishedAt.After(last) {
				last = t.FinishedAt.Time
			}
		}
	}
	if restarts > 0 && !last.IsZero() {
		return fmt.Sprintf("%d (%s ago)", restarts, duration.HumanDuration(p.now().Sub(last)))
	}
	return fmt.Sprint(restarts)
}

// podStatus is kubectl's STATUS column: the phase, or the most telling
// reason (init progress, a container's waiting reason such as
// CrashLoopBackOff, its termination reason), or Terminating.
func podStatus(pod *v1.Pod) string {
	reason := string(pod.Status.Phase)
	if pod.Status.Reason != "" {
		reason = pod.Status.Reason
	}
	if reason == "" {
		reason = "Pending"
	}
	initializing := false
	for i, cs := range pod.Status.InitContainerStatuses {
		switch {
		case cs.State.Terminated != nil && cs.State.Terminated.ExitCode == 0:
			continue
		case isSidecar(pod, cs.Name) && cs.State.Running != nil:
			continue
		case cs.State.Terminated != nil:
			if cs.State.Terminated.Reason != "" {
				reason = "Init:" + cs.State.Terminated.Reason
			} else if cs.State.Terminated.Signal != 0 {
				reason = fmt.Sprintf("Init:Signal:%d", cs.State.Terminated.Signal)
			} else {
				reason = fmt.Sprintf("Init:ExitCode:%d", cs.State.Terminated.ExitCode)
			}
		case cs.State.Waiting != nil && cs.State.Waiting.Reason != "" && cs.State.Waiting.Reason != "PodInitializing":
			reason = "Init:" + cs.State.Waiting.Reason
		default:
			reason = fmt.Sprintf("Init:%d/%d", i, len(pod.Spec.InitContainers))
		}
		initializing = true
		break
	}
	if !initializing {
		hasRunning := false
		for i := len(pod.Status.ContainerStatuses) - 1; i >= 0; i-- {
			cs := pod.Status.ContainerStatuses[i]
			switch {
			case cs.State.Waiting != nil && cs.State.Waiting.Reason != "":
				reason = cs.State.Waiting.Reason
			case cs.State.Terminated != nil && cs.State.Terminated.Reason != "":
				reason = cs.State.Terminated.Reason
			case cs.State.Terminated != nil && cs.State.Terminated.Signal != 0:
				reason = fmt.Sprintf("Signal:%d", cs.State.Terminated.Signal)
			case cs.State.Terminated != nil:
				reason = fmt.Sprintf("ExitCode:%d", cs.State.Terminated.ExitCode)
			case cs.Ready && cs.State.Running != nil:
				hasRunning = true
			}
		}
		if reason == "Completed" && hasRunning {
			reason = "Running"
		}
	}
	if pod.DeletionTimestamp != nil {
		reason = "Terminating"
	}
	return reason
}

// isSidecar reports whether the named init container restarts always
// (a sidecar), whose running state does not block initialisation.
func isSidecar(pod *v1.Pod, name string) bool {
	for _, c := range pod.Spec.InitContainers {
		if c.Name == name {
			return c.RestartPolicy != nil && *c.RestartPolicy == v1.ContainerRestartPolicyAlways
		}
	}
	return false
}
