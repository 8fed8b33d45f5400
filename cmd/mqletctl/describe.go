package main

import (
	"context"
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

	apiv1 "github.com/mqlet/mqlet/api/v1"
)

// runDescribe is `describe pod NAME`: the pod from a get (asked again after
// listening, for its current status), and its events.
//
// The events are the pod's in the node's event history (get
// {"kind":"Event"}), asked for after listening, joined with those published
// on the events topic while describe runs: it subscribes before the first
// get and listens for --retained-wait in all. The listened ones stand in
// for an agent that keeps no history (events.history 0, or an older
// mqlet), and the output says when that is all there is.
func runDescribe(ctx context.Context, cfg *globalConfig, args []string, e env) error {
	fs := newFlagSet("describe", cfg)
	ns := namespaceFlag(fs, nsDefault)
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 2 {
		return usageError{fmt.Errorf("describe: want `describe pod NAME`")}
	}
	if kind, ok := canonicalKind(pos[0]); !ok || kind != apiv1.KindPod {
		return usageError{fmt.Errorf("describe: only pods can be described, not %q", pos[0])}
	}
	namespace := *ns
	if namespace == "" {
		namespace = "default"
	}
	if err := cfg.resolve(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	listen := time.Now()
	c, err := dial(ctx, cfg)
	if err != nil {
		return err
	}
	defer c.close()
	evCtx, stopEvents := context.WithCancel(ctx)
	defer stopEvents()
	inbox := make(chan message, 256)
	if err := c.subscribe(evCtx, inbox, cfg.scheme().Events()); err != nil {
		return err
	}
	payload, _ := json.Marshal(apiv1.GetRequest{Kind: apiv1.KindPod, Namespace: namespace, Name: pos[1]}) // strings always encode
	res, err := getOn(ctx, c, cfg, payload, e)
	if err != nil {
		return err
	}
	if len(res.Pods) == 0 || res.Pods[0] == nil {
		fmt.Fprintf(e.stderr, "Error from server (NotFound): pods %q not found in namespace %s\n", pos[1], namespace)
		return errReported
	}
	pod := res.Pods[0]
	var events []v1.Event
	seen := map[string]int{}
	wait := time.NewTimer(time.Until(listen.Add(cfg.RetainedWait)))
	defer wait.Stop()
collect:
	for {
		select {
		case m := <-inbox:
			var ev v1.Event
			if json.Unmarshal(m.Payload, &ev) != nil {
				continue
			}
			if !ofPod(&ev, pod) {
				continue
			}
			// A repeated event is the same Event object again with a higher
			// count: keep one row per object, the latest.
			if i, ok := seen[ev.Name]; ok && ev.Name != "" {
				events[i] = ev
				continue
			}
			seen[ev.Name] = len(events)
			events = append(events, ev)
		case <-wait.C:
			break collect
		case <-ctx.Done():
			break collect
		}
	}
	listened := time.Since(listen).Round(100 * time.Millisecond)
	// The pod may have moved on while describe listened: show it as it is
	// now, next to the events that brought it there.
	if ctx.Err() == nil {
		if res, err := getOn(ctx, c, cfg, payload, e); err == nil && len(res.Pods) > 0 && res.Pods[0] != nil {
			pod = res.Pods[0]
		}
	}
	note := ""
	history, why := podEventHistory(ctx, c, pod)
	if why != "" {
		note = fmt.Sprintf("(only those seen on the events topic in the %v describe listened: %s)", listened, why)
	}
	return describePod(e.stdout, pod, mergeEvents(history, events), note, e.now)
}

// ofPod says whether ev is about pod: its kind, namespace and name, and
// its uid when both have one (an earlier pod of that name is another).
func ofPod(ev *v1.Event, pod *v1.Pod) bool {
	o := ev.InvolvedObject
	if o.Kind != "Pod" || o.Namespace != pod.Namespace || o.Name != pod.Name {
		return false
	}
	return o.UID == "" || pod.UID == "" || o.UID == pod.UID
}

// podEventHistory asks the agent for the pod's kept events; why says, when
// it cannot have them, what the agent or the broker answered.
func podEventHistory(ctx context.Context, c *client, pod *v1.Pod) (events []v1.Event, why string) {
	if ctx.Err() != nil {
		return nil, "out of time before asking for the event history"
	}
	payload, _ := json.Marshal(apiv1.GetRequest{Kind: apiv1.KindEvent, Namespace: pod.Namespace, // strings always encode
		InvolvedObject: &apiv1.ObjectRef{Kind: apiv1.KindPod, Namespace: pod.Namespace, Name: pod.Name}})
	final, result, err := getRaw(ctx, c, payload)
	switch {
	case err != nil:
		return nil, "asking for the event history: " + err.Error()
	case final.Phase == apiv1.Failed:
		return nil, "the agent has no event history to give: " + final.Message
	}
	var list apiv1.EventList
	if err := json.Unmarshal(result, &list); err != nil {
		return nil, "decoding the event history: " + err.Error()
	}
	for _, ev := range list.Events {
		if ev != nil && ofPod(ev, pod) {
			events = append(events, *ev)
		}
	}
	return events, ""
}

// mergeEvents joins the history with the events listened to: one row per
// Event object (a repeat is the same object with a higher count), the
// latest occurrence of it.
func mergeEvents(history, listened []v1.Event) []v1.Event {
	out := make([]v1.Event, 0, len(history)+len(listened))
	at := map[string]int{}
	for _, ev := range append(append([]v1.Event(nil), history...), listened...) {
		if ev.Name == "" {
			out = append(out, ev)
			continue
		}
		key := ev.Namespace + "/" + ev.Name
		i, ok := at[key]
		if !ok {
			at[key] = len(out)
			out = append(out, ev)
			continue
		}
		if ev.Count > out[i].Count || (ev.Count == out[i].Count && eventTime(&ev).After(eventTime(&out[i]))) {
			out[i] = ev
		}
	}
	return out
}

// describeWriter writes kubectl describe's indented "Key:  value" layout.
type describeWriter struct {
	tw *tabwriter.Writer
}

func (d describeWriter) line(indent int, key, format string, args ...any) {
	v := printable(fmt.Sprintf(format, args...))
	prefix := strings.Repeat("  ", indent)
	if key == "" {
		fmt.Fprintf(d.tw, "%s%s\n", prefix, v)
		return
	}
	if v == "" {
		fmt.Fprintf(d.tw, "%s%s:\n", prefix, printable(key))
		return
	}
	fmt.Fprintf(d.tw, "%s%s:\t%s\n", prefix, printable(key), v)
}

// row writes cells separated for alignment, without a colon (tables
// inside describe, like Conditions).
func (d describeWriter) row(indent int, cells ...string) {
	for i := range cells {
		cells[i] = printable(cells[i])
	}
	fmt.Fprintf(d.tw, "%s%s\n", strings.Repeat("  ", indent), strings.Join(cells, "\t"))
}

func describePod(w io.Writer, pod *v1.Pod, events []v1.Event, note string, now func() time.Time) error {
	d := describeWriter{tw: tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)}
	d.line(0, "Name", "%s", pod.Name)
	d.line(0, "Namespace", "%s", pod.Namespace)
	d.line(0, "Priority", "%d", derefInt32(pod.Spec.Priority))
	d.line(0, "Node", "%s", orNone(pod.Spec.NodeName))
	if pod.Status.StartTime != nil {
		d.line(0, "Start Time", "%s", pod.Status.StartTime.UTC().Format(time.RFC1123Z))
	}
	d.line(0, "Labels", "%s", mapList(pod.Labels))
	d.line(0, "Annotations", "%s", mapList(pod.Annotations))
	status := string(pod.Status.Phase)
	if pod.DeletionTimestamp != nil {
		status = "Terminating (lasts " + duration.HumanDuration(now().Sub(pod.DeletionTimestamp.Time)) + ")"
	}
	d.line(0, "Status", "%s", orNone(status))
	if pod.Status.Reason != "" {
		d.line(0, "Reason", "%s", pod.Status.Reason)
	}
	if pod.Status.Message != "" {
		d.line(0, "Message", "%s", pod.Status.Message)
	}
	d.line(0, "IP", "%s", pod.Status.PodIP)
	if pod.Spec.HostNetwork {
		d.line(0, "Host Network", "true")
	}
	if len(pod.Spec.InitContainers) > 0 {
		d.line(0, "Init Containers", "")
		describeContainers(d, pod.Spec.InitContainers, pod.Status.InitContainerStatuses, now)
	}
	d.line(0, "Containers", "")
	describeContainers(d, pod.Spec.Containers, pod.Status.ContainerStatuses, now)
	d.line(0, "Conditions", "")
	if len(pod.Status.Conditions) == 0 {
		d.line(1, "", "<none>")
	} else {
		d.row(1, "Type", "Status")
		for _, c := range pod.Status.Conditions {
			d.row(1, string(c.Type), string(c.Status))
		}
	}
	d.line(0, "Volumes", "")
	if len(pod.Spec.Volumes) == 0 {
		d.line(1, "", "<none>")
	}
	for _, v := range pod.Spec.Volumes {
		d.line(1, v.Name, "")
		describeVolume(d, v)
	}
	d.line(0, "QoS Class", "%s", orNone(string(pod.Status.QOSClass)))
	d.line(0, "Restart Policy", "%s", orNone(string(pod.Spec.RestartPolicy)))
	d.line(0, "Node-Selectors", "%s", mapList(pod.Spec.NodeSelector))
	if err := d.tw.Flush(); err != nil {
		return err
	}
	return describeEvents(w, events, note, now)
}

func describeContainers(d describeWriter, specs []v1.Container, statuses []v1.ContainerStatus, now func() time.Time) {
	byName := map[string]v1.ContainerStatus{}
	for _, s := range statuses {
		byName[s.Name] = s
	}
	for _, c := range specs {
		st, known := byName[c.Name]
		d.line(1, c.Name, "")
		if known && st.ContainerID != "" {
			d.line(2, "Container ID", "%s", st.ContainerID)
		}
		d.line(2, "Image", "%s", c.Image)
		if known && st.ImageID != "" {
			d.line(2, "Image ID", "%s", st.ImageID)
		}
		for _, p := range c.Ports {
			proto := p.Protocol
			if proto == "" {
				proto = v1.ProtocolTCP
			}
			d.line(2, "Port", "%d/%s", p.ContainerPort, proto)
			if p.HostPort != 0 {
				d.line(2, "Host Port", "%d/%s", p.HostPort, proto)
			}
		}
		if len(c.Command) > 0 {
			d.line(2, "Command", "")
			for _, a := range c.Command {
				d.line(3, "", "%s", a)
			}
		}
		if len(c.Args) > 0 {
			d.line(2, "Args", "")
			for _, a := range c.Args {
				d.line(3, "", "%s", a)
			}
		}
		if known {
			describeState(d, "State", st.State, now)
			if st.LastTerminationState.Terminated != nil || st.LastTerminationState.Waiting != nil || st.LastTerminationState.Running != nil {
				describeState(d, "Last State", st.LastTerminationState, now)
			}
			d.line(2, "Ready", "%s", boolWord(st.Ready))
			d.line(2, "Restart Count", "%d", st.RestartCount)
		} else {
			d.line(2, "State", "Waiting (no status yet)")
		}
		if len(c.Resources.Limits) > 0 {
			d.line(2, "Limits", "%s", resourceList(c.Resources.Limits))
		}
		if len(c.Resources.Requests) > 0 {
			d.line(2, "Requests", "%s", resourceList(c.Resources.Requests))
		}
		if c.LivenessProbe != nil {
			d.line(2, "Liveness", "%s", describeProbe(c.LivenessProbe))
		}
		if c.ReadinessProbe != nil {
			d.line(2, "Readiness", "%s", describeProbe(c.ReadinessProbe))
		}
		if c.StartupProbe != nil {
			d.line(2, "Startup", "%s", describeProbe(c.StartupProbe))
		}
		if len(c.Env) == 0 && len(c.EnvFrom) == 0 {
			d.line(2, "Environment", "<none>")
		} else {
			d.line(2, "Environment", "")
			for _, ev := range c.Env {
				d.line(3, ev.Name, "%s", envSource(ev))
			}
			for _, from := range c.EnvFrom {
				switch {
				case from.ConfigMapRef != nil:
					d.line(3, "", "ConfigMap %s (prefix %q)", from.ConfigMapRef.Name, from.Prefix)
				case from.SecretRef != nil:
					d.line(3, "", "Secret %s (prefix %q)", from.SecretRef.Name, from.Prefix)
				}
			}
		}
		if len(c.VolumeMounts) == 0 {
			d.line(2, "Mounts", "<none>")
		} else {
			d.line(2, "Mounts", "")
			for _, m := range c.VolumeMounts {
				mode := "rw"
				if m.ReadOnly {
					mode = "ro"
				}
				sub := ""
				if m.SubPath != "" {
					sub = ", path = \"" + m.SubPath + "\""
				}
				d.line(3, "", "%s from %s (%s%s)", m.MountPath, m.Name, mode, sub)
			}
		}
	}
}

func describeState(d describeWriter, key string, s v1.ContainerState, now func() time.Time) {
	when := func(t metav1.Time) string {
		if t.IsZero() {
			return "<unknown>"
		}
		return fmt.Sprintf("%s (%s ago)", t.UTC().Format(time.RFC1123Z), duration.HumanDuration(now().Sub(t.Time)))
	}
	switch {
	case s.Running != nil:
		d.line(2, key, "Running")
		d.line(3, "Started", "%s", when(s.Running.StartedAt))
	case s.Terminated != nil:
		d.line(2, key, "Terminated")
		if s.Terminated.Reason != "" {
			d.line(3, "Reason", "%s", s.Terminated.Reason)
		}
		if s.Terminated.Message != "" {
			d.line(3, "Message", "%s", s.Terminated.Message)
		}
		d.line(3, "Exit Code", "%d", s.Terminated.ExitCode)
		if s.Terminated.Signal != 0 {
			d.line(3, "Signal", "%d", s.Terminated.Signal)
		}
		d.line(3, "Started", "%s", when(s.Terminated.StartedAt))
		d.line(3, "Finished", "%s", when(s.Terminated.FinishedAt))
	case s.Waiting != nil:
		d.line(2, key, "Waiting")
		if s.Waiting.Reason != "" {
			d.line(3, "Reason", "%s", s.Waiting.Reason)
		}
		if s.Waiting.Message != "" {
			d.line(3, "Message", "%s", s.Waiting.Message)
		}
	default:
		d.line(2, key, "Waiting")
	}
}

// describeProbe is kubectl's one-line probe summary.
func describeProbe(p *v1.Probe) string {
	var action string
	switch {
	case p.Exec != nil:
		action = fmt.Sprintf("exec %v", p.Exec.Command)
	case p.HTTPGet != nil:
		scheme := strings.ToLower(string(p.HTTPGet.Scheme))
		if scheme == "" {
			scheme = "http"
		}
		action = fmt.Sprintf("http-get %s://%s:%s%s", scheme, p.HTTPGet.Host, p.HTTPGet.Port.String(), p.HTTPGet.Path)
	case p.TCPSocket != nil:
		action = fmt.Sprintf("tcp-socket %s:%s", p.TCPSocket.Host, p.TCPSocket.Port.String())
	case p.GRPC != nil:
		action = fmt.Sprintf("grpc <pod>:%d", p.GRPC.Port)
	default:
		action = "unknown"
	}
	orDefault := func(v, def int32) int32 {
		if v == 0 {
			return def
		}
		return v
	}
	return fmt.Sprintf("%s delay=%ds timeout=%ds period=%ds #success=%d #failure=%d", action,
		p.InitialDelaySeconds, orDefault(p.TimeoutSeconds, 1), orDefault(p.PeriodSeconds, 10),
		orDefault(p.SuccessThreshold, 1), orDefault(p.FailureThreshold, 3))
}

// envSource shows a literal value, or where a value comes from (never the
// value of a secret, which the pod spec does not hold anyway).
func envSource(ev v1.EnvVar) string {
	f := ev.ValueFrom
	switch {
	case f == nil:
		return ev.Value
	case f.SecretKeyRef != nil:
		return fmt.Sprintf("<set to the key '%s' in secret '%s'>", f.SecretKeyRef.Key, f.SecretKeyRef.Name)
	case f.ConfigMapKeyRef != nil:
		return fmt.Sprintf("<set to the key '%s' of config map '%s'>", f.ConfigMapKeyRef.Key, f.ConfigMapKeyRef.Name)
	case f.FieldRef != nil:
		return fmt.Sprintf("(%s:%s)", f.FieldRef.APIVersion, f.FieldRef.FieldPath)
	case f.ResourceFieldRef != nil:
		return fmt.Sprintf("%s (%s)", f.ResourceFieldRef.Resource, f.ResourceFieldRef.ContainerName)
	}
	return ""
}

func describeVolume(d describeWriter, v v1.Volume) {
	s := v.VolumeSource
	switch {
	case s.EmptyDir != nil:
		d.line(2, "Type", "EmptyDir (a temporary directory that shares a pod's lifetime)")
		d.line(2, "Medium", "%s", orNone(string(s.EmptyDir.Medium)))
		if s.EmptyDir.SizeLimit != nil {
			d.line(2, "SizeLimit", "%s", s.EmptyDir.SizeLimit.String())
		}
	case s.HostPath != nil:
		d.line(2, "Type", "HostPath (bare host directory volume)")
		d.line(2, "Path", "%s", s.HostPath.Path)
	case s.ConfigMap != nil:
		d.line(2, "Type", "ConfigMap (a volume populated by a ConfigMap)")
		d.line(2, "Name", "%s", s.ConfigMap.Name)
		d.line(2, "Optional", "%v", s.ConfigMap.Optional != nil && *s.ConfigMap.Optional)
	case s.Secret != nil:
		d.line(2, "Type", "Secret (a volume populated by a Secret)")
		d.line(2, "SecretName", "%s", s.Secret.SecretName)
		d.line(2, "Optional", "%v", s.Secret.Optional != nil && *s.Secret.Optional)
	case s.Projected != nil:
		d.line(2, "Type", "Projected (a volume that contains injected data from multiple sources)")
	case s.DownwardAPI != nil:
		d.line(2, "Type", "DownwardAPI (a volume populated by information about the pod)")
	default:
		d.line(2, "Type", "<unknown>")
	}
}

// describeEvents prints the events table; note, when not empty, says where
// the events come from (when that is not the node's history).
func describeEvents(w io.Writer, events []v1.Event, note string, now func() time.Time) error {
	if note != "" {
		note = " " + printable(note)
	}
	if len(events) == 0 {
		_, err := fmt.Fprintf(w, "Events:  <none>%s\n", note)
		return err
	}
	sort.SliceStable(events, func(i, j int) bool { return eventTime(&events[i]).Before(eventTime(&events[j])) })
	fmt.Fprintf(w, "Events:%s\n", note)
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "  Type\tReason\tAge\tFrom\tMessage")
	fmt.Fprintln(tw, "  ----\t------\t----\t----\t-------")
	for i := range events {
		ev := &events[i]
		age := "<unknown>"
		if t := eventTime(ev); !t.IsZero() {
			age = duration.HumanDuration(now().Sub(t))
			if ev.Count > 1 && !ev.FirstTimestamp.IsZero() {
				age = fmt.Sprintf("%s (x%d over %s)", age, ev.Count, duration.HumanDuration(now().Sub(ev.FirstTimestamp.Time)))
			}
		}
		from := ev.Source.Component
		if from == "" {
			from = ev.ReportingController
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\n", printable(ev.Type), printable(ev.Reason), age, printable(orNone(from)), printable(ev.Message))
	}
	return tw.Flush()
}

func eventTime(ev *v1.Event) time.Time {
	if !ev.LastTimestamp.IsZero() {
		return ev.LastTimestamp.Time
	}
	return ev.EventTime.Time
}

// mapList prints labels kubectl's way: one k=v per line after the first,
// here comma-separated on one line to keep the layout flat.
func mapList(m map[string]string) string {
	if len(m) == 0 {
		return "<none>"
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, k+"="+m[k])
	}
	return strings.Join(parts, ", ")
}

func boolWord(b bool) string {
	if b {
		return "True"
	}
	return "False"
}

func derefInt32(p *int32) int32 {
	if p == nil {
		return 0
	}
	return *p
}
