// Package validate defaults and validates incoming objects with Kubernetes'
// own code (pkg/apis/core/v1 defaults, pkg/apis/core/validation) and then
// checks pods against the node's admission policy: the Kubernetes Pod
// Security Standards (evaluated with k8s.io/pod-security-admission's own
// checks) at the profile configured for the pod's namespace, with the
// node's exceptions, and bounds on what a pod may cost the agent.
package validate

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	podutil "k8s.io/kubernetes/pkg/api/pod"
	"k8s.io/kubernetes/pkg/apis/core"
	corev1 "k8s.io/kubernetes/pkg/apis/core/v1"
	corevalidation "k8s.io/kubernetes/pkg/apis/core/validation"

	apiv1 "github.com/mqlet/mqlet/api/v1"
)

// DefaultNamespace is given to objects that name none.
const DefaultNamespace = "default"

// scheme knows v1 and internal core types with their defaulting and
// conversion functions. Built at the first validation (about 0.5 MiB that
// an agent with nothing to validate does not hold), only read afterwards.
var scheme = sync.OnceValue(newScheme)

func newScheme() *runtime.Scheme {
	s := runtime.NewScheme()
	if err := core.AddToScheme(s); err != nil {
		panic(fmt.Sprintf("register internal core types: %v", err))
	}
	if err := corev1.AddToScheme(s); err != nil {
		panic(fmt.Sprintf("register core/v1 types: %v", err))
	}
	return s
}

// DefaultPod fills in what the API server would: Kubernetes' own defaults
// (restartPolicy, dnsPolicy, terminationGracePeriodSeconds, imagePullPolicy,
// terminationMessagePath and so on) and the namespace "default".
func DefaultPod(pod *v1.Pod) {
	if pod.Namespace == "" {
		pod.Namespace = DefaultNamespace
	}
	corev1.SetObjectDefaults_Pod(pod)
	defaultPodLevelResources(pod)
}

// defaultPodLevelResources fills pod-level requests (and limits) from the
// pod's own and its containers' as the API server does on create with
// PodLevelResources (podutil.DefaultPodLevelResources, which works on the
// internal type). A pod without pod-level resources is left alone.
func defaultPodLevelResources(pod *v1.Pod) {
	if pod.Spec.Resources == nil {
		return
	}
	var spec core.PodSpec
	if err := corev1.Convert_v1_PodSpec_To_core_PodSpec(&pod.Spec, &spec, nil); err != nil {
		return // validation converts again and names the problem
	}
	internal := core.Pod{Spec: spec}
	podutil.DefaultPodLevelResources(&internal)
	var res v1.ResourceRequirements
	if err := corev1.Convert_core_ResourceRequirements_To_v1_ResourceRequirements(internal.Spec.Resources, &res, nil); err != nil {
		return
	}
	pod.Spec.Resources = &res
}

// DefaultSecret sets the namespace and the secret type (Opaque) if missing.
func DefaultSecret(secret *v1.Secret) {
	if secret.Namespace == "" {
		secret.Namespace = DefaultNamespace
	}
	corev1.SetObjectDefaults_Secret(secret)
}

// DefaultConfigMap sets the namespace if missing.
func DefaultConfigMap(cm *v1.ConfigMap) {
	if cm.Namespace == "" {
		cm.Namespace = DefaultNamespace
	}
	corev1.SetObjectDefaults_ConfigMap(cm)
}

// ValidatePod checks a pod's bounds (CheckBounds), then the pod as the API
// server would on create, then that it is not bound to another node, then
// the admission policy, then that it sets no field mqlet does not honour
// (CheckSupport). The pod is not changed: validation runs on a
// defaulted copy, so an undefaulted pod is judged as it will be run.
func ValidatePod(pod *v1.Pod, nodeName string, policy Policy) field.ErrorList {
	if errs := CheckBounds(&pod.Spec); len(errs) > 0 {
		return errs // nothing more is worth the cost of looking at
	}
	p := pod.DeepCopy()
	DefaultPod(p)

	var internal core.Pod
	if err := scheme().Convert(p, &internal, nil); err != nil {
		return field.ErrorList{field.InternalError(field.NewPath(""), fmt.Errorf("convert pod to internal form: %w", err))}
	}
	opts := podutil.GetValidationOptionsFromPodSpecAndMeta(&internal.Spec, nil, &internal.ObjectMeta, nil)
	opts.ResourceIsPod = true
	errs := withoutClusterPrivilegeVerdict(corevalidation.ValidatePodCreate(&internal, opts))

	if p.Spec.NodeName != "" && p.Spec.NodeName != nodeName {
		errs = append(errs, field.Invalid(field.NewPath("spec", "nodeName"), p.Spec.NodeName,
			fmt.Sprintf("pod is bound to another node; this node is %q", nodeName)))
	}
	errs = append(errs, policy.Check(&p.ObjectMeta, &p.Spec)...)
	errs = append(errs, CheckSupport(p)...)
	errs = append(errs, checkTerminationMessages(&p.Spec)...)
	return errs
}

// clusterPrivilegeVerdict is what Kubernetes' validation says about a
// privileged container while the process-wide capabilities (a global that
// kubelet sets at start) forbid it. mqlet leaves that global alone and lets
// admission policy decide, so this one verdict is dropped.
const clusterPrivilegeVerdict = "disallowed by cluster policy"

func withoutClusterPrivilegeVerdict(errs field.ErrorList) field.ErrorList {
	kept := errs[:0]
	for _, e := range errs {
		if e.Type == field.ErrorTypeForbidden && e.Detail == clusterPrivilegeVerdict &&
			strings.HasSuffix(e.Field, ".securityContext.privileged") {
			continue
		}
		kept = append(kept, e)
	}
	return kept
}

// ValidateConfigMap checks a config map with Kubernetes' validation.
func ValidateConfigMap(cm *v1.ConfigMap) field.ErrorList {
	c := cm.DeepCopy()
	DefaultConfigMap(c)
	var internal core.ConfigMap
	if err := scheme().Convert(c, &internal, nil); err != nil {
		return field.ErrorList{field.InternalError(field.NewPath(""), fmt.Errorf("convert config map to internal form: %w", err))}
	}
	errs := corevalidation.ValidateConfigMap(&internal)
	data := make(map[string][]byte, len(c.Data)+len(c.BinaryData))
	for k, v := range c.Data {
		data[k] = []byte(v)
	}
	errs = append(errs, placeholders(field.NewPath("data"), data)...)
	return append(errs, placeholders(field.NewPath("binaryData"), c.BinaryData)...)
}

// placeholders refuses values that are get's stand-ins for data (see
// apiv1.IsPlaceholder): applying get's output must not store them.
func placeholders(path *field.Path, data map[string][]byte) field.ErrorList {
	keys := make([]string, 0, len(data))
	for k, v := range data {
		if apiv1.IsPlaceholder(v) {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	var errs field.ErrorList
	for _, k := range keys {
		errs = append(errs, field.Forbidden(path.Key(k), fmt.Sprintf("holds %q, the placeholder get shows instead of the value; apply the real value", data[k])))
	}
	return errs
}

// ValidateSecret checks a secret with Kubernetes' validation (stringData is
// merged into data first, as the API server does).
func ValidateSecret(secret *v1.Secret) field.ErrorList {
	s := secret.DeepCopy()
	DefaultSecret(s)
	var internal core.Secret
	if err := scheme().Convert(s, &internal, nil); err != nil {
		return field.ErrorList{field.InternalError(field.NewPath(""), fmt.Errorf("convert secret to internal form: %w", err))}
	}
	errs := corevalidation.ValidateSecret(&internal)
	// The conversion merged stringData into data.
	return append(errs, placeholders(field.NewPath("data"), internal.Data)...)
}

// FormatErrors renders every error, each with its field path, as one
// message, e.g. `2 errors: metadata.name: Invalid value: "Web": ...; spec.containers[0].image: Required value`.
// Pod Security violations are first summed up as kubectl prints them, and
// then named only by their reason at each field, so each control's text
// appears once, e.g.
// `violates PodSecurity "baseline:latest": host namespaces (hostNetwork=true), privileged (...); 2 errors: spec.hostNetwork: Forbidden: host namespaces; ...`.
// Kubernetes' secret validation already redacts secret contents in its errors.
func FormatErrors(errs field.ErrorList) string {
	if len(errs) == 0 {
		return ""
	}
	var summary []string
	controls := map[string][]string{} // by header, in order of appearance
	parts := make([]string, 0, len(errs))
	for _, e := range errs {
		v, ok := e.BadValue.(Violation)
		if !ok || e.Type != field.ErrorTypeForbidden {
			parts = append(parts, e.Error())
			continue
		}
		h := v.header()
		if _, seen := controls[h]; !seen {
			summary = append(summary, h)
		}
		if !slices.Contains(controls[h], v.Control) {
			controls[h] = append(controls[h], v.Control)
		}
		parts = append(parts, fmt.Sprintf("%s: %s: %s%s", e.Field, e.Type, v.Reason, strings.TrimPrefix(e.Detail, v.String())))
	}
	noun := "errors"
	if len(errs) == 1 {
		noun = "error"
	}
	msg := fmt.Sprintf("%d %s: %s", len(errs), noun, strings.Join(parts, "; "))
	for i := len(summary) - 1; i >= 0; i-- {
		msg = summary[i] + strings.Join(controls[summary[i]], ", ") + "; " + msg
	}
	return msg
}

// RedactSecret returns a copy of secret safe to reply with or log: each
// data value is replaced by a note of its length and stringData is dropped
// (its keys are listed in data the same way).
func RedactSecret(secret *v1.Secret) *v1.Secret {
	if secret == nil {
		return nil
	}
	out := secret.DeepCopy()
	redacted := make(map[string][]byte, len(secret.Data)+len(secret.StringData))
	for k, v := range secret.Data {
		redacted[k] = []byte(apiv1.Redacted(len(v)))
	}
	for k, v := range secret.StringData {
		redacted[k] = []byte(apiv1.Redacted(len(v)))
	}
	out.Data = redacted
	out.StringData = nil
	// The last-applied annotation kubectl writes would carry the values too.
	delete(out.Annotations, v1.LastAppliedConfigAnnotation)
	return out
}
