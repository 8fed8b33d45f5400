// Package rollout is the bookkeeping of a staged rollout, with no I/O: how
// the nodes are cut into waves, what each answer does to a node's phase,
// when the rollout aborts, which nodes get a command next and which a
// rollback. mqletctl runs it (cmd/mqletctl/rollout.go) and keeps the
// result on the broker as the retained apiv1.Rollout document, so any
// process can take a rollout over from the document alone.
package rollout

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"strings"
	"time"

	apiv1 "github.com/mqlet/mqlet/api/v1"
)

// ValidateStrategy checks a strategy's numbers.
func ValidateStrategy(s apiv1.RolloutStrategy) error {
	switch {
	case s.Batch < 0 || s.BatchPercent < 0:
		return errors.New("--batch must be positive")
	case s.Batch > 0 && s.BatchPercent > 0:
		return errors.New("--batch is a count or a percentage, not both")
	case s.Batch == 0 && s.BatchPercent == 0:
		return errors.New("--batch is required (a count, or a percentage such as 25%)")
	case s.BatchPercent > 100:
		return fmt.Errorf("--batch %d%%: at most 100%%", s.BatchPercent)
	case s.Growth != 0 && (s.Growth < 1 || s.Growth > 10 || math.IsNaN(s.Growth)):
		return fmt.Errorf("--growth %v: want 1 (equal waves) to 10", s.Growth)
	case s.MaxFailures < 0:
		return errors.New("--max-failures must not be negative")
	case s.MaxFailurePercent < 0 || s.MaxFailurePercent > 100:
		return fmt.Errorf("--max-failures %d%%: want 0%% to 100%%", s.MaxFailurePercent)
	case s.MinExecuted < 0:
		return errors.New("--min-executed must not be negative")
	case s.NodeTimeoutSeconds <= 0:
		return errors.New("--node-timeout must be positive")
	}
	return nil
}

// WaveSizes cuts n nodes into waves: the first of Batch nodes (or
// BatchPercent of n, rounded up, at least one), each next one Growth times
// the one before (rounded up), the last one what is left.
func WaveSizes(n int, s apiv1.RolloutStrategy) []int {
	if n <= 0 {
		return nil
	}
	size := float64(s.Batch)
	if s.BatchPercent > 0 {
		size = math.Ceil(float64(n) * float64(s.BatchPercent) / 100)
	}
	if size < 1 {
		size = 1
	}
	growth := s.Growth
	if growth < 1 {
		growth = 1
	}
	var out []int
	for left := n; left > 0; {
		w := int(math.Min(size, float64(left)))
		out = append(out, w)
		left -= w
		size = math.Ceil(size * growth)
	}
	return out
}

// New makes the document of a rollout over nodes (in name order, cut
// into waves); every node is Pending.
func New(id string, target apiv1.RolloutTarget, s apiv1.RolloutStrategy, manifest string, objects []apiv1.ObjectRef, nodes []string, now time.Time) (*apiv1.Rollout, error) {
	if err := apiv1.ValidateRolloutID(id); err != nil {
		return nil, err
	}
	if err := ValidateStrategy(s); err != nil {
		return nil, err
	}
	if len(nodes) == 0 {
		return nil, errors.New("no node to roll out to")
	}
	sorted := append([]string(nil), nodes...)
	sort.Strings(sorted)
	r := &apiv1.Rollout{ID: id, Target: target, Strategy: s, Manifest: manifest, Objects: objects, Phase: apiv1.RolloutRunning, CreatedAt: now, UpdatedAt: now}
	i := 0
	for w, size := range WaveSizes(len(sorted), s) {
		for j := 0; j < size; j++ {
			if i > 0 && sorted[i] == sorted[i-1] {
				return nil, fmt.Errorf("node %s named twice", sorted[i])
			}
			r.Nodes = append(r.Nodes, apiv1.RolloutNode{Node: sorted[i], Wave: w + 1, Phase: apiv1.NodePending})
			i++
		}
	}
	r.Totals = Totals(r)
	return r, nil
}

// node returns the entry of name, nil when it is not in the rollout.
func node(r *apiv1.Rollout, name string) *apiv1.RolloutNode {
	for i := range r.Nodes {
		if r.Nodes[i].Node == name {
			return &r.Nodes[i]
		}
	}
	return nil
}

func finished(phase string) bool {
	switch phase {
	case apiv1.NodeSucceeded, apiv1.NodeFailed, apiv1.NodeCancelled, apiv1.NodeRolledBack, apiv1.NodeRollbackFailed:
		return true
	}
	return false
}

// Totals counts the nodes by phase.
func Totals(r *apiv1.Rollout) apiv1.RolloutTotals {
	t := apiv1.RolloutTotals{Targeted: len(r.Nodes)}
	for _, n := range r.Nodes {
		switch n.Phase {
		case apiv1.NodePending, apiv1.NodeSent, apiv1.NodeApplied:
			t.Pending++
			if n.OfflineSince != nil {
				t.Offline++
			}
		case apiv1.NodeSucceeded:
			t.Succeeded++
		case apiv1.NodeFailed:
			t.Failed++
		case apiv1.NodeCancelled:
			t.Cancelled++
		case apiv1.NodeRollingBack:
			t.RollingBack++
		case apiv1.NodeRolledBack:
			t.RolledBack++
		case apiv1.NodeRollbackFailed:
			t.RollbackFailed++
		}
		if n.Changed && (n.Phase == apiv1.NodeApplied || n.Phase == apiv1.NodeSucceeded || n.Phase == apiv1.NodeFailed) {
			t.Applied++
		}
	}
	return t
}

// AbortReason says why the rollout must stop now, "" when it goes on:
// more failed nodes than MaxFailures, or (MaxFailurePercent set) more than
// that share of the finished nodes, once MinExecuted nodes finished.
func AbortReason(r *apiv1.Rollout) string {
	s := r.Strategy
	failed, executed := 0, 0
	var names []string
	for _, n := range r.Nodes {
		switch n.Phase {
		case apiv1.NodeFailed:
			failed++
			executed++
			names = append(names, n.Node+": "+cut(n.Message, 160))
		case apiv1.NodeSucceeded:
			executed++
		}
	}
	minExec := s.MinExecuted
	if s.MaxFailurePercent > 0 && minExec < 1 {
		minExec = 1
	}
	if executed < minExec || failed == 0 {
		return ""
	}
	if len(names) > 3 {
		names = append(names[:3], "...")
	}
	if s.MaxFailurePercent > 0 {
		if failed*100 > s.MaxFailurePercent*executed {
			return fmt.Sprintf("%d of %d finished node(s) failed (%s), more than --max-failures %d%%", failed, executed, strings.Join(names, ", "), s.MaxFailurePercent)
		}
		return ""
	}
	if failed > s.MaxFailures {
		return fmt.Sprintf("%d node(s) failed (%s), more than --max-failures %d", failed, strings.Join(names, ", "), s.MaxFailures)
	}
	return ""
}

// Action is one command the runner must send.
type Action struct {
	Kind ActionKind
	Node string
}

// ActionKind is what an Action sends.
type ActionKind int

const (
	// Send the rollout's manifests (after reading what the node holds,
	// when the document does not know it yet).
	Send ActionKind = iota + 1
	// Rollback sends the node's previous manifests back (and deletes what
	// it did not hold).
	Rollback
)

func (k ActionKind) String() string {
	switch k {
	case Send:
		return "send"
	case Rollback:
		return "rollback"
	}
	return "unknown"
}

// Step moves the rollout on at now: fails the nodes past their deadline,
// aborts when a criterion is met (cancelling the unsent nodes and, with
// rollback, marking the changed ones for it), opens the next wave when
// every online node of the current one finished, ends the rollout when no
// node is left to wait for. It returns the commands to send; inFlight
// names the nodes whose command is still being answered (none is sent to
// them again).
func Step(r *apiv1.Rollout, now time.Time, inFlight func(node string) bool) []Action {
	defer func() { r.Totals = Totals(r) }()
	var out []Action
	if r.Phase == apiv1.RolloutRunning {
		for i := range r.Nodes {
			n := &r.Nodes[i]
			// A node left Applied without an answer by a runner that
			// stopped is sent again below, not timed out.
			watched := n.Answer != "" || inFlight(n.Node)
			if n.Phase == apiv1.NodeApplied && watched && n.OfflineSince == nil && n.Deadline != nil && now.After(*n.Deadline) {
				finish(n, apiv1.NodeFailed, fmt.Sprintf("not Ready within %ds after it accepted (--node-timeout)", r.Strategy.NodeTimeoutSeconds), now)
			}
		}
		if reason := AbortReason(r); reason != "" {
			Abort(r, reason, r.Strategy.Rollback, now)
		}
	}
	if r.Phase == apiv1.RolloutRunning {
		last := 0
		for _, n := range r.Nodes {
			last = max(last, n.Wave)
		}
		if r.Wave == 0 {
			r.Wave = 1
		}
		for r.Wave < last && waveDone(r, r.Wave) {
			r.Wave++
		}
		for _, n := range r.Nodes {
			if n.Wave > r.Wave || inFlight(n.Node) {
				continue
			}
			switch {
			case n.Phase == apiv1.NodePending && n.OfflineSince == nil:
				out = append(out, Action{Send, n.Node})
			case n.Phase == apiv1.NodeSent || (n.Phase == apiv1.NodeApplied && n.Answer == ""):
				// Sent by a process that stopped before the answer: sent
				// again (an apply of what a node holds changes nothing).
				out = append(out, Action{Send, n.Node})
			}
		}
		all := true
		failed := 0
		for _, n := range r.Nodes {
			all = all && finished(n.Phase)
			if n.Phase == apiv1.NodeFailed {
				failed++
			}
		}
		if all {
			r.Phase = apiv1.RolloutSucceeded
			r.Reason = fmt.Sprintf("%d node(s) succeeded", len(r.Nodes)-failed)
			if failed > 0 {
				r.Reason += fmt.Sprintf(", %d failed (within --max-failures)", failed)
			}
		}
		return out
	}
	for _, n := range r.Nodes {
		if n.Phase == apiv1.NodeRollingBack && !inFlight(n.Node) {
			out = append(out, Action{Rollback, n.Node})
		}
	}
	return out
}

// waveDone: every node of waves up to w finished, or waits offline (an
// offline node does not hold the rollout up; it gets its command when it
// returns).
func waveDone(r *apiv1.Rollout, w int) bool {
	for _, n := range r.Nodes {
		if n.Wave <= w && !finished(n.Phase) && n.OfflineSince == nil {
			return false
		}
	}
	return true
}

// Done reports whether nothing is left to wait for: the rollout ended and
// no node has a command under way.
func Done(r *apiv1.Rollout) bool {
	if r.Phase == apiv1.RolloutRunning {
		return false
	}
	for _, n := range r.Nodes {
		switch n.Phase {
		case apiv1.NodeSent, apiv1.NodeApplied, apiv1.NodeRollingBack:
			return false
		}
	}
	return true
}

// Abort ends the rollout: no node not yet sent gets anything (Cancelled)
// and, with rollback, every node that holds or may hold the rollout's
// manifests is marked for its previous ones.
func Abort(r *apiv1.Rollout, reason string, rollback bool, now time.Time) {
	if r.Phase != apiv1.RolloutRunning {
		return
	}
	r.Phase, r.Reason = apiv1.RolloutAborted, reason
	r.Strategy.Rollback = r.Strategy.Rollback || rollback
	for i := range r.Nodes {
		n := &r.Nodes[i]
		switch {
		case n.Phase == apiv1.NodePending:
			finish(n, apiv1.NodeCancelled, "not sent: the rollout was aborted", now)
		case rollback && (n.Changed || n.Phase == apiv1.NodeSent || n.Phase == apiv1.NodeApplied):
			// A late answer to its apply no longer counts: only the
			// rollback's own request (Sent) does.
			n.Phase, n.RequestID, n.Answer, n.Deadline = apiv1.NodeRollingBack, "", "", nil
		}
	}
	r.Totals = Totals(r)
}

// cut bounds a node's message quoted in another.
func cut(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}

func finish(n *apiv1.RolloutNode, phase, msg string, now time.Time) {
	n.Phase, n.Message = phase, msg
	t := now
	n.FinishedAt = &t
	n.Deadline = nil
}

// Sent records the command sent to a node.
func Sent(r *apiv1.Rollout, name, requestID string, now time.Time) {
	n := node(r, name)
	if n == nil {
		return
	}
	n.RequestID, n.Answer = requestID, ""
	t := now
	n.SentAt = &t
	if n.Phase == apiv1.NodePending || n.Phase == apiv1.NodeApplied {
		n.Phase, n.Message = apiv1.NodeSent, ""
		n.AcceptedAt, n.Deadline = nil, nil
	}
}

// Previous records what a node held of the manifest's objects before its
// first command: digest names its manifest in r.Previous ("" for none),
// absent the objects it did not hold.
func Previous(r *apiv1.Rollout, name, digest, manifest string, absent []apiv1.ObjectRef) {
	n := node(r, name)
	if n == nil || n.PreviousKnown {
		return
	}
	n.PreviousKnown, n.Previous, n.Absent = true, digest, absent
	if digest != "" {
		if r.Previous == nil {
			r.Previous = map[string]string{}
		}
		r.Previous[digest] = manifest
	}
}

// Accepted records that a node stored the rollout's manifests (request
// requestID): its node timeout starts now. pods are the manifest's pods as
// the node stored them.
func Accepted(r *apiv1.Rollout, name, requestID string, pods []apiv1.RolloutPod, now time.Time) {
	n := node(r, name)
	if n == nil || n.RequestID != requestID || n.Phase != apiv1.NodeSent {
		return
	}
	n.Phase, n.Changed = apiv1.NodeApplied, true
	t, d := now, now.Add(time.Duration(r.Strategy.NodeTimeoutSeconds)*time.Second)
	n.AcceptedAt, n.Deadline = &t, &d
	if pods == nil {
		// No uids known (an answer without them): every pod of the
		// manifests must still be Ready.
		for _, o := range r.Objects {
			if o.Kind == apiv1.KindPod {
				pods = append(pods, apiv1.RolloutPod{Namespace: o.Namespace, Name: o.Name})
			}
		}
	}
	n.Pods = pods
}

// Answered records a node's final answer to request requestID: failed
// fails it (or its rollback); succeeded ends a rollback, and makes an
// apply Succeeded once its pods are Ready (PodsReady).
func Answered(r *apiv1.Rollout, name, requestID string, succeeded bool, msg string, now time.Time) {
	n := node(r, name)
	if n == nil || n.RequestID != requestID {
		return
	}
	n.Answer = apiv1.Failed
	if succeeded {
		n.Answer = apiv1.Succeeded
	}
	switch n.Phase {
	case apiv1.NodeSent, apiv1.NodeApplied:
		if !succeeded {
			finish(n, apiv1.NodeFailed, msg, now)
			return
		}
		if n.Phase == apiv1.NodeSent {
			// succeeded without accepted (an agent that skips it): stored.
			Accepted(r, name, requestID, nil, now)
		}
		if allReady(n) {
			finish(n, apiv1.NodeSucceeded, msg, now)
		} else {
			n.Message = "succeeded; waiting for its pods to be Ready: " + msg
		}
	case apiv1.NodeRollingBack:
		if was := n.Message; was != "" {
			msg += " (was: " + cut(was, 200) + ")"
		}
		if succeeded {
			finish(n, apiv1.NodeRolledBack, msg, now)
		} else {
			finish(n, apiv1.NodeRollbackFailed, msg, now)
		}
	}
}

// PodView is what a node's retained status says of one pod.
type PodView struct {
	UID                string
	ObservedGeneration int64
	Ready              bool
}

// PodsReady updates a node's pods from its retained statuses (view; ok
// false for a pod without one) and makes a node that answered succeeded
// Succeeded once every pod is Ready for the uid and generation it stored.
func PodsReady(r *apiv1.Rollout, name string, view func(namespace, name string) (PodView, bool), now time.Time) {
	n := node(r, name)
	if n == nil || n.Phase != apiv1.NodeApplied {
		return
	}
	for i := range n.Pods {
		p := &n.Pods[i]
		v, ok := view(p.Namespace, p.Name)
		p.Ready = ok && v.Ready && (p.UID == "" || v.UID == p.UID) && v.ObservedGeneration >= p.Generation
	}
	if n.Answer == apiv1.Succeeded && allReady(n) {
		finish(n, apiv1.NodeSucceeded, "succeeded; pods Ready", now)
	}
}

func allReady(n *apiv1.RolloutNode) bool {
	for _, p := range n.Pods {
		if !p.Ready {
			return false
		}
	}
	return true
}

// Online records a node's retained state: offline since at, or back
// online at now (its deadline moves on by the time it was away).
func Online(r *apiv1.Rollout, name string, online bool, at, now time.Time) {
	n := node(r, name)
	if n == nil {
		return
	}
	switch {
	case !online && n.OfflineSince == nil:
		t := at
		if t.IsZero() || t.After(now) {
			t = now
		}
		n.OfflineSince = &t
	case online && n.OfflineSince != nil:
		if n.Deadline != nil && now.After(*n.OfflineSince) {
			d := n.Deadline.Add(now.Sub(*n.OfflineSince))
			n.Deadline = &d
		}
		n.OfflineSince = nil
	}
}
