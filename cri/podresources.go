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
)

// podCgroupValues are the pod cgroup's cpu and memory settings from
// pod-level resources; zero is not set.
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
// containers' cgroups beneath it, so they share the limits). A pod
// without pod-level resources is left alone.
func (m *Manager) limitPodResources(pod *v1.Pod) error {
	vals, ok := podLevelCgroupValues(pod)
	if !ok {
		return nil
	}
	parent, err := m.podCgroupParent(string(pod.UID))
	if err != nil {
		return err
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

func (m *Manager) limitPodResourcesV1(parent string, vals podCgroupValues) error {
	memDir := filepath.Join(m.cfg.CgroupFS, "memory", parent)
	cpuDir := filepath.Join(m.cfg.CgroupFS, "cpu", parent)
	for _, dir := range []string{memDir, cpuDir} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
	}
	writes := [][2]string{{filepath.Join(cpuDir, "cpu.shares"), strconv.FormatInt(vals.cpuShares, 10)}}
	if vals.cpuQuota > 0 {
		// The period first: the kernel checks the quota against it.
		writes = append(writes,
			[2]string{filepath.Join(cpuDir, "cpu.cfs_period_us"), strconv.Itoa(cfsPeriodUs)},
			[2]string{filepath.Join(cpuDir, "cpu.cfs_quota_us"), strconv.FormatInt(vals.cpuQuota, 10)})
	}
	if vals.memoryLimit > 0 {
		writes = append(writes, [2]string{filepath.Join(memDir, "memory.limit_in_bytes"), strconv.FormatInt(vals.memoryLimit, 10)})
	}
	return writeCgroupFiles(writes)
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
	weight := 1 + ((vals.cpuShares-minShares)*9999)/(maxShares-minShares)
	writes := [][2]string{{filepath.Join(dir, "cpu.weight"), strconv.FormatInt(weight, 10)}}
	if vals.cpuQuota > 0 {
		writes = append(writes, [2]string{filepath.Join(dir, "cpu.max"), strconv.FormatInt(vals.cpuQuota, 10) + " " + strconv.Itoa(cfsPeriodUs)})
	}
	if vals.memoryLimit > 0 {
		writes = append(writes, [2]string{filepath.Join(dir, "memory.max"), strconv.FormatInt(vals.memoryLimit, 10)})
	}
	return writeCgroupFiles(writes)
}

func writeCgroupFiles(writes [][2]string) error {
	for _, w := range writes {
		if err := os.WriteFile(w[0], []byte(w[1]), 0o644); err != nil {
			return err
		}
	}
	return nil
}
