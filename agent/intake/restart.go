package intake

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/mqlet/mqlet/agent/manifest"
	"github.com/mqlet/mqlet/agent/reply"
	"github.com/mqlet/mqlet/cri"
)

// RestartArgs name the pod, or one of its app containers, to restart.
type RestartArgs struct {
	Namespace string `json:"namespace,omitempty"`
	Name      string `json:"name"`
	Container string `json:"container,omitempty"`
}

// RestartResult names the containers running after a restart.
type RestartResult struct {
	// Containers maps each restarted container to its new container id.
	Containers map[string]string `json:"containers"`
}

func (in *Intake) restart(id string, payload []byte) {
	const verb = "restart"
	v := in.opts.Verbs
	if v.Runtime == nil || v.Streams == nil || v.Restarts == nil {
		in.fail(id, verb, errors.New("verb \"restart\" is not supported by this mqlet"))
		return
	}
	var args RestartArgs
	if err := manifest.DecodeArgs(payload, &args); err != nil {
		in.fail(id, verb, fmt.Errorf("decoding restart request: %w", err))
		return
	}
	pod, err := in.findPod(args.Namespace, args.Name)
	if err != nil {
		in.fail(id, verb, err)
		return
	}
	names := make([]string, 0, len(pod.Spec.Containers))
	if args.Container != "" {
		if _, err := pickContainer(pod, args.Container, false); err != nil {
			in.fail(id, verb, err)
			return
		}
		names = append(names, args.Container)
	} else {
		for _, c := range pod.Spec.Containers {
			names = append(names, c.Name)
		}
	}
	_ = in.replies.Send(reply.Reply{RequestID: id, Verb: verb, Phase: reply.Accepted, Message: fmt.Sprintf("restarting %s of pod %s/%s", what(args.Container), pod.Namespace, pod.Name)})
	in.startStream(id, verb, func(ctx context.Context) { in.runRestart(ctx, id, pod, args.Container, names) })
}

func what(container string) string {
	if container == "" {
		return "every container"
	}
	return "container " + container
}

func (in *Intake) runRestart(ctx context.Context, id string, pod *v1.Pod, container string, names []string) {
	const verb = "restart"
	v := in.opts.Verbs
	timeout := v.RestartTimeout
	if timeout <= 0 {
		timeout = 5 * time.Minute
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	before := map[string]bool{}
	if st, err := v.Runtime.GetPodStatus(ctx, string(pod.UID), pod.Name, pod.Namespace); err == nil {
		for _, c := range st.Containers {
			before[c.ID] = true
		}
	}
	done := make(chan error, 1)
	why := fmt.Sprintf("restart requested (request %s)", id)
	key := pod.Namespace + "/" + pod.Name
	if err := v.Restarts.RequestRestart(key, string(pod.UID), container, why, time.Now().Add(timeout), func(err error) { done <- err }); err != nil {
		in.fail(id, verb, err)
		return
	}
	select {
	case err := <-done:
		if err != nil {
			in.fail(id, verb, fmt.Errorf("restarting pod %s: %w", key, err))
			return
		}
	case <-ctx.Done():
		in.fail(id, verb, fmt.Errorf("restarting pod %s: not done within %s", key, timeout))
		return
	}
	st, err := v.Runtime.GetPodStatus(ctx, string(pod.UID), pod.Name, pod.Namespace)
	if err != nil {
		in.fail(id, verb, fmt.Errorf("reading pod %s after the restart: %w", key, err))
		return
	}
	res := RestartResult{Containers: map[string]string{}}
	var problems []string
	for _, name := range names {
		c := newest(st, name)
		switch {
		case c == nil || before[c.ID]:
			problems = append(problems, "container "+name+" was not started again")
		case c.State != cri.ContainerRunning && c.State != cri.ContainerExited:
			problems = append(problems, fmt.Sprintf("container %s is %s", name, c.State))
		default:
			res.Containers[name] = c.ID
		}
	}
	if len(problems) > 0 {
		sort.Strings(problems)
		in.fail(id, verb, fmt.Errorf("restarting pod %s: %s", key, summarize(problems)), problems...)
		return
	}
	_ = in.replies.Send(reply.Reply{RequestID: id, Verb: verb, Phase: reply.Succeeded,
		Message: fmt.Sprintf("restarted %s of pod %s", what(container), key), Result: res})
}

// newest is the newest attempt of the app container name.
func newest(st *cri.PodStatus, name string) *cri.ContainerStatus {
	for i := range st.Containers {
		if c := &st.Containers[i]; c.Name == name && !c.Init {
			return c
		}
	}
	return nil
}

func (in *Intake) cancel(id string, payload []byte) {
	const verb = "cancel"
	v := in.opts.Verbs
	if v.Streams == nil {
		in.fail(id, verb, errors.New("verb \"cancel\" is not supported by this mqlet"))
		return
	}
	var args CancelArgs
	if err := manifest.DecodeArgs(payload, &args); err != nil {
		in.fail(id, verb, fmt.Errorf("decoding cancel request: %w", err))
		return
	}
	if args.RequestID == "" {
		in.fail(id, verb, errors.New("requestId: required"))
		return
	}
	if !v.Streams.Cancel(args.RequestID) {
		in.fail(id, verb, fmt.Errorf("no running request %q (logs, exec and restart requests can be cancelled while they run)", args.RequestID))
		return
	}
	_ = in.replies.Send(reply.Reply{RequestID: id, Verb: verb, Phase: reply.Succeeded, Message: "cancelled request " + args.RequestID})
}
