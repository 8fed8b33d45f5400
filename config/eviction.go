package config

import (
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
)

// Eviction is node-pressure eviction and ephemeral storage enforcement
// (agent/eviction). Thresholds are written as the kubelet's evictionHard
// and evictionSoft: signal → a quantity ("100Mi") or a percentage ("10%")
// of the signal's capacity.
type Eviction struct {
	// Interval between eviction passes (the kubelet's housekeeping period).
	Interval Duration `json:"interval"`
	// Hard thresholds beside the three kept under telemetry
	// (memoryAvailable, diskAvailablePercent, pidAvailablePercent, which
	// are the hard thresholds of memory.available, nodefs.available and
	// pid.available): nodefs.inodesFree, imagefs.available,
	// imagefs.inodesFree. "0" turns one off.
	Hard map[string]string `json:"hard"`
	// Soft thresholds, each with its grace period in SoftGracePeriod.
	Soft            map[string]string   `json:"soft"`
	SoftGracePeriod map[string]Duration `json:"softGracePeriod"`
	// MaxPodGracePeriodSeconds caps the grace period of a pod evicted for
	// a soft threshold (a hard one kills at once).
	MaxPodGracePeriodSeconds int64 `json:"maxPodGracePeriodSeconds"`
	// PressureTransitionPeriod holds a pressure condition after its
	// threshold clears, so it does not flap.
	PressureTransitionPeriod Duration `json:"pressureTransitionPeriod"`
	// ReservedMemory and ReservedStorage are mqlet's own reserve (like the
	// kubelet's system-reserved): pods are evicted before memory or the
	// state directory's filesystem falls below threshold + reserve, and
	// allocatable leaves them out.
	ReservedMemory  string `json:"reservedMemory"`
	ReservedStorage string `json:"reservedStorage"`
	// MemoryCgroup, when set, is the cgroup (a path under the cgroup
	// filesystem, e.g. /mqlet) whose limit and working set give
	// memory.available, as the kubelet reads its allocatable cgroup;
	// empty: MemAvailable of /proc/meminfo.
	MemoryCgroup string `json:"memoryCgroup"`
}

// EvictionSignals are the signals thresholds may name.
var EvictionSignals = []string{"memory.available", "nodefs.available", "nodefs.inodesFree", "imagefs.available", "imagefs.inodesFree", "pid.available"}

// telemetryThresholds are the hard thresholds kept under telemetry.
var telemetryThresholds = map[string]string{
	"memory.available": "telemetry.memoryAvailable",
	"nodefs.available": "telemetry.diskAvailablePercent",
	"pid.available":    "telemetry.pidAvailablePercent",
}

func defaultEviction() Eviction {
	return Eviction{
		Interval: Duration{10 * time.Second},
		// The kubelet's other defaults (its evictionHard).
		Hard:                     map[string]string{"nodefs.inodesFree": "5%", "imagefs.available": "15%", "imagefs.inodesFree": "5%"},
		Soft:                     map[string]string{},
		SoftGracePeriod:          map[string]Duration{},
		MaxPodGracePeriodSeconds: 0,
		PressureTransitionPeriod: Duration{5 * time.Minute},
		ReservedMemory:           "48Mi",
		ReservedStorage:          "64Mi",
	}
}

// EvictionThreshold is one threshold of the configuration.
type EvictionThreshold struct {
	Signal      string
	Value       string // a quantity or a percentage
	GracePeriod time.Duration
}

// EvictionThresholds are every threshold configured, hard (grace 0) then
// soft, each sorted by signal. Call it on a validated configuration.
func (c *Config) EvictionThresholds() []EvictionThreshold {
	var out []EvictionThreshold
	if c.Telemetry.MemoryAvailable != "" && !isZero(c.Telemetry.MemoryAvailable) {
		out = append(out, EvictionThreshold{Signal: "memory.available", Value: c.Telemetry.MemoryAvailable})
	}
	if c.Telemetry.DiskAvailablePct > 0 {
		out = append(out, EvictionThreshold{Signal: "nodefs.available", Value: strconv.Itoa(c.Telemetry.DiskAvailablePct) + "%"})
	}
	if c.Telemetry.PIDAvailablePct > 0 {
		out = append(out, EvictionThreshold{Signal: "pid.available", Value: strconv.Itoa(c.Telemetry.PIDAvailablePct) + "%"})
	}
	for _, s := range sortedSignals(c.Eviction.Hard) {
		if v := c.Eviction.Hard[s]; !isZero(v) {
			out = append(out, EvictionThreshold{Signal: s, Value: v})
		}
	}
	for _, s := range sortedSignals(c.Eviction.Soft) {
		if v := c.Eviction.Soft[s]; !isZero(v) {
			out = append(out, EvictionThreshold{Signal: s, Value: v, GracePeriod: c.Eviction.SoftGracePeriod[s].Duration})
		}
	}
	return out
}

// Reserved is a reserve in bytes (0 when unset or invalid).
func Reserved(q string) int64 {
	v, err := resource.ParseQuantity(q)
	if err != nil {
		return 0
	}
	return v.Value()
}

func sortedSignals(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func isZero(v string) bool {
	v = strings.TrimSpace(v)
	return v == "0" || v == "0%"
}

func validThreshold(v string) string {
	v = strings.TrimSpace(v)
	if pct, ok := strings.CutSuffix(v, "%"); ok {
		f, err := strconv.ParseFloat(pct, 64)
		if err != nil || f < 0 || f >= 100 {
			return "a percentage must be at least 0% and below 100%"
		}
		return ""
	}
	q, err := resource.ParseQuantity(v)
	if err != nil {
		return "neither a quantity (100Mi) nor a percentage (10%)"
	}
	if q.Sign() < 0 {
		return "must not be negative"
	}
	return ""
}

func validateEviction(c *Config, bad func(field, format string, args ...any)) {
	e := c.Eviction
	positive := func(field string, d Duration) {
		if d.Duration <= 0 {
			bad(field, "must be positive, got %s", d.Duration)
		}
	}
	positive("eviction.interval", e.Interval)
	positive("eviction.pressureTransitionPeriod", e.PressureTransitionPeriod)
	if e.MaxPodGracePeriodSeconds < 0 {
		bad("eviction.maxPodGracePeriodSeconds", "must not be negative, got %d", e.MaxPodGracePeriodSeconds)
	}
	if c.Telemetry.MemoryAvailable != "" {
		if q, err := resource.ParseQuantity(c.Telemetry.MemoryAvailable); err != nil || q.Sign() < 0 {
			bad("telemetry.memoryAvailable", "%q is not a quantity such as 100Mi", c.Telemetry.MemoryAvailable)
		}
	}
	for field, v := range map[string]int{"telemetry.diskAvailablePercent": c.Telemetry.DiskAvailablePct, "telemetry.pidAvailablePercent": c.Telemetry.PIDAvailablePct} {
		if v < 0 || v >= 100 {
			bad(field, "must be 0 (off) to 99, got %d", v)
		}
	}
	for _, s := range sortedSignals(e.Hard) {
		at := "eviction.hard." + s
		switch {
		case !slices.Contains(EvictionSignals, s):
			bad(at, "unknown signal (known: %s)", strings.Join(EvictionSignals, ", "))
		case telemetryThresholds[s] != "":
			bad(at, "set in %s", telemetryThresholds[s])
		default:
			if why := validThreshold(e.Hard[s]); why != "" {
				bad(at, "%q: %s", e.Hard[s], why)
			}
		}
	}
	for _, s := range sortedSignals(e.Soft) {
		at := "eviction.soft." + s
		if !slices.Contains(EvictionSignals, s) {
			bad(at, "unknown signal (known: %s)", strings.Join(EvictionSignals, ", "))
			continue
		}
		if why := validThreshold(e.Soft[s]); why != "" {
			bad(at, "%q: %s", e.Soft[s], why)
		}
		if g, ok := e.SoftGracePeriod[s]; !ok || g.Duration <= 0 {
			bad("eviction.softGracePeriod."+s, "a soft threshold needs a positive grace period")
		}
	}
	for s := range e.SoftGracePeriod {
		if _, ok := e.Soft[s]; !ok {
			bad("eviction.softGracePeriod."+s, "no soft threshold for %s", s)
		}
	}
	if mc := e.MemoryCgroup; mc != "" && (!strings.HasPrefix(mc, "/") || strings.Contains(mc, "..")) {
		bad("eviction.memoryCgroup", "%q must be an absolute cgroup path without ..", mc)
	}
	for field, q := range map[string]string{"eviction.reservedMemory": e.ReservedMemory, "eviction.reservedStorage": e.ReservedStorage} {
		if v, err := resource.ParseQuantity(q); err != nil || v.Sign() < 0 {
			bad(field, "%q is not a quantity such as 64Mi", q)
		}
	}
}
