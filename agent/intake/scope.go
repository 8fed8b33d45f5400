package intake

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	apiruntime "k8s.io/apimachinery/pkg/runtime"

	"github.com/mqlet/mqlet/agent/store"
	apiv1 "github.com/mqlet/mqlet/api/v1"
)

// A command's scope is what it may touch: the topic it came on says whose
// command it is (the node's or a group's) and, on a namespace topic, the
// one namespace its objects must be in; a signing key scoped to namespaces
// narrows it further. Every verb asks the scope before it reads or writes
// an object, so an ACL on the topics (or a key's scope) is namespace RBAC.

// cmdScope is the scope of the command being handled.
type cmdScope struct {
	apiv1.Scope
	// keyNamespaces are the namespaces of the signing key; nil: any.
	keyNamespaces []string
}

// namespaced reports whether the command is limited to namespaces.
func (s cmdScope) namespaced() bool { return s.Namespace != "" || s.keyNamespaces != nil }

// defaultNamespace is the namespace of an object or a target that names
// none: the scope's, the key's only one, else "default".
func (s cmdScope) defaultNamespace() string {
	switch {
	case s.Namespace != "":
		return s.Namespace
	case len(s.keyNamespaces) == 1:
		return s.keyNamespaces[0]
	}
	return v1.NamespaceDefault
}

// allows reports whether namespace ns is within the scope.
func (s cmdScope) allows(ns string) bool {
	if s.Namespace != "" && ns != s.Namespace {
		return false
	}
	return s.keyNamespaces == nil || slices.Contains(s.keyNamespaces, ns)
}

// describe names the scope in refusals.
func (s cmdScope) describe() string {
	d := s.Scope.String()
	if s.keyNamespaces != nil {
		d += "; signing key limited to namespaces " + strings.Join(s.keyNamespaces, ", ")
	}
	return d
}

// outside is the refusal of an object outside the scope.
func (s cmdScope) outside(kind, ns, name string) error {
	return fmt.Errorf("%s %s/%s is outside this command's scope (%s)", kind, ns, name, s.describe())
}

// nodeWide refuses what only a node-wide command may do (settings, the
// node object) in a namespace scope.
func (s cmdScope) nodeWide(what string) error {
	if !s.namespaced() {
		return nil
	}
	return fmt.Errorf("%s is node-wide: not allowed in this command's scope (%s)", what, s.describe())
}

// sees reports whether a stored object is visible to the scope: in its
// namespaces and, for a group's command, of that group's source.
func (s cmdScope) sees(m *metav1.ObjectMeta) bool {
	if !s.allows(m.Namespace) {
		return false
	}
	return s.Group == "" || store.SourceOf(m) == s.Source()
}

// namespace is the namespace a verb's target lives in: given, or the
// scope's default; a namespace outside the scope is refused.
func (s cmdScope) namespace(kind, ns, name string) (string, error) {
	if ns == "" {
		ns = s.defaultNamespace()
	}
	if !s.allows(ns) {
		return "", s.outside(kind, ns, name)
	}
	return ns, nil
}

// scopeObjects gives each object without a namespace the scope's default
// and its source (apiv1.AnnotationSource), and returns one problem per
// object outside the scope or naming another source.
func (s cmdScope) scopeObjects(objs []apiruntime.Object) []string {
	var problems []string
	for _, o := range objs {
		m, kind := objectMeta(o)
		if m == nil {
			continue // refused by validation, naming its type
		}
		if m.Namespace == "" {
			m.Namespace = s.defaultNamespace()
		}
		if !s.allows(m.Namespace) {
			problems = append(problems, s.outside(kind, m.Namespace, m.Name).Error())
			continue
		}
		// The source is the topic's: a command may repeat it, never name another.
		if given := m.Annotations[apiv1.AnnotationSource]; given != "" && given != s.Source() {
			problems = append(problems, fmt.Sprintf("%s %s/%s: metadata.annotations[%s]: %q is not this command's source %s (mqlet sets it from the topic)",
				kind, m.Namespace, m.Name, apiv1.AnnotationSource, given, s.Source()))
			continue
		}
		if m.Annotations == nil {
			m.Annotations = map[string]string{}
		}
		m.Annotations[apiv1.AnnotationSource] = s.Source()
	}
	return problems
}

func objectMeta(o apiruntime.Object) (*metav1.ObjectMeta, string) {
	switch obj := o.(type) {
	case *v1.Pod:
		return &obj.ObjectMeta, store.KindPod
	case *v1.ConfigMap:
		return &obj.ObjectMeta, store.KindConfigMap
	case *v1.Secret:
		return &obj.ObjectMeta, store.KindSecret
	}
	return nil, ""
}

// storeScope is what a sync of this command replaces: the objects of its
// source in its namespace. A sync limited by a key to several namespaces
// (on a node-wide topic) could not say which to replace: refused.
func (s cmdScope) storeScope() (store.Scope, error) {
	sc := store.Scope{Source: s.Source(), Namespace: s.Namespace}
	if sc.Namespace == "" && s.keyNamespaces != nil {
		if len(s.keyNamespaces) != 1 {
			return sc, errors.New("sync replaces one namespace's objects for a key limited to several namespaces: send it on a namespace topic (<prefix>/<node>/ns/<namespace>/cmd/sync)")
		}
		sc.Namespace = s.keyNamespaces[0]
	}
	return sc, nil
}

// checkMember refuses a group command for a group this node is not in (a
// subscription left from before the node left it).
func (in *Intake) checkMember(sc apiv1.Scope) error {
	if sc.Group == "" {
		return nil
	}
	if in.opts.Groups != nil && slices.Contains(in.opts.Groups(), sc.Group) {
		return nil
	}
	return fmt.Errorf("this node (%s) is not a member of group %s", in.opts.Topics.Node, sc.Group)
}
