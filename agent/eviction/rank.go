package eviction

import (
	"sort"

	v1 "k8s.io/api/core/v1"
	resourcehelper "k8s.io/component-helpers/resource"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
)

// candidate is an active pod with what it uses (found: its usage was
// measured; a pod without figures goes first, as the kubelet ranks it).
type candidate struct {
	pod   *v1.Pod
	use   PodUsage
	found bool
	// req is the pod's memory and ephemeral-storage requests, read once.
	req map[v1.ResourceName]int64
}

// newCandidate reads the pod's requests once, for the ranking's many
// comparisons.
func newCandidate(pod *v1.Pod, use PodUsage, found bool) *candidate {
	reqs := resourcehelper.PodRequests(pod, resourcehelper.PodResourcesOptions{})
	c := &candidate{pod: pod, use: use, found: found, req: map[v1.ResourceName]int64{}}
	for _, r := range []v1.ResourceName{v1.ResourceMemory, v1.ResourceEphemeralStorage} {
		if q, ok := reqs[r]; ok {
			c.req[r] = q.Value()
		}
	}
	return c
}

// cmpFunc orders two candidates: negative when a goes first.
type cmpFunc func(a, b *candidate) int

// rank orders the candidates for eviction under a shortage of signal,
// the kubelet's way: memory by usage above requests first, then priority,
// then by how far usage goes above requests; disk the same with ephemeral
// storage (or inodes); pids by priority, then by processes.
func rank(cands []*candidate, signal Signal) {
	var order []cmpFunc
	switch r := signal.resource(); r {
	case v1.ResourceMemory, v1.ResourceEphemeralStorage, resourceInodes:
		order = []cmpFunc{exceedsRequests(r), byPriority, aboveRequests(r)}
	default:
		order = []cmpFunc{byPriority, byProcesses}
	}
	sort.SliceStable(cands, func(i, j int) bool {
		for _, cmp := range order {
			if c := cmp(cands[i], cands[j]); c != 0 {
				return c < 0
			}
		}
		return false
	})
}

// usageOf is what the candidate uses of r (inodes and ephemeral storage
// as the sum over its containers and emptyDirs).
func usageOf(c *candidate, r v1.ResourceName) int64 {
	switch r {
	case v1.ResourceMemory:
		return int64(c.use.MemoryWorkingSetBytes)
	case v1.ResourceEphemeralStorage:
		return int64(c.use.EphemeralBytes())
	case resourceInodes:
		return int64(c.use.Inodes())
	}
	return int64(c.use.Processes)
}

// requestOf is the candidate's request of r (0 for inodes, which have none).
func requestOf(c *candidate, r v1.ResourceName) int64 { return c.req[r] }

// missingFirst puts a candidate without figures first; 0 when both or
// neither have them.
func missingFirst(a, b *candidate) int {
	return cmpBool(!a.found, !b.found)
}

func exceedsRequests(r v1.ResourceName) cmpFunc {
	return func(a, b *candidate) int {
		if c := missingFirst(a, b); c != 0 || !a.found {
			return c
		}
		return cmpBool(usageOf(a, r) > requestOf(a, r), usageOf(b, r) > requestOf(b, r))
	}
}

func aboveRequests(r v1.ResourceName) cmpFunc {
	return func(a, b *candidate) int {
		if c := missingFirst(a, b); c != 0 || !a.found {
			return c
		}
		return cmpInt(usageOf(b, r)-requestOf(b, r), usageOf(a, r)-requestOf(a, r))
	}
}

// byPriority puts the lower priority first.
func byPriority(a, b *candidate) int {
	return cmpInt(int64(corev1helpers.PodPriority(a.pod)), int64(corev1helpers.PodPriority(b.pod)))
}

func byProcesses(a, b *candidate) int {
	if c := missingFirst(a, b); c != 0 || !a.found {
		return c
	}
	return cmpInt(int64(b.use.Processes), int64(a.use.Processes))
}

// cmpBool puts true first.
func cmpBool(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return -1
	}
	return 1
}

func cmpInt(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
