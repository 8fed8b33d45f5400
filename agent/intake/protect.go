package intake

import (
	"fmt"
	"sort"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	apiruntime "k8s.io/apimachinery/pkg/runtime"
	podutil "k8s.io/kubernetes/pkg/api/v1/pod"

	"github.com/mqlet/mqlet/agent/store"
	"github.com/mqlet/mqlet/agent/validate"
)

// A pod admitted only because its command's signing key was allowed a
// looser profile (privileged, say) must not be steered by whoever can
// publish unsigned commands: the ConfigMaps and Secrets it refers to
// inherit the signing requirement of the key that admitted it
// (docs/signed-commands.md, "Objects a signed pod uses"). Two annotations,
// owned by mqlet, carry what that needs across restarts:
const (
	// AnnotationAdmittedProfile is on a Pod admitted through its signing
	// key's profile (the key's maxProfile); absent when the node's own
	// policy admits it.
	AnnotationAdmittedProfile = "mqlet.io/admitted-profile"
	// AnnotationSignedProfile is on a ConfigMap or Secret last written by
	// a command signed by a key with a maxProfile (that profile); absent
	// when it was written unsigned or by a key without one.
	AnnotationSignedProfile = "mqlet.io/signed-profile"
)

// ReasonProtectedObject is the event reason of a write refused because an
// object is used by a pod admitted through a signing key's profile.
const ReasonProtectedObject = "ProtectedObject"

func rank(profile string) int {
	switch validate.Profile(profile) {
	case validate.ProfilePrivileged:
		return 3
	case validate.ProfileBaseline:
		return 2
	case validate.ProfileRestricted:
		return 1
	}
	return 0
}

// signedAs says how the command being handled is signed, for messages.
func (in *Intake) signedAs() string {
	if in.cmdProfile == "" {
		return "this command is unsigned or signed by a key without maxProfile"
	}
	return "this command's key has maxProfile " + in.cmdProfile
}

// objRef names a ConfigMap or Secret: "Kind namespace/name".
func objRef(kind, namespace, name string) string {
	if namespace == "" {
		namespace = v1.NamespaceDefault
	}
	return kind + " " + namespace + "/" + name
}

// userLevels maps every ConfigMap and Secret an elevated pod refers to
// ("Kind ns/name") to the highest profile among those pods, and the pod
// that sets it.
type userLevels map[string]struct {
	profile string
	pod     string
}

func (u userLevels) add(p *v1.Pod, profile string) {
	if rank(profile) == 0 {
		return
	}
	note := func(kind string) podutil.Visitor {
		return func(name string) bool {
			ref := objRef(kind, p.Namespace, name)
			if rank(profile) > rank(u[ref].profile) {
				u[ref] = struct{ profile, pod string }{profile, p.Namespace + "/" + p.Name}
			}
			return true
		}
	}
	podutil.VisitPodConfigmapNames(p, note(store.KindConfigMap))
	podutil.VisitPodSecretNames(p, note(store.KindSecret))
}

// storedUserLevels is userLevels of the stored pods.
func (in *Intake) storedUserLevels() (userLevels, error) {
	pods, err := in.store.ListPods()
	if err != nil {
		return nil, fmt.Errorf("reading stored pods to find the objects signed pods use: %w", err)
	}
	u := userLevels{}
	for _, p := range pods {
		u.add(p, p.Annotations[AnnotationAdmittedProfile])
	}
	return u, nil
}

// refuseProtected fails a write of the objects in refs (each "Kind
// ns/name") that levels protects beyond the command's signature.
func (in *Intake) refuseProtected(refs []string, levels userLevels) error {
	var problems []string
	for _, ref := range refs {
		l, ok := levels[ref]
		if !ok || rank(in.cmdProfile) >= rank(l.profile) {
			continue
		}
		problems = append(problems, fmt.Sprintf("%s is used by Pod %s, admitted with profile %s by its signing key: changing or deleting it needs a command signed by a key with maxProfile %s or above (%s)",
			ref, l.pod, l.profile, l.profile, in.signedAs()))
	}
	if len(problems) == 0 {
		return nil
	}
	sort.Strings(problems)
	in.nodeEvent(v1.EventTypeWarning, ReasonProtectedObject, summarize(problems))
	return fmt.Errorf("%d object(s) protected, nothing applied: %s", len(problems), summarize(problems))
}

// checkProtected is the rule for an apply or sync, after validation:
//   - a ConfigMap or Secret the command writes, or a sync deletes, that a
//     stored pod or a pod of the command admitted through a key's profile
//     uses, needs a signature with at least that profile;
//   - a pod the command admits through its key's profile may use only
//     objects of the same command, objects stored by a command signed with
//     at least that profile, or objects not stored yet (their creation then
//     needs the signature).
//
// It also sets the annotations: AnnotationAdmittedProfile on the command's
// pods, AnnotationSignedProfile on its ConfigMaps and Secrets. A command
// giving either annotation another value than mqlet would is refused.
func (in *Intake) checkProtected(objs []apiruntime.Object, replaceAll bool) error {
	var bad []string
	own := func(kind string, m *metav1.ObjectMeta, key, value string) {
		if given, ok := m.Annotations[key]; ok && given != value {
			bad = append(bad, fmt.Sprintf("%s: metadata.annotations[%s]: %q is set by mqlet (the signing of the command that stores the object), not by the command; omit it", objRef(kind, m.Namespace, m.Name), key, given))
			return
		}
		if value == "" {
			delete(m.Annotations, key)
			return
		}
		if m.Annotations == nil {
			m.Annotations = map[string]string{}
		}
		m.Annotations[key] = value
	}
	var written []string
	var elevated []*v1.Pod
	for _, o := range objs {
		switch obj := o.(type) {
		case *v1.Pod:
			profile := ""
			if in.cmdProfile != "" && len(in.opts.Policy.Check(&obj.ObjectMeta, &obj.Spec)) > 0 {
				profile = in.cmdProfile // admitted only through the key's profile
				elevated = append(elevated, obj)
			}
			own(store.KindPod, &obj.ObjectMeta, AnnotationAdmittedProfile, profile)
		case *v1.ConfigMap:
			own(store.KindConfigMap, &obj.ObjectMeta, AnnotationSignedProfile, in.cmdProfile)
			written = append(written, objRef(store.KindConfigMap, obj.Namespace, obj.Name))
		case *v1.Secret:
			own(store.KindSecret, &obj.ObjectMeta, AnnotationSignedProfile, in.cmdProfile)
			written = append(written, objRef(store.KindSecret, obj.Namespace, obj.Name))
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("%d object(s) rejected, nothing applied: %s", len(bad), summarize(bad))
	}
	if len(written) == 0 && len(elevated) == 0 && !replaceAll {
		return nil // a pod-only command at the node's own profile
	}
	named := map[string]bool{}
	for _, ref := range written {
		named[ref] = true
	}
	var stored map[string]string
	var replaced []string
	if replaceAll || len(elevated) > 0 {
		var sc *store.Scope
		if replaceAll {
			s, err := in.scope.storeScope()
			if err != nil {
				return err
			}
			sc = &s
		}
		var err error
		if stored, replaced, err = in.storedSignedProfiles(sc); err != nil {
			return err
		}
	}
	for _, ref := range replaced {
		if !named[ref] {
			written = append(written, ref) // deleted by the sync
		}
	}
	if len(written) > 0 {
		levels, err := in.storedUserLevels()
		if err != nil {
			return err
		}
		for _, p := range elevated {
			levels.add(p, in.cmdProfile)
		}
		if err := in.refuseProtected(written, levels); err != nil {
			return err
		}
	}
	var problems []string
	for _, p := range elevated {
		check := func(kind string) podutil.Visitor {
			return func(name string) bool {
				ref := objRef(kind, p.Namespace, name)
				if profile, ok := stored[ref]; ok && !named[ref] && rank(profile) < rank(in.cmdProfile) {
					problems = append(problems, fmt.Sprintf("Pod %s/%s, admitted with profile %s by its signing key, uses %s, which was stored by a command signed with less (%s): apply it again with the pod, signed",
						p.Namespace, p.Name, in.cmdProfile, ref, orUnsigned(profile)))
				}
				return true
			}
		}
		podutil.VisitPodConfigmapNames(p, check(store.KindConfigMap))
		podutil.VisitPodSecretNames(p, check(store.KindSecret))
	}
	if len(problems) == 0 {
		return nil
	}
	sort.Strings(problems)
	in.nodeEvent(v1.EventTypeWarning, ReasonProtectedObject, summarize(problems))
	return fmt.Errorf("%d pod(s) not admitted, nothing applied: %s", len(problems), summarize(problems))
}

func orUnsigned(profile string) string {
	if profile == "" {
		return "unsigned, or by a key without maxProfile"
	}
	return "maxProfile " + profile
}

// storedSignedProfiles maps every stored ConfigMap and Secret ("Kind
// ns/name") to its AnnotationSignedProfile ("" when absent), and lists
// those in sc, the scope a sync replaces (none when sc is nil).
func (in *Intake) storedSignedProfiles(sc *store.Scope) (map[string]string, []string, error) {
	out := map[string]string{}
	var inScope []string
	note := func(kind string, m *metav1.ObjectMeta) {
		ref := objRef(kind, m.Namespace, m.Name)
		out[ref] = m.Annotations[AnnotationSignedProfile]
		if sc != nil && sc.Holds(store.Key(m.Namespace, m.Name), m) {
			inScope = append(inScope, ref)
		}
	}
	cms, err := in.store.ListConfigMaps()
	if err != nil {
		return nil, nil, fmt.Errorf("reading stored ConfigMaps: %w", err)
	}
	for _, c := range cms {
		note(store.KindConfigMap, &c.ObjectMeta)
	}
	secrets, err := in.store.ListSecrets()
	if err != nil {
		return nil, nil, fmt.Errorf("reading stored Secrets: %w", err)
	}
	for _, s := range secrets {
		note(store.KindSecret, &s.ObjectMeta)
	}
	return out, inScope, nil
}

// checkProtectedDeletes is the rule for a delete: a ConfigMap or Secret a
// stored pod admitted through a key's profile uses is deleted only by a
// command signed with at least that profile.
func (in *Intake) checkProtectedDeletes(refs []string) error {
	if len(refs) == 0 {
		return nil
	}
	levels, err := in.storedUserLevels()
	if err != nil {
		return err
	}
	return in.refuseProtected(refs, levels)
}
