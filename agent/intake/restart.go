package intake

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/mqlet/mqlet/agent/manifest"
	apiv1 "github.com/mqlet/mqlet/api/v1"
	"github.com/mqlet/mqlet/cri"
)

func (in *Intake) handleRestart(r request) {
	id, payload := r.id, r.payload
	const verb = "restart"
	v := in.opts.Verbs
	if v.Runtime == nil || v.Streams == nil || v.Restarts == nil {
		in.fail(id, verb, errors.New("verb \"restart\" is not supported by this mqlet"))
		return
	}
	var args apiv1.RestartRequest
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
	_ = in.replies.Send(apiv1.Reply{RequestID: id, Verb: verb, Phase: apiv1.Accepted, Message: fmt.Sprintf("restarting %s of pod %s/%s", what(args.Container), pod.Namespace, pod.Name)})
	in.startStream(id, verb, false, &pod.ObjectMeta, func(in *Intake, ctx context.Context) { in.runRestart(ctx, id, pod, args.Container, names) })
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
			in.fail(id, verb, in.scrubberOf(pod.Namespace, pod.Name).Error(fmt.Errorf("restarting pod %s: %w", key, err)))
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
	res := apiv1.RestartResult{Containers: []apiv1.RestartedContainer{}}
	var problems []string
	for _, name := range names {
		c := newest(st, name)
		switch {
		case c == nil || before[c.ID]:
			problems = append(problems, "container "+name+" was not started again")
		case c.State != cri.ContainerRunning && c.State != cri.ContainerExited:
			problems = append(problems, fmt.Sprintf("container %s is %s", name, c.State))
		default:
			res.Containers = append(res.Containers, apiv1.RestartedContainer{Name: name, ContainerID: c.ID, RestartCount: int32(c.RestartCount)})
		}
	}
	if len(problems) > 0 {
		sort.Strings(problems)
		in.fail(id, verb, fmt.Errorf("restarting pod %s: %s", key, summarize(problems)), problems...)
		return
	}
	_ = in.replies.Send(apiv1.Reply{RequestID: id, Verb: verb, Phase: apiv1.Succeeded,
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
