package chaos

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"

	v1 "k8s.io/api/core/v1"

	apiv1 "github.com/mqlet/mqlet/api/v1"
)

// The invariants, by the names the report and the failures use.
const (
	invNoFinal        = "final-reply-missing"
	invDuplicateFinal = "final-reply-duplicate"
	invAfterFinal     = "reply-after-final"
	invPhaseOrder     = "reply-phase-order"
	invQuarantine     = "pod-quarantined"
	invFlip           = "running-pod-published-not-started"
	invLostUpdate     = "spec-update-lost"
	invDiverged       = "state-diverged"
	invDupSandbox     = "duplicate-sandbox"
	invAgentExit      = "agent-exited-by-itself"
	invLeftover       = "left-after-empty-sync"
	invBadMessage     = "undecodable-message"
)

var invariants = []string{invNoFinal, invDuplicateFinal, invAfterFinal, invPhaseOrder, invQuarantine, invFlip,
	invLostUpdate, invDiverged, invDupSandbox, invAgentExit, invLeftover, invBadMessage}

// violation is one broken invariant, naming the request or pod.
type violation struct {
	inv, subject, detail string
	round                int
}

// violations collects what broke, once per invariant and subject.
type violations struct {
	mu   sync.Mutex
	list []violation
	seen map[string]bool
}

func (v *violations) add(round int, inv, subject, format string, args ...any) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.seen == nil {
		v.seen = map[string]bool{}
	}
	if v.seen[inv+"\x00"+subject] {
		return
	}
	v.seen[inv+"\x00"+subject] = true
	v.list = append(v.list, violation{inv: inv, subject: subject, detail: fmt.Sprintf(format, args...), round: round})
}

func (v *violations) count(inv string) int {
	v.mu.Lock()
	defer v.mu.Unlock()
	n := 0
	for _, x := range v.list {
		if x.inv == inv {
			n++
		}
	}
	return n
}

func (v *violations) all() []violation {
	v.mu.Lock()
	defer v.mu.Unlock()
	return append([]violation(nil), v.list...)
}

// replyProblem checks the replies of one request in arrival order: phases
// never go back (accepted, in_progress, final), exactly one final reply,
// nothing after it. final says whether a final reply came at all. An exact
// copy of the final reply (same phase, message, result and timestamp) is
// QoS 1 delivering one message twice (the outbox resends what a kill left
// unacknowledged), not a second answer.
func replyProblem(replies []apiv1.Reply) (inv, detail string, final bool) {
	finals, rank := 0, 0
	var first apiv1.Reply
	for i, r := range replies {
		// The same message again is QoS 1's redelivery (the outbox sends
		// again what it had not recorded as acknowledged when the agent was
		// killed), not a reply out of order; a reader drops it as mqletctl
		// does.
		if slices.ContainsFunc(replies[:i], func(p apiv1.Reply) bool { return sameReply(p, r) }) {
			continue
		}
		if finals > 0 {
			if sameReply(r, first) {
				continue
			}
			if r.Final() {
				return invDuplicateFinal, fmt.Sprintf("final replies %s", phases(replies)), true
			}
			return invAfterFinal, fmt.Sprintf("reply %d (%s) after the final one: %s", i+1, r.Phase, phases(replies)), true
		}
		if k := apiv1.PhaseRank(r.Phase); k < rank || k == 0 {
			return invPhaseOrder, fmt.Sprintf("phase %q after a later phase: %s", r.Phase, phases(replies)), r.Final()
		} else {
			rank = k
		}
		if r.Final() {
			finals++
			first = r
		}
	}
	return "", "", finals > 0
}

// sameReply reports whether a and b are one message delivered twice.
func sameReply(a, b apiv1.Reply) bool {
	ra, _ := json.Marshal(a.Result)
	rb, _ := json.Marshal(b.Result)
	return a.Phase == b.Phase && a.Message == b.Message && a.Seq == b.Seq && a.TS.Equal(b.TS) &&
		slices.Equal(a.Errors, b.Errors) && bytes.Equal(ra, rb)
}

func phases(replies []apiv1.Reply) string {
	var out []string
	for _, r := range replies {
		s := r.Phase
		if r.Final() && r.Message != "" {
			s += " (" + r.Message + ")"
		}
		out = append(out, s)
	}
	return strings.Join(out, " → ")
}

// accepted reports whether the agent took the command into its desired
// state (an accepted reply, or any reply past it); decided is false while
// nothing came back.
func accepted(replies []apiv1.Reply) (ok, decided bool) {
	for _, r := range replies {
		if r.Phase != apiv1.Failed {
			return true, true
		}
	}
	return false, len(replies) > 0
}

// notStarted reports whether status p says container c has not started:
// the pod Pending, or c without a container id, or c waiting.
func notStarted(p *v1.Pod, c string) (bool, string) {
	if p.Status.Phase == v1.PodPending {
		return true, "phase Pending"
	}
	for _, cs := range p.Status.ContainerStatuses {
		if cs.Name != c {
			continue
		}
		switch {
		case cs.ContainerID == "":
			return true, "no container id"
		case cs.State.Waiting != nil:
			return true, "waiting: " + cs.State.Waiting.Reason
		}
		return false, ""
	}
	return true, "no status of container " + c
}

// runningID returns the id of container c when status p says it runs.
func runningID(p *v1.Pod, c string) string {
	for _, cs := range p.Status.ContainerStatuses {
		if cs.Name == c && cs.State.Running != nil && cs.ContainerID != "" {
			return strings.TrimPrefix(cs.ContainerID, "containerd://")
		}
	}
	return ""
}

// terminatedMessage returns container c's termination message when status
// p says it ended.
func terminated(p *v1.Pod, c string) (*v1.ContainerStateTerminated, bool) {
	for _, cs := range p.Status.ContainerStatuses {
		if cs.Name == c && cs.State.Terminated != nil {
			return cs.State.Terminated, true
		}
	}
	return nil, false
}

// leftovers lists what a pod left on the host: its cgroups under root in
// every hierarchy, mounts beneath podDir, directories in podDir.
func leftovers(cgroupFS, root, podDir string) []string {
	var out []string
	for _, pattern := range []string{filepath.Join(cgroupFS, "*", root, "pod*"), filepath.Join(cgroupFS, root, "pod*")} {
		dirs, _ := filepath.Glob(pattern)
		for _, d := range dirs {
			out = append(out, "cgroup "+d)
		}
	}
	if data, err := os.ReadFile("/proc/self/mountinfo"); err == nil {
		for _, line := range strings.Split(string(data), "\n") {
			if f := strings.Fields(line); len(f) > 4 && strings.HasPrefix(f[4], podDir+"/") {
				out = append(out, "mount "+f[4])
			}
		}
	}
	if entries, err := os.ReadDir(podDir); err == nil {
		for _, e := range entries {
			out = append(out, "pod directory "+filepath.Join(podDir, e.Name()))
		}
	}
	sort.Strings(out)
	return out
}
