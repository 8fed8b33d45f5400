package intake

import (
	"fmt"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	apiruntime "k8s.io/apimachinery/pkg/runtime"
	resourcehelper "k8s.io/component-helpers/resource"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"

	"github.com/mqlet/mqlet/agent/store"
)

// Reasons of the kubelet's pod admission, in its spelling (with ReasonOutOfPods).
const (
	ReasonNodeAffinity = "NodeAffinity"
	ReasonOutOfCPU     = "OutOf" + string(v1.ResourceCPU)
	ReasonOutOfMemory  = "OutOf" + string(v1.ResourceMemory)
)

// msgNodeAffinity is the kubelet's message for a pod its node does not match.
const msgNodeAffinity = "Predicate NodeAffinity failed: node(s) didn't match Pod's node affinity/selector"

// admitResources are the resources whose requests are checked against allocatable.
var admitResources = []v1.ResourceName{v1.ResourceCPU, v1.ResourceMemory, v1.ResourceEphemeralStorage}

// PressureAdmitter refuses pods while the node is under pressure: ok, or
// the kubelet's reason ("Evicted") and message ("The node had condition:
// [DiskPressure]. ").
type PressureAdmitter interface {
	Admit(pod *v1.Pod) (ok bool, reason, message string)
}

// checkAdmission refuses a command with a pod the kubelet would not admit:
// one whose nodeSelector or required node affinity the node's labels do
// not match (NodeAffinity), a new pod while the node is under pressure
// (Evicted: "The node had condition: [DiskPressure]. "), or one whose cpu,
// memory or ephemeral-storage requests exceed what the node's allocatable
// leaves beside the pods it already runs (OutOfcpu, OutOfmemory,
// OutOfephemeral-storage). The kubelet fails such a pod after the API server stored
// it; here nothing is stored, so the reply fails naming the reason and the
// pod gets the kubelet's Warning event. Pods are admitted in order, each
// counting those before it.
func (in *Intake) checkAdmission(id string, objs []apiruntime.Object, replaceAll bool) error {
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: in.opts.Topics.Node, Labels: in.nodeLabels()}}
	named := map[string]bool{}
	var pods []*v1.Pod
	for _, o := range objs {
		if p, ok := o.(*v1.Pod); ok {
			pods = append(pods, p)
			named[store.Key(p.Namespace, p.Name)] = true
		}
	}
	if len(pods) == 0 {
		return nil
	}
	used, err := in.requestedByOthers(named, replaceAll)
	if err != nil {
		return err
	}
	var running map[string]bool
	if in.opts.Pressure != nil {
		running = in.runningPods()
	}
	var problems []string
	refuse := func(p *v1.Pod, reason, msg string) {
		in.events.Event(p, v1.EventTypeWarning, reason, msg)
		problems = append(problems, fmt.Sprintf("%s: Pod %s/%s: %s", reason, p.Namespace, p.Name, msg))
	}
	for _, p := range pods {
		if ok, err := nodeaffinity.GetRequiredNodeAffinity(p).Match(node); err != nil || !ok {
			msg := msgNodeAffinity
			if err != nil {
				msg += ": " + err.Error()
			}
			refuse(p, ReasonNodeAffinity, msg)
			continue
		}
		if why := in.opts.RuntimeClasses.Fits(p, node.Labels); why != "" {
			refuse(p, ReasonNodeAffinity, "Predicate NodeAffinity failed: "+why)
			continue
		}
		if pr := in.opts.Pressure; pr != nil && !running[store.Key(p.Namespace, p.Name)] {
			if ok, reason, msg := pr.Admit(p); !ok {
				refuse(p, reason, msg)
				continue
			}
		}
		req := resourcehelper.PodRequests(p, resourcehelper.PodResourcesOptions{})
		fits := true
		for _, name := range admitResources {
			r, alloc := req[name], in.opts.Allocatable[name]
			if r.IsZero() || alloc.IsZero() {
				continue // requests nothing of it, or the node's amount is not known
			}
			u := used[name]
			free := alloc.DeepCopy()
			free.Sub(u)
			if r.Cmp(free) > 0 {
				fits = false
				refuse(p, "OutOf"+string(name), fmt.Sprintf("Node didn't have enough resource: %s, requested: %d, used: %d, capacity: %d",
					name, amount(name, r), amount(name, u), amount(name, alloc)))
			}
		}
		if fits {
			addRequests(used, req)
		}
	}
	switch len(problems) {
	case 0:
		return nil
	case 1:
		return fmt.Errorf("%s; nothing applied", problems[0])
	}
	in.nodeEvent(v1.EventTypeWarning, "FailedAdmission", fmt.Sprintf("request %s: %d pods not admitted: %s", id, len(problems), summarize(problems)))
	return fmt.Errorf("%d pods not admitted, nothing applied: %s", len(problems), strings.Join(problems, "; "))
}

// requestedByOthers sums the cpu and memory requests of the stored pods the
// command leaves in place (a sync leaves none), except those that have
// finished, as the kubelet counts only pods that are not terminal.
func (in *Intake) requestedByOthers(named map[string]bool, replaceAll bool) (v1.ResourceList, error) {
	used := v1.ResourceList{}
	if replaceAll {
		return used, nil
	}
	stored, err := in.store.ListPods()
	if err != nil {
		return nil, fmt.Errorf("reading stored pods to admit new ones: %w", err)
	}
	for _, p := range stored {
		if named[store.Key(p.Namespace, p.Name)] {
			continue
		}
		if st, ok := in.status.Get(p.Namespace, p.Name); ok && st != nil &&
			(st.Status.Phase == v1.PodSucceeded || st.Status.Phase == v1.PodFailed) {
			continue
		}
		addRequests(used, resourcehelper.PodRequests(p, resourcehelper.PodResourcesOptions{}))
	}
	return used, nil
}

// runningPods are the keys of the stored pods not finished: applying
// one again (unchanged, or a changed spec) is not a new pod coming onto
// the node, and is not refused for pressure.
func (in *Intake) runningPods() map[string]bool {
	stored, err := in.store.ListPods()
	if err != nil {
		return nil // every pod counts as new
	}
	out := make(map[string]bool, len(stored))
	for _, p := range stored {
		if st, ok := in.status.Get(p.Namespace, p.Name); ok && st != nil && st.UID == p.UID &&
			(st.Status.Phase == v1.PodSucceeded || st.Status.Phase == v1.PodFailed) {
			continue
		}
		out[store.Key(p.Namespace, p.Name)] = true
	}
	return out
}

func addRequests(sum, req v1.ResourceList) {
	for _, name := range admitResources {
		if r, ok := req[name]; ok {
			total := sum[name]
			total.Add(r)
			sum[name] = total
		}
	}
}

// amount is how the kubelet prints a quantity: millicores for cpu, bytes otherwise.
func amount(name v1.ResourceName, q resource.Quantity) int64 {
	if name == v1.ResourceCPU {
		return q.MilliValue()
	}
	return q.Value()
}

// nodeLabels are the node's labels now: the well-known ones, and the
// configured ones and its groups' (which change live).
func (in *Intake) nodeLabels() map[string]string {
	if in.opts.LiveLabels == nil {
		return in.opts.NodeLabels
	}
	groups := in.opts.LiveLabels()
	out := make(map[string]string, len(in.opts.NodeLabels)+len(groups))
	for k, v := range in.opts.NodeLabels {
		out[k] = v
	}
	for k, v := range groups {
		out[k] = v
	}
	return out
}
