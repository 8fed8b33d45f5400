// Package runtimeclass maps a pod's runtimeClassName to the CRI runtime
// handler that runs it, as node.k8s.io/v1 RuntimeClass objects do in a
// cluster: each class names a handler configured in the runtime, the
// overhead its sandboxes cost beside the pod's containers, and the node
// labels it needs (scheduling.nodeSelector).
//
// The classes come from the node's configuration file, not over MQTT: a
// handler exists only if the runtime's own configuration on the gateway
// defines it, which is written by whoever installs the gateway, so the
// mapping is kept beside it, and a broker login cannot point a class of
// untrusted pods at a less isolated handler.
package runtimeclass

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// Class is one RuntimeClass.
type Class struct {
	// Name is what a pod's runtimeClassName names.
	Name string
	// Handler is the CRI runtime handler (a runtime in containerd's
	// config, e.g. runc-b, kata, runsc).
	Handler string
	// Overhead is the pod's fixed overhead on this handler (the class's
	// overhead.podFixed); it is set as the pod's spec.overhead and counted
	// with its requests at admission.
	Overhead v1.ResourceList
	// NodeSelector are labels the node must have to run the class's pods
	// (the class's scheduling.nodeSelector).
	NodeSelector map[string]string
}

// Set is the node's classes by name. The zero Set knows none.
type Set map[string]Class

// New indexes classes by name; a name given twice is an error.
func New(classes []Class) (Set, error) {
	s := Set{}
	for _, c := range classes {
		if _, dup := s[c.Name]; dup {
			return nil, fmt.Errorf("runtime class %q is given twice", c.Name)
		}
		s[c.Name] = c
	}
	return s, nil
}

// Names lists the classes, sorted.
func (s Set) Names() []string { return slices.Sorted(maps.Keys(s)) }

// Handler is the runtime handler of a pod's class: "" (the runtime's
// default) for a pod that names none, an error for a class the node does
// not know.
func (s Set) Handler(pod *v1.Pod) (string, error) {
	name := pod.Spec.RuntimeClassName
	if name == nil || *name == "" {
		return "", nil
	}
	c, ok := s[*name]
	if !ok {
		return "", fmt.Errorf("RuntimeClass %q not found", *name)
	}
	return c.Handler, nil
}

// Admit does what the API server's RuntimeClass admission does to a pod:
// a class the node does not know is refused naming it; the class's
// overhead becomes the pod's spec.overhead (a pod that sets another is
// refused). It changes pod. The class's nodeSelector is checked against
// the node by Fits, at the kubelet's admission.
func (s Set) Admit(pod *v1.Pod) field.ErrorList {
	p := field.NewPath("spec")
	name := pod.Spec.RuntimeClassName
	if name == nil {
		if len(pod.Spec.Overhead) > 0 {
			return field.ErrorList{field.Forbidden(p.Child("overhead"), "is set from the pod's RuntimeClass; a pod without runtimeClassName may not set it")}
		}
		return nil
	}
	c, ok := s[*name]
	if !ok {
		known := "none are configured (runtime.classes)"
		if len(s) > 0 {
			known = "known: " + strings.Join(s.Names(), ", ")
		}
		e := field.NotFound(p.Child("runtimeClassName"), *name)
		e.Detail = fmt.Sprintf("RuntimeClass %q not found (%s)", *name, known)
		return field.ErrorList{e}
	}
	if len(pod.Spec.Overhead) > 0 && !equality.Semantic.DeepEqual(pod.Spec.Overhead, c.Overhead) {
		return field.ErrorList{field.Invalid(p.Child("overhead"), pod.Spec.Overhead,
			fmt.Sprintf("does not match the overhead of RuntimeClass %q (leave it unset)", c.Name))}
	}
	if len(c.Overhead) > 0 {
		pod.Spec.Overhead = c.Overhead.DeepCopy()
	} else {
		pod.Spec.Overhead = nil
	}
	return nil
}

// Fits says whether the node's labels match the nodeSelector of the pod's
// class ("" when they do, or the pod has no class); otherwise why not.
func (s Set) Fits(pod *v1.Pod, nodeLabels map[string]string) string {
	name := pod.Spec.RuntimeClassName
	if name == nil {
		return ""
	}
	c, ok := s[*name]
	if !ok {
		return fmt.Sprintf("RuntimeClass %q not found", *name)
	}
	if len(c.NodeSelector) == 0 || labels.SelectorFromSet(c.NodeSelector).Matches(labels.Set(nodeLabels)) {
		return ""
	}
	return fmt.Sprintf("node(s) didn't match the scheduling.nodeSelector of RuntimeClass %q", c.Name)
}
