package intake

import (
	"context"
	"errors"
	"fmt"
	"io"
	"runtime/debug"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/mqlet/mqlet/agent/shell"
	"github.com/mqlet/mqlet/agent/store"
	"github.com/mqlet/mqlet/agent/streams"
	apiv1 "github.com/mqlet/mqlet/api/v1"
	"github.com/mqlet/mqlet/cri"
	"github.com/mqlet/mqlet/internal/redact"
)

// The operator verbs (logs, exec, restart, cancel) run outside the intake,
// which handles one command at a time: the handler checks the request,
// then a stream owned by the streams manager does the work and sends the
// replies.

// VerbRuntime is what the operator verbs need of the container runtime.
type VerbRuntime interface {
	ContainerLogs(ctx context.Context, r cri.LogRequest, out io.Writer) error
	ExecInPod(ctx context.Context, pod cri.PodKey, container string, cmd []string, timeout time.Duration) (*cri.ExecResult, error)
	GetPodStatus(ctx context.Context, uid, name, namespace string) (*cri.PodStatus, error)
}

// ShellRunner runs one interactive session (agent/shell).
type ShellRunner interface {
	Run(ctx context.Context, s shell.Spec) (int, error)
}

// Restarts carries restart requests to the pod workers.
type Restarts interface {
	RequestRestart(key, uid, container, why string, deadline time.Time, done func(error)) error
}

// Streams runs the verbs' work, bounded, cancellable by request id.
type Streams interface {
	Start(id string, kind streams.Kind, fn func(ctx context.Context)) error
	Cancel(id string) bool
	// CancelIf cancels id when may allows its kind (Kind.Owner).
	CancelIf(id string, may func(streams.Kind) bool) bool
}

// LogLimits bound the logs verb (config logs.*).
type LogLimits struct {
	MaxChunkBytes  int
	MaxBytes       int64
	MaxFollow      time.Duration
	BytesPerSecond int64
	// Backlog, when set, is how many bytes wait in the outbox; a log's
	// next chunk waits while it is over MaxBacklog, so a log read faster
	// than the broker takes it never crowds other messages out.
	Backlog    func() int64
	MaxBacklog int64
}

// ExecLimits bound the exec verb (config exec.*).
type ExecLimits struct {
	Enabled        bool
	DefaultTimeout time.Duration
	MaxTimeout     time.Duration
	MaxOutputBytes int
	// IdleTimeout ends an interactive session without input or output.
	IdleTimeout time.Duration
}

// VerbOptions wire the operator verbs; a verb whose parts are missing is
// answered "not supported".
type VerbOptions struct {
	Runtime  VerbRuntime
	Restarts Restarts
	Streams  Streams
	Logs     LogLimits
	Exec     ExecLimits
	// RestartTimeout bounds how long a restart waits for its new containers.
	RestartTimeout time.Duration
	// Config holds the settings the config verb changes.
	Config LiveConfig
	// Events is the kept event history, for get {"kind":"Event"}.
	Events EventHistory
	// Node is the node's published status, for get {"kind":"Node"}.
	Node NodeSource
	// Shell runs interactive sessions (exec -it); nil: refused.
	Shell ShellRunner
	// Scrub gives the scrubber of a pod's text (logs, exec output, the
	// runtime's errors about it): the secrets that pod refers to. nil:
	// nothing is scrubbed.
	Scrub func(namespace, name string) *redact.Scrubber
}

// scrubberOf is the scrubber of pod's text (nil: none).
func (in *Intake) scrubberOf(namespace, name string) *redact.Scrubber {
	if in.opts.Verbs.Scrub == nil {
		return nil
	}
	return in.opts.Verbs.Scrub(namespace, name)
}

// NodeSource gives the v1.Node last published on the node topic (nil
// before the first publication).
type NodeSource interface {
	Node() *v1.Node
}

// LiveConfig is the settings changed over MQTT (agent/liveconfig).
type LiveConfig interface {
	Patch(raw []byte) ([]string, error)
	View() (apiv1.ConfigView, error)
}

// unrecordedSender sends a reply that is not recorded for redelivery (the
// chunks of a log: only the final reply stands for the request).
type unrecordedSender interface {
	SendUnrecorded(r apiv1.Reply) error
}

func (in *Intake) sendChunk(r apiv1.Reply) error {
	if s, ok := in.replies.(unrecordedSender); ok {
		return s.SendUnrecorded(r)
	}
	return in.replies.Send(r)
}

// startStream runs fn for request id on the streams manager, answering
// failed when it cannot start; a panic in fn is answered failed too
// instead of taking the agent down. Inside a batch (the pipeline) it starts
// only once the batch is committed, on the pipeline's own intake, whose
// sender and store outlive the batch's transaction.
func (in *Intake) startStream(id, verb string, follow bool, pod *metav1.ObjectMeta, fn func(in *Intake, ctx context.Context)) {
	in.startStreamKind(id, verb, streams.Kind{Follow: follow}, pod, fn)
}

// startStreamKind is startStream for a stream of kind k (its requester
// and owner are filled in).
func (in *Intake) startStreamKind(id, verb string, kind streams.Kind, pod *metav1.ObjectMeta, fn func(in *Intake, ctx context.Context)) {
	kind.Requester, kind.Owner = in.cmdRequester, streamOwner(pod)
	in.afterCommit(func(base *Intake) { base.startStreamNow(id, verb, kind, fn) })
}

// streamOwner names whose a stream is, so a cancel is allowed only in a
// scope that sees its pod: "<namespace> <source>".
func streamOwner(pod *metav1.ObjectMeta) string {
	return pod.Namespace + " " + store.SourceOf(pod)
}

// ownerMeta is the metadata streamOwner was made of.
func ownerMeta(owner string) *metav1.ObjectMeta {
	ns, source, _ := strings.Cut(owner, " ")
	return &metav1.ObjectMeta{Namespace: ns, Annotations: map[string]string{apiv1.AnnotationSource: source}}
}

// afterCommit runs fn once what the command stored is committed (at once
// outside a batch).
func (in *Intake) afterCommit(fn func(in *Intake)) {
	if l, ok := in.pods.(later); ok {
		l.later(fn)
		return
	}
	fn(in)
}

// later is the pipeline's effects, run after the batch is committed.
type later interface {
	later(fn func(in *Intake))
}

func (f *effects) later(fn func(in *Intake)) { f.calls = append(f.calls, fn) }

func (in *Intake) startStreamNow(id, verb string, kind streams.Kind, fn func(in *Intake, ctx context.Context)) {
	err := in.opts.Verbs.Streams.Start(id, kind, func(ctx context.Context) {
		defer func() {
			if r := recover(); r != nil {
				in.log.Error().Str("requestId", id).Str("verb", verb).Str("panic", fmt.Sprint(r)).Str("stack", string(debug.Stack())).Msg("verb handler panicked")
				in.fail(id, verb, errors.New(MsgInternalError))
			}
		}()
		fn(in, ctx)
	})
	if err != nil {
		in.fail(id, verb, fmt.Errorf("not started: %w", err))
	}
}

// findPod returns the desired pod named by a verb's arguments, checked
// before use and against the command's scope; namespace defaults to the
// scope's ("default" for a node-wide command).
func (in *Intake) findPod(namespace, name string) (*v1.Pod, error) {
	namespace, err := in.scope.namespace(store.KindPod, namespace, name)
	if err != nil {
		return nil, err
	}
	if msgs := validation.IsDNS1123Label(namespace); len(msgs) > 0 {
		return nil, fmt.Errorf("namespace %q: %s", namespace, strings.Join(msgs, "; "))
	}
	if name == "" {
		return nil, errors.New("name: required")
	}
	if msgs := validation.IsDNS1123Subdomain(name); len(msgs) > 0 {
		return nil, fmt.Errorf("name %q: %s", name, strings.Join(msgs, "; "))
	}
	pods, err := in.store.ListPods()
	if err != nil {
		return nil, fmt.Errorf("reading pods: %w", err)
	}
	for _, p := range pods {
		if p.Namespace == namespace && p.Name == name {
			if !in.scope.sees(&p.ObjectMeta) {
				return nil, fmt.Errorf("pod %s/%s belongs to source %s, outside this command's scope (%s)", namespace, name, store.SourceOf(&p.ObjectMeta), in.scope.describe())
			}
			return p, nil
		}
	}
	return nil, fmt.Errorf("pod %s/%s not found", namespace, name)
}

// pickContainer is the container a verb names, or the pod's only one.
func pickContainer(pod *v1.Pod, name string, withInit bool) (string, error) {
	var names []string
	lists := [][]v1.Container{pod.Spec.Containers}
	if withInit {
		lists = append(lists, pod.Spec.InitContainers)
	}
	for _, list := range lists {
		for _, c := range list {
			if c.Name == name {
				return name, nil
			}
			names = append(names, c.Name)
		}
	}
	if !withInit {
		for _, c := range pod.Spec.InitContainers {
			if c.Name == name {
				return "", fmt.Errorf("container %q of pod %s/%s is an init container (or sidecar); only an app container can be named here: %s", name, pod.Namespace, pod.Name, strings.Join(names, ", "))
			}
		}
	}
	if name == "" {
		if len(pod.Spec.Containers) == 1 {
			return pod.Spec.Containers[0].Name, nil
		}
		return "", fmt.Errorf("pod %s/%s has %d containers: name one of %s", pod.Namespace, pod.Name, len(names), strings.Join(names, ", "))
	}
	return "", fmt.Errorf("container %q not found in pod %s/%s (containers: %s)", name, pod.Namespace, pod.Name, strings.Join(names, ", "))
}

func podKey(pod *v1.Pod) cri.PodKey {
	return cri.PodKey{UID: string(pod.UID), Name: pod.Name, Namespace: pod.Namespace}
}
