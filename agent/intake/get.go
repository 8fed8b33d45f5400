package intake

import (
	"errors"
	"fmt"
	"sort"
	"strings"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/mqlet/mqlet/agent/manifest"
	"github.com/mqlet/mqlet/agent/validate"
	apiv1 "github.com/mqlet/mqlet/api/v1"
)

// handleGet answers with desired objects and the status of pods.
func (in *Intake) handleGet(r request) {
	id, payload := r.id, r.payload
	var args apiv1.GetRequest
	if len(strings.TrimSpace(string(payload))) > 0 {
		if err := manifest.DecodeArgs(payload, &args); err != nil {
			in.fail(id, "get", fmt.Errorf("decoding get request: %w", err))
			return
		}
	}
	if strings.EqualFold(args.Kind, "Config") || strings.EqualFold(args.Kind, apiv1.KindNode) || strings.EqualFold(args.Kind, "Nodes") {
		if err := in.scope.nodeWide("kind " + args.Kind); err != nil {
			in.fail(id, "get", err)
			return
		}
	}
	// A namespace-scoped get reads its namespace: one that names none
	// lists the scope's, one that names another is refused.
	if in.scope.namespaced() && !strings.EqualFold(args.Kind, "Config") {
		ns, err := in.scope.namespace(args.Kind, args.Namespace, args.Name)
		if err != nil {
			in.fail(id, "get", err)
			return
		}
		args.Namespace = ns
	}
	if strings.EqualFold(args.Kind, "Config") {
		in.getConfig(id, args)
		return
	}
	if strings.EqualFold(args.Kind, apiv1.KindEvent) || strings.EqualFold(args.Kind, "Events") {
		in.getEvents(id, args)
		return
	}
	if strings.EqualFold(args.Kind, apiv1.KindNode) || strings.EqualFold(args.Kind, "Nodes") {
		in.getNode(id, args)
		return
	}
	sel, err := parseSelector(args.LabelSelector)
	if err != nil {
		in.fail(id, "get", err)
		return
	}
	// Accepted by the contract, not yet honoured: refused, never ignored.
	if args.InvolvedObject != nil {
		in.fail(id, "get", errors.New(`field "involvedObject" is not supported yet by this mqlet`))
		return
	}
	switch strings.ToLower(args.Kind) {
	case "", "pod", "pods", "configmap", "configmaps", "secret", "secrets":
	default:
		in.fail(id, "get", fmt.Errorf("unknown kind %q (Pod, ConfigMap, Secret)", args.Kind))
		return
	}
	kind := strings.TrimSuffix(strings.ToLower(args.Kind), "s")
	match := func(m *metav1.ObjectMeta) bool {
		return (args.Namespace == "" || args.Namespace == m.Namespace) && (args.Name == "" || args.Name == m.Name) &&
			sel.Matches(labels.Set(m.Labels)) && in.scope.sees(m)
	}
	res := apiv1.GetResult{Pods: []*v1.Pod{}, ConfigMaps: []*v1.ConfigMap{}, Secrets: []*v1.Secret{}}
	if kind == "" || kind == "pod" {
		pods, err := in.store.ListPods()
		if err != nil {
			in.fail(id, "get", fmt.Errorf("reading pods: %w", err))
			return
		}
		desired := map[string]bool{}
		for _, p := range pods {
			desired[p.Namespace+"/"+p.Name] = true
			if !match(&p.ObjectMeta) {
				continue
			}
			if st, ok := in.status.Get(p.Namespace, p.Name); ok && st.UID == p.UID {
				p.Status = st.Status
			}
			p.Kind, p.APIVersion = "Pod", "v1"
			res.Pods = append(res.Pods, p)
		}
		// A deleted pod is there until its grace period is over, with its
		// deletion timestamp (Terminating), as the API server keeps it.
		for _, p := range in.status.Terminating() {
			if !desired[p.Namespace+"/"+p.Name] && match(&p.ObjectMeta) {
				res.Pods = append(res.Pods, p)
			}
		}
		sort.Slice(res.Pods, func(i, j int) bool {
			a, b := res.Pods[i], res.Pods[j]
			return a.Namespace < b.Namespace || (a.Namespace == b.Namespace && a.Name < b.Name)
		})
	}
	if kind == "" || kind == "configmap" {
		cms, err := in.store.ListConfigMaps()
		if err != nil {
			in.fail(id, "get", fmt.Errorf("reading configmaps: %w", err))
			return
		}
		for _, c := range cms {
			if match(&c.ObjectMeta) {
				if args.Name == "" {
					c = withoutData(c)
				}
				c.Kind, c.APIVersion = "ConfigMap", "v1"
				res.ConfigMaps = append(res.ConfigMaps, c)
			}
		}
	}
	if kind == "" || kind == "secret" {
		secrets, err := in.store.ListSecrets()
		if err != nil {
			in.fail(id, "get", fmt.Errorf("reading secrets: %w", err))
			return
		}
		for _, s := range secrets {
			if match(&s.ObjectMeta) {
				r := validate.RedactSecret(s)
				r.Kind, r.APIVersion = "Secret", "v1"
				res.Secrets = append(res.Secrets, r)
			}
		}
	}
	if args.Name != "" && len(res.Pods)+len(res.ConfigMaps)+len(res.Secrets) == 0 {
		where := args.Namespace + "/" + args.Name
		if args.Namespace == "" {
			where = args.Name + " (in any namespace)"
		}
		in.fail(id, "get", fmt.Errorf("not found: %s %s", args.Kind, where))
		return
	}
	msg := fmt.Sprintf("%d pods, %d configmaps, %d secrets", len(res.Pods), len(res.ConfigMaps), len(res.Secrets))
	if args.Name == "" && len(res.ConfigMaps) > 0 {
		msg += "; configmap data is shown one configmap at a time: get it by kind, namespace and name"
	}
	_ = in.replies.Send(apiv1.Reply{RequestID: id, Verb: "get", Phase: apiv1.Succeeded, Message: msg, Result: res})
}

// getNode answers get {"kind":"Node"}: the v1.Node last published on the
// node topic. A name other than the node's is not found; a node is not
// namespaced, and its labels are matched by labelSelector.
func (in *Intake) getNode(id string, args apiv1.GetRequest) {
	src := in.opts.Verbs.Node
	switch {
	case src == nil:
		in.fail(id, "get", errors.New("kind Node is not supported by this mqlet"))
		return
	case args.Namespace != "" || args.InvolvedObject != nil:
		in.fail(id, "get", errors.New("kind Node takes name and labelSelector, not namespace or involvedObject (a node is not namespaced)"))
		return
	}
	sel, err := parseSelector(args.LabelSelector)
	if err != nil {
		in.fail(id, "get", err)
		return
	}
	node := src.Node()
	if node == nil {
		in.fail(id, "get", errors.New("the node status is not published yet; try again in a few seconds"))
		return
	}
	res := apiv1.NodeList{Nodes: []*v1.Node{}}
	if (args.Name == "" || args.Name == node.Name) && sel.Matches(labels.Set(node.Labels)) {
		node.Kind, node.APIVersion = "Node", "v1"
		res.Nodes = append(res.Nodes, node)
	}
	if args.Name != "" && len(res.Nodes) == 0 {
		in.fail(id, "get", fmt.Errorf("not found: Node %s (this is node %s)", args.Name, node.Name))
		return
	}
	_ = in.replies.Send(apiv1.Reply{RequestID: id, Verb: "get", Phase: apiv1.Succeeded,
		Message: fmt.Sprintf("%d nodes", len(res.Nodes)), Result: res})
}

// withoutData is c as a listing shows it: every key with the size of its
// value instead of the value.
func withoutData(c *v1.ConfigMap) *v1.ConfigMap {
	out := c.DeepCopy()
	for k, v := range c.Data {
		out.Data[k] = apiv1.Omitted(len(v))
	}
	for k, v := range c.BinaryData {
		out.BinaryData[k] = []byte(apiv1.Omitted(len(v)))
	}
	// The last-applied annotation kubectl writes would carry the data too.
	delete(out.Annotations, v1.LastAppliedConfigAnnotation)
	return out
}

// maxSelectorBytes bounds a labelSelector (labels.Parse's work grows with it).
const maxSelectorBytes = 4096

// parseSelector reads a labelSelector in kubectl's syntax ("app=web,tier!=db");
// empty selects everything.
func parseSelector(s string) (labels.Selector, error) {
	if len(s) > maxSelectorBytes {
		return nil, fmt.Errorf("labelSelector: %d bytes, at most %d", len(s), maxSelectorBytes)
	}
	sel, err := labels.Parse(s)
	if err != nil {
		return nil, fmt.Errorf("labelSelector %q: %w", s, err)
	}
	return sel, nil
}
