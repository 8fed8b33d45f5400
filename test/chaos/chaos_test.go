package chaos

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mqlet/mqlet/agent/podworker"
	apiv1 "github.com/mqlet/mqlet/api/v1"
	"github.com/mqlet/mqlet/internal/testutil/containerd"
	"github.com/mqlet/mqlet/internal/testutil/mosquitto"
)

// config is a run's length and faults, from the environment:
//
//	MQLET_CHAOS_DURATION          how long commands are sent (default 3m)
//	MQLET_CHAOS_KILLS             the fewest agent kills of a run (default 10)
//	MQLET_CHAOS_SEED              the seed to reproduce a run (default: new)
//	MQLET_CHAOS_PAUSE_CONTAINERD  SIGSTOP/SIGCONT windows of the test's own containerd (default 1)
//	MQLET_CHAOS_BROKER_RESTARTS   broker restarts per run (default 1)
//	MQLET_CHAOS_QUIET             the bound of each quiet period (default 120s)
//	MQLET_CHAOS_REPORT            a file the report is also written to
//	MQLET_CHAOS_WORKDIR           where the agent's state dir and log go (default a temp dir)
type config struct {
	duration        time.Duration
	minKills        int
	seed            uint64
	pauseContainerd bool
	brokerRestarts  int
	quietBound      time.Duration
	reportPath      string
	workDir         string
}

func loadConfig(t *testing.T) config {
	t.Helper()
	cfg := config{duration: 3 * time.Minute, minKills: 10, seed: uint64(time.Now().UnixNano()), pauseContainerd: true,
		brokerRestarts: 1, quietBound: 120 * time.Second, reportPath: os.Getenv("MQLET_CHAOS_REPORT"), workDir: os.Getenv("MQLET_CHAOS_WORKDIR")}
	parse := func(key string, set func(string) error) {
		if v := os.Getenv(key); v != "" {
			if err := set(v); err != nil {
				t.Fatalf("%s=%q: %v", key, v, err)
			}
		}
	}
	parse("MQLET_CHAOS_DURATION", func(v string) (err error) { cfg.duration, err = time.ParseDuration(v); return })
	parse("MQLET_CHAOS_QUIET", func(v string) (err error) { cfg.quietBound, err = time.ParseDuration(v); return })
	parse("MQLET_CHAOS_KILLS", func(v string) (err error) { cfg.minKills, err = strconv.Atoi(v); return })
	parse("MQLET_CHAOS_BROKER_RESTARTS", func(v string) (err error) { cfg.brokerRestarts, err = strconv.Atoi(v); return })
	parse("MQLET_CHAOS_SEED", func(v string) (err error) { cfg.seed, err = strconv.ParseUint(v, 10, 64); return })
	parse("MQLET_CHAOS_PAUSE_CONTAINERD", func(v string) (err error) { cfg.pauseContainerd, err = strconv.ParseBool(v); return })
	return cfg
}

// run is one chaos run: the agent, its broker, the operator's recorder,
// the model and what was seen.
type run struct {
	t      *testing.T
	cfg    config
	rng    *rand.Rand
	gen    *gen
	rec    *recorder
	cri    *runtime
	agent  *agentProc
	broker *mosquitto.Broker

	node, ns, stateDir, cgroupRoot string
	containerd                     int // pid of the test's own containerd, 0: no pauses

	sent     []command
	gets     []string
	getSeq   int
	done     map[string]bool // requests whose replies were checked complete
	excluded map[string]bool // pods found broken, left out until a command touches them
	round    int
	v        violations

	statusIdx map[string]int
	claims    map[string][]claim
	eventIdx  int

	kills map[string]int
	// killsInRow counts the kills since the agent last converged: the
	// agent's rule quarantines a pod whose sync was in flight at
	// podworker.SuspectDeaths deaths in a row, so that many kills of ours
	// (a kill and two during the adoption that follows) can meet it.
	killsInRow int
	// ruleQuarantines are the pods (name and uid) quarantined by that rule
	// after at least that many kills in a row: the documented trade-off,
	// reported apart, not a violation.
	ruleQuarantines map[string]bool
	pauses          int
	brokerRestarts  int
	convergence     []time.Duration
	notConverged    int
	unverifiable    int
	leftCount       int
	onlinesAtStart  int
	roundFrom       int // index of the round's first command
	began           time.Time
}

// claim is a status message saying container main of a pod had not
// started, after one saying container id ran: a flip if id ran on.
type claim struct {
	at      time.Time
	id, uid string
	why     string
}

// TestChaos drives the real mqlet with a random command stream, kills it
// at random moments and checks the invariants after every quiet period
// and at the end, after a final empty sync.
func TestChaos(t *testing.T) {
	cfg := loadConfig(t)
	r := newRun(t, cfg)
	t.Logf("chaos: seed %d (MQLET_CHAOS_SEED=%d reproduces it), duration %v, at least %d kills, node %s, namespace %s, state %s",
		cfg.seed, cfg.seed, cfg.duration, cfg.minKills, r.node, r.ns, r.stateDir)
	hardStop := time.Now().Add(2*cfg.duration + 5*time.Minute)
	if d, ok := t.Deadline(); ok && d.Add(-8*time.Minute).Before(hardStop) {
		hardStop = d.Add(-8 * time.Minute)
	}
	for time.Since(r.began) < cfg.duration || r.totalKills() < cfg.minKills {
		if time.Now().After(hardStop) {
			t.Errorf("the run reached its time limit with %d kills, fewer than %d (rounds too slow: see the convergence numbers)", r.totalKills(), cfg.minKills)
			break
		}
		r.round++
		r.doRound()
	}
	r.finish()
	r.report()
}

func newRun(t *testing.T, cfg config) *run {
	endpoint := containerd.Endpoint(t)
	suffix := strconv.FormatInt(time.Now().UnixNano()%1e9, 36)
	r := &run{t: t, cfg: cfg, rng: rand.New(rand.NewPCG(cfg.seed, cfg.seed^0x9e3779b97f4a7c15)),
		node: "chaos-" + suffix, ns: "chaos-" + suffix, cgroupRoot: "/mqlet-chaos-" + suffix,
		done: map[string]bool{}, excluded: map[string]bool{}, statusIdx: map[string]int{}, claims: map[string][]claim{},
		kills: map[string]int{}, ruleQuarantines: map[string]bool{}, began: time.Now()}
	r.gen = newGen(r.rng, r.ns, suffix)
	work := cfg.workDir
	if work == "" {
		work = os.TempDir()
	}
	if err := os.MkdirAll(work, 0o755); err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp(work, "chaos-"+suffix+"-")
	if err != nil {
		t.Fatal(err)
	}
	r.stateDir = filepath.Join(dir, "state")
	var errc error
	if r.cri, errc = connectRuntime(endpoint, r.ns); errc != nil {
		t.Fatal(errc)
	}
	// Registered first, run last: nothing of the namespace stays behind.
	t.Cleanup(func() { r.cleanUp(dir) })
	if cfg.pauseContainerd {
		r.containerd = ownContainerd(t)
	}
	// An interrupted earlier run may have left its pods: the containerd is
	// the chaos run's own, so whatever namespace "chaos-" it holds is one.
	if err := r.cri.sweepWhere(func(ns string) bool { return strings.HasPrefix(ns, "chaos-") }); err != nil {
		t.Logf("sweeping earlier runs' pods: %v", err)
	}
	removeCgroups("/sys/fs/cgroup/*/mqlet-chaos-*", "/sys/fs/cgroup/mqlet-chaos-*")
	r.broker = mosquitto.Start(t)
	if r.rec, err = connectRecorder(r.broker.URL(), r.node, r.ns); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.rec.close)
	logDir := filepath.Join(dir, "podlogs")
	conf := filepath.Join(dir, "mqlet.yaml")
	if err := os.WriteFile(conf, fmt.Appendf(nil, `runtime:
  plegPeriod: 500ms
  podLogDir: %s
  cgroupRoot: %s
pods:
  backoffBase: 1s
  backoffMax: 4s
telemetry:
  metricsInterval: 0s
gc:
  # What a kill leaves before a sandbox exists (cgroups, pod dirs) has no
  # runtime pod to remove; GC collects it. The final check waits 60 s.
  interval: 10s
  minDeadAge: 5s
`, logDir, r.cgroupRoot), 0o600); err != nil {
		t.Fatal(err)
	}
	r.agent = &agentProc{bin: mqletBin(t), logPath: filepath.Join(dir, "mqlet.log"),
		args: []string{"--node", r.node, "--state-dir", r.stateDir, "--cri-endpoint", endpoint, "--broker", r.broker.URL(),
			"--config", conf, "--log-level", "debug"}}
	if err := r.agent.start(); err != nil {
		t.Fatal(err)
	}
	if !r.rec.waitOnline(60 * time.Second) {
		t.Fatalf("mqlet not online within 60s; log %s", r.agent.logPath)
	}
	t.Cleanup(func() {
		r.agent.stop()
		if t.Failed() {
			t.Logf("mqlet log: %s", r.agent.logPath)
		}
	})
	return r
}

// ownContainerd returns the pid of the containerd this test's
// MQLET_TEST_DIR started, checked to be that one: a pause never touches
// another containerd (the e2e tests' runs beside this one).
func ownContainerd(t *testing.T) int {
	dir := os.Getenv("MQLET_TEST_DIR")
	if dir == "" {
		t.Log("MQLET_TEST_DIR unset: no containerd pauses")
		return 0
	}
	data, err := os.ReadFile(filepath.Join(dir, "containerd.pid"))
	if err != nil {
		t.Logf("no containerd pid in %s (%v): no containerd pauses", dir, err)
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		return 0
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || !strings.Contains(string(cmdline), filepath.Join(dir, "config.toml")) {
		t.Logf("pid %d is not the containerd of %s: no containerd pauses", pid, dir)
		return 0
	}
	return pid
}

func (r *run) totalKills() int {
	n := 0
	for _, k := range r.kills {
		n += k
	}
	return n
}

// wait is the fault schedule's delay (a chosen moment to strike, not a
// synchronisation: every wait for an outcome is by condition).
func wait(d time.Duration) { <-time.After(d) }

func (r *run) uniform(max time.Duration) time.Duration {
	return time.Duration(r.rng.Int64N(int64(max) + 1))
}

// doRound sends a few commands, strikes (a kill at a chosen point, maybe
// a containerd pause, maybe a broker restart), restarts the agent and
// checks everything once it is quiet.
func (r *run) doRound() {
	if r.brokerRestarts < r.cfg.brokerRestarts && time.Since(r.began) > time.Duration(r.brokerRestarts+1)*r.cfg.duration/time.Duration(r.cfg.brokerRestarts+1) {
		r.brokerRestarts++
		r.t.Logf("round %d: restarting the broker", r.round)
		r.broker.Restart()
	}
	mode := []string{"inflight", "inflight", "pod-start", "pod-start", "delete", "none"}[r.rng.IntN(6)]
	before, _ := r.cri.snapshot()
	r.roundFrom = len(r.sent)
	n := 1 + r.rng.IntN(4)
	var cmds []command
	for i := range n {
		c := r.gen.next()
		if mode == "delete" && i == n-1 && !slices.ContainsFunc(cmds, func(c command) bool { return len(c.deletes) > 0 }) && len(c.deletes) == 0 {
			c = r.gen.deletePod()
		}
		cmds = append(cmds, c)
	}
	var descs []string
	for _, c := range cmds {
		r.send(c)
		descs = append(descs, c.id+": "+c.desc)
		wait(r.uniform(300 * time.Millisecond))
	}
	r.t.Logf("%v round %d (%s): %s", time.Since(r.began).Round(time.Second), r.round, mode, strings.Join(descs, "; "))
	if r.containerd != 0 && r.rng.IntN(100) < 15 {
		r.pauseContainerd()
	}
	killed := false
	switch mode {
	case "inflight":
		wait(r.uniform(2500 * time.Millisecond))
		killed = r.kill(mode)
	case "pod-start":
		// Half the time at the first new pod cgroup (made before the
		// sandbox), else at the first new sandbox or container in CRI.
		atCgroup := r.rng.IntN(2) == 0
		cgroupsBefore := r.podCgroups()
		r.until(10*time.Second, func(s snapshot) bool {
			if atCgroup {
				for _, d := range r.podCgroups() {
					if !slices.Contains(cgroupsBefore, d) {
						return true
					}
				}
				return false
			}
			for id := range s.ids() {
				if !before.ids()[id] {
					return true
				}
			}
			return false
		})
		if atCgroup {
			mode = "pod-start-cgroup"
		}
		killed = r.kill(mode)
	case "delete":
		var deleted []string
		for _, c := range cmds {
			deleted = append(deleted, c.deletes...)
		}
		if r.rng.IntN(2) == 0 {
			wait(r.uniform(1500 * time.Millisecond))
		} else {
			r.until(10*time.Second, func(s snapshot) bool {
				for _, name := range deleted {
					if len(before.running(name)) > len(s.running(name)) || len(before.readySandboxes(name)) > len(s.readySandboxes(name)) {
						return true
					}
				}
				return false
			})
		}
		killed = r.kill(mode)
	}
	if killed {
		wait(r.uniform(time.Second))
		r.restart()
		for i := 0; i < 2 && r.rng.IntN(100) < 35; i++ {
			wait(r.uniform(1500 * time.Millisecond))
			if r.kill("adoption") {
				r.restart()
			}
		}
	}
	r.quiet(killed)
}

// send publishes c, and brings a pod it names back into the checks.
func (r *run) send(c command) {
	r.sent = append(r.sent, c)
	for name := range r.excluded {
		if strings.Contains(c.desc, "pod "+name+" ") || slices.Contains(c.deletes, name) || c.verb == "sync" {
			delete(r.excluded, name)
		}
	}
	if err := r.rec.publish(c.verb, c.id, c.payload); err != nil {
		r.t.Fatalf("round %d: %v", r.round, err)
	}
}

// until polls CRI every 25 ms until cond holds or timeout passes.
func (r *run) until(timeout time.Duration, cond func(snapshot) bool) {
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(25 * time.Millisecond)
	defer tick.Stop()
	for time.Now().Before(deadline) {
		if s, err := r.cri.snapshot(); err == nil && cond(s) {
			return
		}
		<-tick.C
	}
}

// kill SIGKILLs the agent; false when it had already exited by itself
// (reported: nothing but the run kills it).
func (r *run) kill(mode string) bool {
	if !r.agent.alive() {
		r.v.add(r.round, invAgentExit, fmt.Sprintf("start %d", r.agent.starts), "mqlet exited by itself: %s (log %s)", r.agent.exitDescription(), r.agent.logPath)
		r.restart()
		return false
	}
	r.agent.kill9()
	r.kills[mode]++
	r.killsInRow++
	return true
}

func (r *run) restart() {
	r.onlinesAtStart = r.rec.onlineCount()
	if err := r.agent.start(); err != nil {
		r.t.Fatalf("round %d: %v", r.round, err)
	}
}

// pauseContainerd stops the test's own containerd for up to 2 s.
func (r *run) pauseContainerd() {
	wait(r.uniform(time.Second))
	d := 300*time.Millisecond + r.uniform(1700*time.Millisecond)
	if err := syscall.Kill(r.containerd, syscall.SIGSTOP); err != nil {
		r.t.Logf("SIGSTOP containerd %d: %v", r.containerd, err)
		return
	}
	r.pauses++
	wait(d)
	if err := syscall.Kill(r.containerd, syscall.SIGCONT); err != nil {
		r.t.Fatalf("SIGCONT containerd %d: %v", r.containerd, err)
	}
}

// quiet waits until CRI, the retained status and the store agree with
// the model (measuring the convergence after a kill), then until the
// round's commands have their final replies, and checks the invariants.
func (r *run) quiet(killed bool) {
	since, onlines := r.agent.startedAt, r.onlinesAtStart
	deadline := time.Now().Add(r.cfg.quietBound)
	tick := time.NewTicker(300 * time.Millisecond)
	defer tick.Stop()
	var probs []problem
	converged := false
	killsInRow := r.killsInRow
	defer func() {
		if converged {
			r.killsInRow = 0
		}
	}()
	for {
		r.noteRuleQuarantines(killsInRow)
		if !r.agent.alive() {
			r.v.add(r.round, invAgentExit, fmt.Sprintf("start %d", r.agent.starts), "mqlet exited by itself: %s (log %s)", r.agent.exitDescription(), r.agent.logPath)
			r.restart()
		}
		d := r.desired()
		if r.rec.onlineCount() <= onlines {
			// Agreement counts once the restarted agent is online.
			probs = []problem{{inv: invDiverged, pod: "-", detail: "the agent has not said online since its last start"}}
		} else if probs = r.compare(d, false); len(probs) == 0 {
			probs = r.compare(d, true)
		}
		if len(probs) == 0 {
			converged = true
			break
		}
		if time.Now().After(deadline) {
			break
		}
		<-tick.C
	}
	if converged {
		if killed {
			r.convergence = append(r.convergence, time.Since(since))
		}
	} else {
		r.notConverged++
		r.t.Logf("round %d: not converged within %v: %v", r.round, r.cfg.quietBound, probs)
		for _, p := range probs {
			r.v.add(r.round, p.inv, "pod "+p.pod, "%s (not converged %v after the agent's last start)", p.detail, r.cfg.quietBound)
			r.excluded[p.pod] = true
		}
	}
	// The final replies follow the state within seconds.
	finalBy := time.Now().Add(30 * time.Second)
	for time.Now().Before(finalBy) && r.missingFinals(r.roundFrom) > 0 {
		<-tick.C
	}
	r.noteRuleQuarantines(killsInRow)
	r.checkReplies(false)
	r.checkStatuses()
	r.checkEvents()
}

// noteRuleQuarantines finds pods the agent quarantined under its
// deaths-in-a-row rule when at least podworker.SuspectDeaths kills came in a
// row (killsInRow): they are left out of the checks like a broken pod and
// their quarantine is counted apart. With fewer kills in a row such a
// quarantine is the violation it always was.
func (r *run) noteRuleQuarantines(killsInRow int) {
	if killsInRow < podworker.SuspectDeaths {
		return
	}
	for _, s := range r.gen.slots {
		msgs := r.rec.statusesFrom(s.name, 0)
		for i := len(msgs) - 1; i >= 0; i-- {
			p := msgs[i].pod
			if p == nil {
				break
			}
			if p.Status.Reason == "Quarantined" && strings.Contains(p.Status.Message, "times in a row") {
				r.ruleQuarantines[s.name+" "+string(p.UID)] = true
				r.excluded[s.name] = true
			}
			break
		}
	}
}

// ruleQuarantined reports whether pod name is one noteRuleQuarantines
// accepted (any of its uids when uid is empty).
func (r *run) ruleQuarantined(name, uid string) bool {
	if uid != "" {
		return r.ruleQuarantines[name+" "+uid]
	}
	for k := range r.ruleQuarantines {
		if strings.HasPrefix(k, name+" ") {
			return true
		}
	}
	return false
}

// missingFinals counts the requests sent from index from on without a
// final reply yet (the earlier ones were waited for in their rounds).
func (r *run) missingFinals(from int) int {
	n := 0
	for _, c := range r.sent[from:] {
		if _, _, final := replyProblem(r.replyList(c.id)); !final {
			n++
		}
	}
	return n
}

// checkReplies checks every request's replies; at the end (last) a
// request without a final reply is a violation.
func (r *run) checkReplies(last bool) {
	ids := make([]string, 0, len(r.sent)+len(r.gets))
	descs := map[string]string{}
	for _, c := range r.sent {
		ids = append(ids, c.id)
		descs[c.id] = c.desc
	}
	for _, id := range r.gets {
		ids = append(ids, id)
		descs[id] = "get"
	}
	for _, id := range ids {
		replies := r.replyList(id)
		inv, detail, final := replyProblem(replies)
		if inv != "" {
			r.v.add(r.round, inv, "request "+id, "%s: %s", descs[id], detail)
		}
		if !final && last {
			r.v.add(r.round, invNoFinal, "request "+id, "%s: no final reply; replies: %s", descs[id], phasesOrNone(replies))
		}
	}
}

func phasesOrNone(replies []apiv1.Reply) string {
	if len(replies) == 0 {
		return "none"
	}
	return phases(replies)
}

// podCgroups lists the pod cgroups of the run under every hierarchy.
func (r *run) podCgroups() []string {
	a, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", r.cgroupRoot, "pod*"))
	b, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", r.cgroupRoot, "pod*"))
	return append(a, b...)
}
