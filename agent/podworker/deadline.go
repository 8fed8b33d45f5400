package podworker

import (
	"context"
	"fmt"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/mqlet/mqlet/agent/podstatus"
	"github.com/mqlet/mqlet/cri"
)

// The kubelet's reason and message for a pod past its activeDeadlineSeconds.
const (
	ReasonDeadlineExceeded = "DeadlineExceeded"
	MsgDeadlineExceeded    = "Pod was active on the node longer than the specified deadline"
)

// enforceDeadline fails a pod that has been active longer than its
// activeDeadlineSeconds, counted from its status.startTime (kept in the
// published status, else the runtime's first sandbox, so a restarted mqlet
// counts from the same moment): the pod is reported Failed with reason
// DeadlineExceeded, its containers are stopped (Killing) and it is not
// synced again, so nothing restarts. A pod before its deadline has the
// runner's timer armed to queue it then. rs is the pod's runtime status
// (nil when it could not be read). handled says the pod was failed and
// must not be synced.
func (p *Pool) enforceDeadline(life context.Context, r *runner, pod *v1.Pod, rs *cri.PodStatus) (handled bool, err error) {
	if pod.Spec.ActiveDeadlineSeconds == nil {
		r.stopDeadline()
		return false, nil
	}
	if rs == nil {
		return false, nil // the sync that follows reports the runtime error
	}
	st := p.build(pod, rs, podstatus.Hints{})
	if st.StartTime == nil || st.StartTime.IsZero() {
		return false, nil
	}
	at := st.StartTime.Add(time.Duration(*pod.Spec.ActiveDeadlineSeconds) * time.Second)
	if time.Now().Before(at) {
		key := r.key
		r.armDeadline(at, func() { p.queue.Add(key) })
		return false, nil
	}
	r.stopDeadline()
	failed := podstatus.Hints{Terminal: true, FailReason: ReasonDeadlineExceeded, FailMessage: MsgDeadlineExceeded}
	if prev, ok := p.status.Get(pod.Namespace, pod.Name); !ok || prev.UID != pod.UID || prev.Status.Reason != ReasonDeadlineExceeded {
		p.log.Info().Str("pod", r.key).Int64("activeDeadlineSeconds", *pod.Spec.ActiveDeadlineSeconds).
			Time("startTime", st.StartTime.Time).Msg("pod past its active deadline; failing it")
		p.events.Event(pod, v1.EventTypeNormal, ReasonDeadlineExceeded, MsgDeadlineExceeded)
	}
	// Reported before the stop, which may take the whole grace period.
	p.publish(pod, rs, failed, "")
	// A failed pod is not restarted: a restart request waiting is answered.
	for {
		req, ok := p.takeRestart(r.key, string(pod.UID))
		if !ok {
			break
		}
		req.done(fmt.Errorf("pod %s is Failed (%s: %s) and is not restarted", r.key, ReasonDeadlineExceeded, MsgDeadlineExceeded))
	}
	if pr := p.opts.Probes; pr != nil {
		pr.Track(pod, rs)
	}
	// The stop may take the whole grace period: it runs beside the slots,
	// and the sync after it publishes the stopped containers.
	if rs.Live() {
		p.stopAsync(life, r, pod)
	}
	return true, nil
}
