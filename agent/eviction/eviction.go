// Package eviction is mqlet's eviction manager: it keeps pods from using
// up what the gateway itself needs, the way the kubelet's does.
//
// Every pass (Synchronize) it reads the node's signals (memory.available,
// nodefs.available, nodefs.inodesFree, imagefs.available,
// imagefs.inodesFree, pid.available) and each active pod's usage through
// one narrow Stats interface, and then:
//   - evicts every pod past its own ephemeral storage bounds (an emptyDir
//     past its sizeLimit, a container past its ephemeral-storage limit,
//     the pod past the sum of its containers' limits), with the kubelet's
//     messages;
//   - sets the pressure conditions of the thresholds met (held for the
//     pressure transition period after they clear), which the node status
//     publishes and Admit refuses new pods by;
//   - for a threshold met (hard at once, soft after its grace period)
//     first reclaims what the node can give back (dead containers, unused
//     images) when the signal is a disk one, and if that is not enough
//     evicts one pod, ranked as the kubelet ranks them.
//
// An eviction is asked of a Killer, which marks the pod Failed with reason
// Evicted and stops it; the manager records the kubelet's Warning event.
package eviction

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	v1qos "k8s.io/kubernetes/pkg/apis/core/v1/helper/qos"
)

// Reason is the kubelet's reason for an evicted pod, its event, and a pod
// refused under pressure.
const Reason = "Evicted"

// The kubelet's messages.
const (
	msgNodeLow          = "The node was low on resource: %v. "
	msgThresholdMet     = "Threshold quantity: %v, available: %v. "
	msgContainerUsage   = "Container %s was using %s, request is %s, has larger consumption of %v. "
	msgContainerStorage = "Container %s exceeded its local ephemeral storage limit %q. "
	msgPodStorage       = "Pod ephemeral local storage usage exceeds the total limit of containers %s. "
	msgEmptyDir         = "Usage of EmptyDir volume %q exceeds the limit %q. "
	msgNodeCondition    = "The node had condition: %v. "
)

// Defaults, as the kubelet's.
const (
	DefaultInterval                 = 10 * time.Second
	DefaultPressureTransitionPeriod = 5 * time.Minute
	// DefaultCleanupTimeout is how long a pass waits for an evicted pod
	// to be stopped before it goes on.
	DefaultCleanupTimeout = 30 * time.Second
)

// Observation is one signal's reading: what is available of what capacity.
type Observation struct {
	Available int64
	Capacity  int64
}

// NodeStats are the node's signals; a signal missing was not measured
// (its thresholds are then not evaluated).
type NodeStats map[Signal]Observation

// ContainerUsage is one container's ephemeral storage: its writable layer
// and its logs.
type ContainerUsage struct {
	RootfsBytes  uint64
	RootfsInodes uint64
	LogsBytes    uint64
}

// VolumeUsage is one emptyDir volume's use of the node's disk.
type VolumeUsage struct {
	Bytes  uint64
	Inodes uint64
}

// PodUsage is what one pod uses.
type PodUsage struct {
	MemoryWorkingSetBytes uint64
	Processes             uint64
	// Containers by container name.
	Containers map[string]ContainerUsage
	// EmptyDirs on the node's disk, by volume name.
	EmptyDirs map[string]VolumeUsage
}

// EphemeralBytes is the pod's ephemeral storage as the kubelet accounts
// it: every container's writable layer and logs, and its emptyDirs.
func (u PodUsage) EphemeralBytes() uint64 {
	var total uint64
	for _, c := range u.Containers {
		total += c.RootfsBytes + c.LogsBytes
	}
	for _, v := range u.EmptyDirs {
		total += v.Bytes
	}
	return total
}

// Inodes is the inodes the pod's writable layers and emptyDirs hold.
func (u PodUsage) Inodes() uint64 {
	var total uint64
	for _, c := range u.Containers {
		total += c.RootfsInodes
	}
	for _, v := range u.EmptyDirs {
		total += v.Inodes
	}
	return total
}

// Stats is what the manager reads.
type Stats interface {
	// Node reads the node's signals.
	Node(ctx context.Context) (NodeStats, error)
	// Pods reads the usage of the given pods, by uid; a pod missing was
	// not measured.
	Pods(ctx context.Context, pods []*v1.Pod) (map[types.UID]PodUsage, error)
}

// Killer evicts a pod: it is reported Failed with reason Evicted and
// message, not restarted, and stopped with gracePeriod seconds. Evict
// returns once the pod is stopped (or ctx ends).
type Killer interface {
	Evict(ctx context.Context, pod *v1.Pod, message string, gracePeriod int64) error
}

// Reclaimer frees what the node holds for no pod: dead containers and
// unused images.
type Reclaimer interface {
	Reclaim(ctx context.Context) error
}

// Events records the kubelet's events.
type Events interface {
	Event(pod *v1.Pod, eventType, reason, message string)
	NodeEvent(eventType, reason, message string)
}

// Config are the manager's settings.
type Config struct {
	// Thresholds, hard (GracePeriod 0) and soft.
	Thresholds []Threshold
	// PressureTransitionPeriod holds a pressure condition this long after
	// its threshold is no longer met (0: DefaultPressureTransitionPeriod).
	PressureTransitionPeriod time.Duration
	// MaxPodGracePeriod caps the grace period of a pod evicted for a soft
	// threshold, in seconds (a hard threshold kills at once).
	MaxPodGracePeriod int64
	// ReservedMemory and ReservedStorage are kept for mqlet itself: the
	// signals memory.available and nodefs.available see that much less
	// than the node has, so pods are evicted before mqlet's own memory
	// or its state directory's filesystem runs short.
	ReservedMemory, ReservedStorage int64
	// Interval between passes (0: DefaultInterval).
	Interval time.Duration
	// CleanupTimeout bounds the wait for an evicted pod's stop (0:
	// DefaultCleanupTimeout).
	CleanupTimeout time.Duration
}

// Deps are what the manager reads from and acts on.
type Deps struct {
	Stats Stats
	// ActivePods are the pods running or to run (not terminal).
	ActivePods func() []*v1.Pod
	Killer     Killer
	Reclaimer  Reclaimer // nil: nothing reclaimed before evicting
	Events     Events
	// Changed, when set, is called after a pass that changed the
	// pressure conditions.
	Changed func()
}

// Condition is one pressure condition as the last pass saw it.
type Condition struct {
	Type v1.NodeConditionType
	// Known says a signal of the condition was measured.
	Known bool
	// Under says the node is under that pressure; Message says why.
	Under   bool
	Message string
}

// Manager is the eviction manager.
type Manager struct {
	cfg  Config
	deps Deps
	log  zerolog.Logger
	now  func() time.Time

	mu         sync.Mutex
	conditions map[v1.NodeConditionType]Condition
	passed     bool // a pass has set conditions

	// Owned by the pass (Synchronize is called by one goroutine).
	firstMet    map[Signal]time.Time               // soft thresholds: when first met in a row
	lastUnder   map[v1.NodeConditionType]time.Time // when each condition was last met
	lastMessage map[v1.NodeConditionType]string    // the message of the last met
	evicted     map[types.UID]bool                 // pods asked to be evicted, pruned to the active ones
}

// New checks cfg and returns a manager; Run starts its passes.
func New(cfg Config, deps Deps, log zerolog.Logger) (*Manager, error) {
	if deps.Stats == nil || deps.ActivePods == nil || deps.Killer == nil || deps.Events == nil {
		return nil, errors.New("eviction manager: stats, active pods, killer and events are required")
	}
	seen := map[Signal]map[bool]bool{}
	for _, t := range cfg.Thresholds {
		if seen[t.Signal] == nil {
			seen[t.Signal] = map[bool]bool{}
		}
		if seen[t.Signal][t.hard()] {
			return nil, fmt.Errorf("eviction manager: two %s thresholds for %s", map[bool]string{true: "hard", false: "soft"}[t.hard()], t.Signal)
		}
		seen[t.Signal][t.hard()] = true
		if t.Value.Quantity == nil && t.Value.Percent <= 0 {
			return nil, fmt.Errorf("eviction manager: threshold for %s has no value", t.Signal)
		}
	}
	if cfg.PressureTransitionPeriod <= 0 {
		cfg.PressureTransitionPeriod = DefaultPressureTransitionPeriod
	}
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.CleanupTimeout <= 0 {
		cfg.CleanupTimeout = DefaultCleanupTimeout
	}
	return &Manager{cfg: cfg, deps: deps, log: log, now: time.Now,
		conditions: map[v1.NodeConditionType]Condition{}, firstMet: map[Signal]time.Time{},
		lastUnder: map[v1.NodeConditionType]time.Time{}, lastMessage: map[v1.NodeConditionType]string{},
		evicted: map[types.UID]bool{}}, nil
}

// Run makes a pass every interval until ctx ends.
func (m *Manager) Run(ctx context.Context) {
	t := time.NewTicker(m.cfg.Interval)
	defer t.Stop()
	for {
		if _, err := m.Synchronize(ctx); err != nil && ctx.Err() == nil {
			m.log.Warn().Err(err).Msg("eviction pass")
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Conditions are the pressure conditions of the last pass, in the order
// MemoryPressure, DiskPressure, PIDPressure; nil before the first pass.
func (m *Manager) Conditions() []Condition {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.passed {
		return nil
	}
	out := make([]Condition, 0, 3)
	for _, t := range []v1.NodeConditionType{v1.NodeMemoryPressure, v1.NodeDiskPressure, v1.NodePIDPressure} {
		c, ok := m.conditions[t]
		if !ok {
			c = Condition{Type: t}
		}
		out = append(out, c)
	}
	return out
}

// Admit says whether a new pod may start under the current pressure, and
// if not, the kubelet's reason and message: under memory pressure alone a
// BestEffort pod is refused unless it tolerates the memory-pressure
// taint; under any other pressure every pod is refused.
func (m *Manager) Admit(pod *v1.Pod) (ok bool, reason, message string) {
	m.mu.Lock()
	var under []string
	memoryOnly := true
	for _, t := range []v1.NodeConditionType{v1.NodeMemoryPressure, v1.NodeDiskPressure, v1.NodePIDPressure} {
		if c := m.conditions[t]; c.Under {
			under = append(under, string(t))
			if t != v1.NodeMemoryPressure {
				memoryOnly = false
			}
		}
	}
	m.mu.Unlock()
	if len(under) == 0 {
		return true, "", ""
	}
	if memoryOnly {
		if v1qos.GetPodQOS(pod) != v1.PodQOSBestEffort || toleratesMemoryPressure(pod) {
			return true, "", ""
		}
	}
	return false, Reason, fmt.Sprintf(msgNodeCondition, "["+strings.Join(under, " ")+"]")
}

// toleratesMemoryPressure: a toleration of the NoSchedule taint
// node.kubernetes.io/memory-pressure (the key, or every key with Exists;
// the effect NoSchedule or any).
func toleratesMemoryPressure(pod *v1.Pod) bool {
	for _, t := range pod.Spec.Tolerations {
		if t.Effect != "" && t.Effect != v1.TaintEffectNoSchedule {
			continue
		}
		switch {
		case t.Key == "" && t.Operator == v1.TolerationOpExists:
			return true
		case t.Key == v1.TaintNodeMemoryPressure && (t.Operator == v1.TolerationOpExists || t.Value == ""):
			return true
		}
	}
	return false
}

// met is a threshold met in this pass, with what was observed.
type met struct {
	Threshold
	obs Observation
}

// Synchronize makes one pass and returns the pods it evicted.
func (m *Manager) Synchronize(ctx context.Context) ([]*v1.Pod, error) {
	now := m.now()
	active := m.activePods()
	node, nodeErr := m.deps.Stats.Node(ctx)
	if nodeErr != nil && node == nil {
		node = NodeStats{}
	}
	node = m.reserve(node)

	// Thresholds met now, and the soft ones met long enough.
	var metNow, actionable []met
	firstMet := map[Signal]time.Time{}
	for _, t := range m.cfg.Thresholds {
		obs, ok := node[t.Signal]
		if !ok || obs.Available >= t.Value.of(obs.Capacity) {
			continue
		}
		mt := met{Threshold: t, obs: obs}
		metNow = append(metNow, mt)
		if t.hard() {
			actionable = append(actionable, mt)
			continue
		}
		key := t.Signal
		since, seen := m.firstMet[key]
		if !seen {
			since = now
		}
		firstMet[key] = since
		if now.Sub(since) >= t.GracePeriod {
			actionable = append(actionable, mt)
		}
	}
	m.firstMet = firstMet
	changed := m.updateConditions(node, metNow, now)
	if changed && m.deps.Changed != nil {
		m.deps.Changed()
	}

	var errs []error
	if nodeErr != nil {
		errs = append(errs, fmt.Errorf("reading the node's signals: %w", nodeErr))
	}
	if len(active) == 0 {
		return nil, errors.Join(errs...)
	}
	usage, err := m.deps.Stats.Pods(ctx, active)
	if err != nil {
		errs = append(errs, fmt.Errorf("reading pod usage: %w", err))
	}
	// A pod past its own storage bounds goes first, whatever the node.
	if evicted := m.localStorageEviction(ctx, active, usage); len(evicted) > 0 {
		return evicted, errors.Join(errs...)
	}
	if len(actionable) == 0 {
		return nil, errors.Join(errs...)
	}
	// Memory first, then the rest in the order of Signals.
	sort.SliceStable(actionable, func(i, j int) bool { return signalOrder(actionable[i].Signal) < signalOrder(actionable[j].Signal) })
	target := actionable[0]
	starved := target.Signal.resource()
	m.deps.Events.NodeEvent(v1.EventTypeWarning, "EvictionThresholdMet", fmt.Sprintf("Attempting to reclaim %s", starved))
	if m.reclaim(ctx, target) {
		return nil, errors.Join(errs...)
	}
	cands := make([]*candidate, 0, len(active))
	for _, p := range active {
		u, ok := usage[p.UID]
		cands = append(cands, newCandidate(p, u, ok))
	}
	rank(cands, target.Signal)
	for _, c := range cands {
		grace := int64(0)
		if !target.hard() {
			grace = m.cfg.MaxPodGracePeriod
			if g := c.pod.Spec.TerminationGracePeriodSeconds; g != nil {
				grace = min(grace, *g)
			}
		}
		msg := m.nodeMessage(c, actionable, starved)
		if m.evict(ctx, c.pod, msg, grace) {
			return []*v1.Pod{c.pod}, errors.Join(errs...)
		}
	}
	return nil, errors.Join(errs...)
}

func signalOrder(s Signal) int {
	for i, x := range Signals {
		if x == s {
			return i
		}
	}
	return len(Signals)
}

// activePods are the active pods not yet evicted by this manager (the
// record of those evicted is pruned to the active ones).
func (m *Manager) activePods() []*v1.Pod {
	all := m.deps.ActivePods()
	live := make(map[types.UID]bool, len(all))
	out := make([]*v1.Pod, 0, len(all))
	for _, p := range all {
		live[p.UID] = true
		if !m.evicted[p.UID] {
			out = append(out, p)
		}
	}
	for uid := range m.evicted {
		if !live[uid] {
			delete(m.evicted, uid)
		}
	}
	return out
}

// reserve takes mqlet's own reserve off what the memory and nodefs
// signals see.
func (m *Manager) reserve(node NodeStats) NodeStats {
	out := make(NodeStats, len(node))
	for s, o := range node {
		switch {
		case s == MemoryAvailable && m.cfg.ReservedMemory > 0:
			o.Available -= m.cfg.ReservedMemory
		case s == NodeFsAvailable && m.cfg.ReservedStorage > 0:
			o.Available -= m.cfg.ReservedStorage
		}
		out[s] = o
	}
	return out
}

// updateConditions sets the pressure conditions from the thresholds met,
// each held for the transition period after it was last met, and says
// whether any changed.
func (m *Manager) updateConditions(node NodeStats, metNow []met, now time.Time) bool {
	for _, mt := range metNow {
		t := mt.Signal.condition()
		if _, ok := m.lastUnder[t]; !ok || m.lastUnder[t].Before(now) {
			m.lastUnder[t] = now
			m.lastMessage[t] = fmt.Sprintf("%s available %s is below the threshold %s",
				mt.Signal, quantity(mt.Signal, mt.obs.Available), quantity(mt.Signal, mt.Value.of(mt.obs.Capacity)))
		}
	}
	next := map[v1.NodeConditionType]Condition{}
	for s := range node {
		t := s.condition()
		c := next[t]
		c.Type, c.Known = t, true
		next[t] = c
	}
	for t, at := range m.lastUnder {
		if now.Sub(at) > m.cfg.PressureTransitionPeriod {
			delete(m.lastUnder, t)
			delete(m.lastMessage, t)
			continue
		}
		c := next[t]
		c.Type, c.Known, c.Under, c.Message = t, true, true, m.lastMessage[t]
		next[t] = c
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	changed := false
	for _, t := range []v1.NodeConditionType{v1.NodeMemoryPressure, v1.NodeDiskPressure, v1.NodePIDPressure} {
		if m.conditions[t].Under != next[t].Under || m.conditions[t].Known != next[t].Known {
			changed = true
			if next[t].Under {
				m.log.Warn().Str("condition", string(t)).Str("message", next[t].Message).Msg("node under pressure")
			} else if m.conditions[t].Under {
				m.log.Info().Str("condition", string(t)).Msg("node pressure cleared")
			}
		}
	}
	m.conditions, m.passed = next, true
	return changed
}

// quantity prints an amount of the signal's resource.
func quantity(s Signal, v int64) string {
	switch s.resource() {
	case v1.ResourceMemory, v1.ResourceEphemeralStorage:
		return resource.NewQuantity(v, resource.BinarySI).String()
	}
	return resource.NewQuantity(v, resource.DecimalSI).String()
}

// reclaim frees dead containers and unused images for a disk signal and
// reports whether the threshold is no longer met after it.
func (m *Manager) reclaim(ctx context.Context, target met) bool {
	if m.deps.Reclaimer == nil || target.Signal.resource() == v1.ResourceMemory || target.Signal == PIDAvailable {
		return false
	}
	if err := m.deps.Reclaimer.Reclaim(ctx); err != nil {
		m.log.Warn().Err(err).Str("signal", string(target.Signal)).Msg("reclaiming dead containers and unused images")
	}
	node, err := m.deps.Stats.Node(ctx)
	if err != nil {
		return false
	}
	obs, ok := m.reserve(node)[target.Signal]
	if !ok {
		return false
	}
	if obs.Available >= target.Value.of(obs.Capacity) {
		m.log.Info().Str("signal", string(target.Signal)).Msg("reclaimed enough without evicting a pod")
		return true
	}
	return false
}

// nodeMessage is the kubelet's message for a pod evicted for starved.
func (m *Manager) nodeMessage(c *candidate, thresholds []met, starved v1.ResourceName) string {
	msg := fmt.Sprintf(msgNodeLow, starved)
	for _, t := range thresholds {
		if t.Signal.resource() == starved {
			msg += fmt.Sprintf(msgThresholdMet, t.Value.String(), quantity(t.Signal, t.obs.Available))
			break
		}
	}
	if !c.found || (starved != v1.ResourceMemory && starved != v1.ResourceEphemeralStorage) {
		return msg
	}
	for _, ctr := range c.pod.Spec.Containers {
		req := ctr.Resources.Requests[starved]
		var used int64
		if starved == v1.ResourceMemory {
			continue // working set is measured per pod here, not per container
		}
		cu, ok := c.use.Containers[ctr.Name]
		if !ok {
			continue
		}
		used = int64(cu.RootfsBytes + cu.LogsBytes)
		if used > req.Value() {
			msg += fmt.Sprintf(msgContainerUsage, ctr.Name, resource.NewQuantity(used, resource.BinarySI).String(), req.String(), starved)
		}
	}
	return msg
}

// localStorageEviction evicts every pod past its own ephemeral storage
// bounds: an emptyDir past its sizeLimit, the pod past the sum of its
// containers' limits, a container past its own.
func (m *Manager) localStorageEviction(ctx context.Context, active []*v1.Pod, usage map[types.UID]PodUsage) []*v1.Pod {
	var evicted []*v1.Pod
	for _, pod := range active {
		u, ok := usage[pod.UID]
		if !ok {
			continue
		}
		if msg := storageViolation(pod, u); msg != "" && m.evict(ctx, pod, msg, 0) {
			evicted = append(evicted, pod)
		}
	}
	return evicted
}

// storageViolation is the kubelet's message for a pod past its own
// ephemeral storage bounds, or "".
func storageViolation(pod *v1.Pod, u PodUsage) string {
	for _, vol := range pod.Spec.Volumes {
		ed := vol.EmptyDir
		if ed == nil || ed.Medium != v1.StorageMediumDefault || ed.SizeLimit == nil || ed.SizeLimit.IsZero() {
			continue
		}
		if vu, ok := u.EmptyDirs[vol.Name]; ok && int64(vu.Bytes) > ed.SizeLimit.Value() {
			return fmt.Sprintf(msgEmptyDir, vol.Name, ed.SizeLimit.String())
		}
	}
	var podLimit resource.Quantity
	limited := false
	for _, c := range pod.Spec.Containers {
		if l, ok := c.Resources.Limits[v1.ResourceEphemeralStorage]; ok {
			podLimit.Add(l)
			limited = true
		}
	}
	if limited && int64(u.EphemeralBytes()) > podLimit.Value() {
		return fmt.Sprintf(msgPodStorage, podLimit.String())
	}
	for _, c := range pod.Spec.Containers {
		l, ok := c.Resources.Limits[v1.ResourceEphemeralStorage]
		if !ok || l.IsZero() {
			continue
		}
		if cu, ok := u.Containers[c.Name]; ok && int64(cu.RootfsBytes+cu.LogsBytes) > l.Value() {
			return fmt.Sprintf(msgContainerStorage, c.Name, l.String())
		}
	}
	return ""
}

// evict records the kubelet's event and asks the killer; it waits at
// most the cleanup timeout for the stop.
func (m *Manager) evict(ctx context.Context, pod *v1.Pod, message string, grace int64) bool {
	m.evicted[pod.UID] = true
	m.deps.Events.Event(pod, v1.EventTypeWarning, Reason, message)
	m.log.Warn().Str("pod", pod.Namespace+"/"+pod.Name).Str("uid", string(pod.UID)).Int64("gracePeriod", grace).Str("message", message).Msg("evicting pod")
	cctx, cancel := context.WithTimeout(ctx, m.cfg.CleanupTimeout)
	defer cancel()
	if err := m.deps.Killer.Evict(cctx, pod, message, grace); err != nil {
		m.log.Warn().Err(err).Str("pod", pod.Namespace+"/"+pod.Name).Msg("evicted pod not yet stopped")
	}
	return true
}
