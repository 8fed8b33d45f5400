package cri

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	v1 "k8s.io/api/core/v1"
	resourcehelper "k8s.io/component-helpers/resource"
)

// The kubelet's CFS period and cpu.shares bounds.
const (
	cfsPeriodUs = 100000
	minQuotaUs  = 1000
	minShares   = 2
	maxShares   = 262144
	// A new cgroup's cpu.shares and cpu.weight, for cpuShares 0.
	defaultShares = 1024
	defaultWeight = 100
)

// podCgroupValues are the pod cgroup's cpu and memory settings from
// pod-level resources; zero is not set (no limit, the default shares).
type podCgroupValues struct {
	memoryLimit int64 // bytes
	cpuQuota    int64 // µs per cfsPeriodUs
	cpuShares   int64
}

// podLevelCgroupValues computes, as the kubelet does for a pod with
// pod-level resources, the pod cgroup's memory limit and CFS quota from
// spec.resources.limits and its cpu shares from the pod's cpu request
// (spec.resources.requests, else the containers'). ok is false for a pod
// without pod-level resources: its containers' cgroups carry the limits.
func podLevelCgroupValues(pod *v1.Pod) (podCgroupValues, bool) {
	if !resourcehelper.IsPodLevelResourcesSet(pod) {
		return podCgroupValues{}, false
	}
	var vals podCgroupValues
	limits := pod.Spec.Resources.Limits
	if q, ok := limits[v1.ResourceMemory]; ok {
		vals.memoryLimit = q.Value()
	}
	if q, ok := limits[v1.ResourceCPU]; ok {
		vals.cpuQuota = max(q.MilliValue()*cfsPeriodUs/1000, minQuotaUs)
	}
	req := resourcehelper.PodRequests(pod, resourcehelper.PodResourcesOptions{})
	cpu := req[v1.ResourceCPU]
	vals.cpuShares = min(max(cpu.MilliValue()*1024/1000, minShares), maxShares)
	return vals, true
}

// limitPodResources writes a pod's pod-level cpu and memory limits into
// its cgroup before its sandbox exists (the runtime creates the
// containers' cgroups beneath it, so they share the limits); a limit the
// spec no longer has is lifted. A pod without pod-level resources gets no
// cpu or memory cgroup of its own, but one left by an earlier spec of the
// pod (the uid is kept across updates) is set back to the defaults.
func (m *Manager) limitPodResources(pod *v1.Pod) error {
	vals, ok := podLevelCgroupValues(pod)
	parent, err := m.podCgroupParent(string(pod.UID))
	if err != nil {
		return err
	}
	if !ok {
		vals = podCgroupValues{} // every value back to a new cgroup's
		if !m.hasPodResourceCgroup(parent) {
			return nil
		}
	}
	if isCgroup(filepath.Join(m.cfg.CgroupFS, "memory")) {
		return m.limitPodResourcesV1(parent, vals)
	}
	if controllers, err := os.ReadFile(filepath.Join(m.cfg.CgroupFS, "cgroup.controllers")); err == nil {
		have := strings.Fields(string(controllers))
		if slices.Contains(have, "cpu") && slices.Contains(have, "memory") {
			return m.limitPodResourcesV2(parent, vals)
		}
	}
	return errors.New("no cpu and memory cgroup controllers: cannot honour the pod's spec.resources")
}

// hasPodResourceCgroup reports whether the pod's cpu cgroup exists (v1)
// or its cgroup has the cpu controller (v2).
func (m *Manager) hasPodResourceCgroup(parent string) bool {
	if _, err := os.Stat(filepath.Join(m.cfg.CgroupFS, "cpu", parent, "cpu.shares")); err == nil {
		return true
	}
	_, err := os.Stat(filepath.Join(m.cfg.CgroupFS, parent, "cpu.weight"))
	return err == nil
}

func (m *Manager) limitPodResourcesV1(parent string, vals podCgroupValues) error {
	memDir := filepath.Join(m.cfg.CgroupFS, "memory", parent)
	cpuDir := filepath.Join(m.cfg.CgroupFS, "cpu", parent)
	for _, dir := range []string{memDir, cpuDir} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
	}
	// -1 is no limit: one an earlier spec set is lifted.
	quota, memory := int64(-1), int64(-1)
	if vals.cpuQuota > 0 {
		quota = vals.cpuQuota
	}
	if vals.memoryLimit > 0 {
		memory = vals.memoryLimit
	}
	// The period before the quota: the kernel checks the quota against it.
	shares := vals.cpuShares
	if shares == 0 {
		shares = defaultShares
	}
	return writeCgroupFiles([][2]string{
		{filepath.Join(cpuDir, "cpu.shares"), strconv.FormatInt(shares, 10)},
		{filepath.Join(cpuDir, "cpu.cfs_period_us"), strconv.Itoa(cfsPeriodUs)},
		{filepath.Join(cpuDir, "cpu.cfs_quota_us"), strconv.FormatInt(quota, 10)},
		{filepath.Join(memDir, "memory.limit_in_bytes"), strconv.FormatInt(memory, 10)},
	})
}

func (m *Manager) limitPodResourcesV2(parent string, vals podCgroupValues) error {
	dir := m.cfg.CgroupFS
	for _, part := range strings.Split(strings.Trim(parent, "/"), "/") {
		if err := os.WriteFile(filepath.Join(dir, "cgroup.subtree_control"), []byte("+cpu +memory"), 0o644); err != nil {
			return err
		}
		dir = filepath.Join(dir, part)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
	}
	// The kubelet's conversion of cpu shares to a v2 weight.
	weight := int64(defaultWeight)
	if vals.cpuShares > 0 {
		weight = 1 + ((vals.cpuShares-minShares)*9999)/(maxShares-minShares)
	}
	quota, memory := "max", "max" // no limit: one an earlier spec set is lifted
	if vals.cpuQuota > 0 {
		quota = strconv.FormatInt(vals.cpuQuota, 10)
	}
	if vals.memoryLimit > 0 {
		memory = strconv.FormatInt(vals.memoryLimit, 10)
	}
	return writeCgroupFiles([][2]string{
		{filepath.Join(dir, "cpu.weight"), strconv.FormatInt(weight, 10)},
		{filepath.Join(dir, "cpu.max"), quota + " " + strconv.Itoa(cfsPeriodUs)},
		{filepath.Join(dir, "memory.max"), memory},
	})
}

func writeCgroupFiles(writes [][2]string) error {
	for _, w := range writes {
		if err := os.WriteFile(w[0], []byte(w[1]), 0o644); err != nil {
			return err
		}
	}
	return nil
}
