package chaos

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/mqlet/mqlet/agent/podworker"
	apiv1 "github.com/mqlet/mqlet/api/v1"
)

// stuckAfter is how long a "not started" claim about a container that
// still runs may stand before it is a flip (a replaced container takes at
// most its grace period, 2 s, to stop).
const stuckAfter = 10 * time.Second

// checkStatuses reads the pod status messages since the last check: a
// quarantine is a violation; so is a message saying a pod's container had
// not started while the container last published as running ran on (the
// same container published running again after it, or still running long
// after it).
func (r *run) checkStatuses() {
	for _, s := range r.gen.slots {
		name := s.name
		msgs := r.rec.statusesFrom(name, r.statusIdx[name])
		r.statusIdx[name] += len(msgs)
		for _, m := range msgs {
			if m.pod == nil {
				r.settleClaims(name, "", time.Time{})
				continue
			}
			uid := string(m.pod.UID)
			if m.pod.Status.Reason == "Quarantined" && !r.ruleQuarantined(name, uid) {
				r.v.add(r.round, invQuarantine, "pod "+name+" uid "+uid, "published Quarantined: %s", m.pod.Status.Message)
			}
			if id := runningID(m.pod, "main"); id != "" {
				r.settleClaims(name, id, m.at)
				r.claims[name] = append(r.claims[name], claim{id: id, uid: uid}) // the container last seen running
				continue
			}
			if ns, why := notStarted(m.pod, "main"); ns {
				if prev := r.lastRunning(name); prev != nil && prev.uid == uid {
					r.claims[name] = append(r.claims[name], claim{at: m.at, id: prev.id, uid: uid, why: why})
				}
			}
		}
		// A claim left standing while its container still runs.
		var keep []claim
		for _, c := range r.claims[name] {
			if !c.at.IsZero() && time.Since(c.at) > stuckAfter {
				if ran, ok := r.cri.ranAfter(c.id, c.at.Add(stuckAfter)); ok && ran {
					r.flip(name, c, "and it still ran "+stuckAfter.String()+" later")
				}
				continue
			}
			keep = append(keep, c)
		}
		r.claims[name] = keep
	}
}

// lastRunning is the pod's container last published as running.
func (r *run) lastRunning(name string) *claim {
	for i := len(r.claims[name]) - 1; i >= 0; i-- {
		if r.claims[name][i].at.IsZero() {
			return &r.claims[name][i]
		}
	}
	return nil
}

// settleClaims ends the pod's open claims at a message publishing id as
// running (empty: the pod gone): the same container running again means
// each claim was false.
func (r *run) settleClaims(name, id string, at time.Time) {
	for _, c := range r.claims[name] {
		if c.at.IsZero() {
			continue
		}
		switch {
		case id != "" && c.id == id:
			r.flip(name, c, fmt.Sprintf("then published running again with the same container at %s", at.Format("15:04:05.000")))
		default:
			if ran, ok := r.cri.ranAfter(c.id, c.at.Add(stuckAfter)); ok && ran {
				r.flip(name, c, "and it still ran "+stuckAfter.String()+" later")
			} else if !ok {
				r.unverifiable++
			}
		}
	}
	r.claims[name] = nil
}

func (r *run) flip(name string, c claim, how string) {
	r.v.add(r.round, invFlip, fmt.Sprintf("pod %s uid %s at %s", name, c.uid, c.at.Format("15:04:05.000")),
		"published %s while its container %.12s ran, %s", c.why, c.id, how)
}

// checkEvents reports Quarantined events.
func (r *run) checkEvents() {
	evs := r.rec.eventsFrom(r.eventIdx)
	r.eventIdx += len(evs)
	for _, e := range evs {
		if e.Reason == "Quarantined" && !(e.InvolvedObject.Namespace == r.ns && r.ruleQuarantined(e.InvolvedObject.Name, string(e.InvolvedObject.UID))) {
			r.v.add(r.round, invQuarantine, fmt.Sprintf("pod %s/%s event", e.InvolvedObject.Namespace, e.InvolvedObject.Name), "Quarantined event: %s", e.Message)
		}
	}
}

// finish sends the final empty sync and checks that nothing is left: no
// sandbox or container of the namespace, no pod cgroup, mount or directory,
// no retained pod status; then every request's replies.
func (r *run) finish() {
	r.round++
	r.t.Logf("final: an empty sync")
	c := r.gen.syncTo(newModel())
	r.send(c)
	r.quiet(false)
	podDir := filepath.Join(r.stateDir, "pods")
	cgroupFS := "/sys/fs/cgroup"
	deadline := time.Now().Add(60 * time.Second)
	tick := time.NewTicker(300 * time.Millisecond)
	defer tick.Stop()
	var left []string
	for {
		left = leftovers(cgroupFS, r.cgroupRoot, podDir)
		if s, err := r.cri.snapshot(); err == nil {
			for _, sb := range s.sandboxes {
				left = append(left, fmt.Sprintf("sandbox %.12s of %s", sb.Id, sb.Labels[labelPodName]))
			}
			for _, c := range s.containers {
				left = append(left, fmt.Sprintf("container %.12s of %s", c.Id, c.Labels[labelPodName]))
			}
		}
		if len(left) == 0 || time.Now().After(deadline) {
			break
		}
		<-tick.C
	}
	for _, l := range left {
		r.v.add(r.round, invLeftover, l, "left 60s after the final empty sync")
	}
	r.leftCount = len(left)
	r.checkStatuses()
	r.checkEvents()
	r.checkReplies(true)
	r.rec.mu.Lock()
	bad := append([]string(nil), r.rec.bad...)
	r.rec.mu.Unlock()
	for _, b := range bad {
		r.v.add(r.round, invBadMessage, b, "did not decode")
	}
}

// report prints what the run did and saw, fails the test on each
// violation, and writes the report to MQLET_CHAOS_REPORT when set.
func (r *run) report() {
	var b strings.Builder
	finals := map[string]int{}
	failedWhy := map[string]int{}
	for _, c := range r.sent {
		for _, rep := range r.replyList(c.id) {
			if rep.Final() {
				finals[rep.Phase]++
				if rep.Phase == apiv1.Failed {
					failedWhy[cut(rep.Message, 90)]++
				}
			}
		}
	}
	fmt.Fprintf(&b, "chaos report (seed %d, %v, %d rounds)\n", r.cfg.seed, time.Since(r.began).Round(time.Second), r.round)
	fmt.Fprintf(&b, "  commands sent        %d (+%d gets)\n", len(r.sent), len(r.gets))
	fmt.Fprintf(&b, "  final replies        %d succeeded, %d failed\n", finals[apiv1.Succeeded], finals[apiv1.Failed])
	for _, why := range sortedNames(failedWhy) {
		fmt.Fprintf(&b, "      failed x%-4d %s\n", failedWhy[why], why)
	}
	var kinds []string
	for _, k := range sortedNames(r.kills) {
		kinds = append(kinds, fmt.Sprintf("%s %d", k, r.kills[k]))
	}
	fmt.Fprintf(&b, "  agent kills          %d (%s)\n", r.totalKills(), strings.Join(kinds, ", "))
	fmt.Fprintf(&b, "  containerd pauses    %d, broker restarts %d\n", r.pauses, r.brokerRestarts)
	fmt.Fprintf(&b, "  quarantines          %d (besides %d by the rule of %d deaths in a row, after as many kills in a row)\n", r.v.count(invQuarantine), len(r.ruleQuarantines), podworker.SuspectDeaths)
	fmt.Fprintf(&b, "  flips                %d (not started while running; %d claims not verifiable)\n", r.v.count(invFlip), r.unverifiable)
	fmt.Fprintf(&b, "  lost updates         %d\n", r.v.count(invLostUpdate))
	fmt.Fprintf(&b, "  missing finals       %d, duplicate finals %d, after final %d, out of order %d\n",
		r.v.count(invNoFinal), r.v.count(invDuplicateFinal), r.v.count(invAfterFinal), r.v.count(invPhaseOrder))
	fmt.Fprintf(&b, "  diverged             %d (rounds not converged: %d), duplicate sandboxes %d, agent exits %d\n",
		r.v.count(invDiverged), r.notConverged, r.v.count(invDupSandbox), r.v.count(invAgentExit))
	fmt.Fprintf(&b, "  left after empty sync %d (cgroups, mounts, dirs, CRI)\n", r.leftCount)
	p50, p99, max := percentiles(r.convergence)
	fmt.Fprintf(&b, "  convergence after a kill (%d samples): p50 %v, p99 %v, max %v\n", len(r.convergence), p50, p99, max)
	all := r.v.all()
	for _, inv := range invariants {
		n := 0
		for _, x := range all {
			if x.inv == inv {
				n++
			}
		}
		status := "held"
		if n > 0 {
			status = fmt.Sprintf("BROKEN %d", n)
		}
		fmt.Fprintf(&b, "  invariant %-36s %s\n", inv, status)
	}
	for _, x := range all {
		fmt.Fprintf(&b, "  VIOLATION %s: %s (round %d, seed %d): %s\n", x.inv, x.subject, x.round, r.cfg.seed, x.detail)
	}
	text := b.String()
	fmt.Print(text)
	if r.cfg.reportPath != "" {
		if err := os.WriteFile(r.cfg.reportPath, []byte(text), 0o644); err != nil {
			r.t.Errorf("writing the report: %v", err)
		}
	}
	for _, x := range all {
		r.t.Errorf("invariant %s broken: %s (round %d, seed %d): %s", x.inv, x.subject, x.round, r.cfg.seed, x.detail)
	}
}

func cut(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

func percentiles(d []time.Duration) (p50, p99, max time.Duration) {
	if len(d) == 0 {
		return 0, 0, 0
	}
	s := slices.Clone(d)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	at := func(q float64) time.Duration { return s[min(len(s)-1, int(q*float64(len(s))))].Round(time.Millisecond) }
	return at(0.50), at(0.99), s[len(s)-1].Round(time.Millisecond)
}

// cleanUp stops what the run left: containerd resumed, the namespace swept
// from CRI, mounts beneath the state dir undone, the cgroup root removed.
func (r *run) cleanUp(dir string) {
	if r.containerd != 0 {
		_ = syscall.Kill(r.containerd, syscall.SIGCONT)
	}
	if r.agent != nil {
		r.agent.stop()
	}
	if err := r.cri.sweep(); err != nil {
		r.t.Logf("sweep: %v", err)
	}
	if data, err := os.ReadFile("/proc/self/mountinfo"); err == nil {
		var mounts []string
		for _, line := range strings.Split(string(data), "\n") {
			if f := strings.Fields(line); len(f) > 4 && strings.HasPrefix(f[4], dir+"/") {
				mounts = append(mounts, f[4])
			}
		}
		sort.Sort(sort.Reverse(sort.StringSlice(mounts)))
		for _, m := range mounts {
			_ = exec.Command("umount", "-l", m).Run()
		}
	}
	removeCgroups("/sys/fs/cgroup/*"+r.cgroupRoot, "/sys/fs/cgroup"+r.cgroupRoot)
	if !r.t.Failed() {
		_ = os.RemoveAll(dir)
	} else {
		r.t.Logf("kept %s (agent log, state)", dir)
	}
}

// removeCgroups rmdirs the cgroup trees matching the patterns, deepest
// first; a cgroup still in use refuses and stays.
func removeCgroups(patterns ...string) {
	for _, pattern := range patterns {
		roots, _ := filepath.Glob(pattern)
		for _, root := range roots {
			var dirs []string
			_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
				if err == nil && d.IsDir() {
					dirs = append(dirs, p)
				}
				return nil
			})
			for i := len(dirs) - 1; i >= 0; i-- {
				_ = os.Remove(dirs[i])
			}
		}
	}
}
