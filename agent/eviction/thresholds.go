package eviction

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// Signal names a resource the node can run out of, in the kubelet's words.
type Signal string

// The signals mqlet observes.
const (
	MemoryAvailable   Signal = "memory.available"
	NodeFsAvailable   Signal = "nodefs.available"
	NodeFsInodesFree  Signal = "nodefs.inodesFree"
	ImageFsAvailable  Signal = "imagefs.available"
	ImageFsInodesFree Signal = "imagefs.inodesFree"
	PIDAvailable      Signal = "pid.available"
)

// Signals lists every signal, in the order thresholds are looked at:
// memory first, as the kubelet orders them.
var Signals = []Signal{MemoryAvailable, NodeFsAvailable, NodeFsInodesFree, ImageFsAvailable, ImageFsInodesFree, PIDAvailable}

// resourceInodes and resourcePIDs name what inodes and pids signals
// starve, as the kubelet's messages do.
const (
	resourceInodes v1.ResourceName = "inodes"
	resourcePIDs   v1.ResourceName = "pids"
)

// resource is what running out of the signal starves.
func (s Signal) resource() v1.ResourceName {
	switch s {
	case MemoryAvailable:
		return v1.ResourceMemory
	case NodeFsAvailable, ImageFsAvailable:
		return v1.ResourceEphemeralStorage
	case NodeFsInodesFree, ImageFsInodesFree:
		return resourceInodes
	}
	return resourcePIDs
}

// condition is the node condition the signal sets.
func (s Signal) condition() v1.NodeConditionType {
	switch s {
	case MemoryAvailable:
		return v1.NodeMemoryPressure
	case PIDAvailable:
		return v1.NodePIDPressure
	}
	return v1.NodeDiskPressure
}

// Value is a threshold's amount: an absolute quantity or a percentage of
// the signal's capacity.
type Value struct {
	Quantity *resource.Quantity
	Percent  float64
}

func (v Value) String() string {
	if v.Quantity != nil {
		return v.Quantity.String()
	}
	return strconv.FormatFloat(v.Percent, 'f', -1, 64) + "%"
}

// of is the amount the value stands for, given the signal's capacity.
func (v Value) of(capacity int64) int64 {
	if v.Quantity != nil {
		return v.Quantity.Value()
	}
	return int64(float64(capacity) * v.Percent / 100)
}

// Threshold says when a signal is short: less available than Value. A
// soft threshold (GracePeriod > 0) must hold that long before pods are
// evicted for it; a hard one evicts at once.
type Threshold struct {
	Signal      Signal
	Value       Value
	GracePeriod time.Duration
}

func (t Threshold) hard() bool { return t.GracePeriod == 0 }

// ParseValue reads a threshold as the kubelet's flags write it: a
// quantity ("100Mi", "1000" for inodes and pids) or a percentage ("10%").
func ParseValue(signal Signal, s string) (Value, error) {
	if !slices.Contains(Signals, signal) {
		return Value{}, fmt.Errorf("unknown eviction signal %q (known: %s)", signal, joinSignals())
	}
	s = strings.TrimSpace(s)
	if pct, ok := strings.CutSuffix(s, "%"); ok {
		f, err := strconv.ParseFloat(pct, 64)
		if err != nil || f <= 0 || f >= 100 {
			return Value{}, fmt.Errorf("%s: %q must be a percentage above 0%% and below 100%%", signal, s)
		}
		return Value{Percent: f}, nil
	}
	q, err := resource.ParseQuantity(s)
	if err != nil {
		return Value{}, fmt.Errorf("%s: %q is neither a quantity nor a percentage: %w", signal, s, err)
	}
	if q.Sign() <= 0 {
		return Value{}, fmt.Errorf("%s: %q must be positive", signal, s)
	}
	return Value{Quantity: &q}, nil
}

func joinSignals() string {
	names := make([]string, len(Signals))
	for i, s := range Signals {
		names[i] = string(s)
	}
	return strings.Join(names, ", ")
}
