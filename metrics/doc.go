// Package metrics collects node, pod and container usage with cAdvisor's
// library and shapes it as the kubelet stats Summary
// (k8s.io/kubelet/pkg/apis/stats/v1alpha1), the payload of the
// `mqlet/v1/<node>/metrics` topic.
//
// # How cAdvisor is used
//
// kubelet runs cAdvisor's manager (lib/manager) with per-container
// housekeeping goroutines. That manager cannot be shut down cleanly:
// manager.Stop only ends the watcher, global-housekeeping and machine-info
// loops, while every tracked container keeps its housekeeping goroutine (and
// the raw factory keeps its inotify reader) for the life of the process;
// measured with cAdvisor lib v0.60.5, 5 goroutines survived Stop with 4 tracked
// cgroups. It also needs process-global flags (housekeeping_interval) and a
// process-global factory registry. mqlet must own and stop everything it starts,
// so the Collector drives the same cAdvisor building blocks itself, with no
// background goroutine at all:
//   - lib/container/libcontainer.Handler.GetStats: the code the manager's
//     housekeeping calls, for cpu, memory and (for the root, via PID 1)
//     network stats of one cgroup;
//   - lib/container/common.GetSpec: limits and creation time of a cgroup;
//   - lib/machine.Info: MachineInfo (cores, memory, IDs, filesystems);
//   - lib/fs: filesystem capacity and usage of a directory.
//
// Samples are taken when Summary is called; a sample younger than the
// housekeeping interval is reused instead of re-reading the cgroup, so calling
// Summary often costs little. usageNanoCores is the rate between the current
// and the previous sample of the same cgroup (cAdvisor's InstCpuStats); it is
// absent the first time a cgroup is seen.
//
// # Where mqlet's own counters go
//
// Everything published must decode strictly into stats/v1alpha1.Summary, and
// the Summary has no free-form field. mqlet's counters (messages in/out,
// outbox depth, drops, queue depth, syncs, backoffs, reconnects) are therefore
// published as a system container named "mqlet" in node.systemContainers,
// as userDefinedMetrics (gauge or cumulative), which is exactly what that
// field exists for. The same container carries the agent process's own CPU
// time and the filesystem of "/" as its rootfs; node.fs is the filesystem of
// mqlet's state directory (kubelet reports its root directory there too).
package metrics
