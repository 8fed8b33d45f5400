package metrics

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/opencontainers/cgroups"
)

// leanStats is a cgroup manager whose GetStats reads only what the Summary
// publishes: total CPU time, memory usage and memory.stat (rss, inactive
// file pages for the working set, page faults). opencontainers/cgroups
// reads about 25 files per cgroup on v1 (kmem, memsw, tcp, failcnt,
// max_usage, per-CPU usage…); at 20 pods those reads were a tenth of
// mqlet's idle CPU. Every other method is the wrapped manager's, and
// cAdvisor's handler shapes the result (and adds network stats) as before.
type leanStats struct {
	cgroups.Manager
	paths   map[string]string // v1: controller → cgroup dir; v2: "" → the cgroup dir
	unified bool
}

// GetStats fills the cgroups.Stats fields cAdvisor turns into cpu usage,
// memory usage, working set, RSS and page faults.
func (l *leanStats) GetStats() (*cgroups.Stats, error) {
	st := cgroups.NewStats()
	if l.unified {
		return st, l.readUnified(st)
	}
	return st, l.readV1(st)
}

func (l *leanStats) readV1(st *cgroups.Stats) error {
	if dir := l.paths["cpuacct"]; dir != "" {
		usage, err := readUint(filepath.Join(dir, "cpuacct.usage"))
		if err != nil {
			return fmt.Errorf("reading cpu usage: %w", err)
		}
		st.CpuStats.CpuUsage.TotalUsage = usage
	}
	dir := l.paths["memory"]
	if dir == "" {
		return nil
	}
	usage, err := readUint(filepath.Join(dir, "memory.usage_in_bytes"))
	if err != nil {
		return fmt.Errorf("reading memory usage: %w", err)
	}
	st.MemoryStats.Usage.Usage = usage
	if err := readKeyed(filepath.Join(dir, "memory.stat"), st.MemoryStats.Stats); err != nil {
		return fmt.Errorf("reading memory.stat: %w", err)
	}
	// cAdvisor takes the hierarchical total_* figures when use_hierarchy is
	// on (always, since Linux 5.x; the file is gone on some kernels).
	hierarchy, err := readUint(filepath.Join(dir, "memory.use_hierarchy"))
	st.MemoryStats.UseHierarchy = err != nil || hierarchy == 1
	return nil
}

func (l *leanStats) readUnified(st *cgroups.Stats) error {
	dir := l.paths[""]
	cpu := map[string]uint64{}
	if err := readKeyed(filepath.Join(dir, "cpu.stat"), cpu); err != nil {
		return fmt.Errorf("reading cpu.stat: %w", err)
	}
	st.CpuStats.CpuUsage.TotalUsage = cpu["usage_usec"] * 1000
	// The root cgroup has no memory.current: the stats stay empty, as
	// cAdvisor's handler accepts for the root on v2.
	usage, err := readUint(filepath.Join(dir, "memory.current"))
	if err != nil {
		return fmt.Errorf("reading memory usage: %w", err)
	}
	st.MemoryStats.Usage.Usage = usage
	if err := readKeyed(filepath.Join(dir, "memory.stat"), st.MemoryStats.Stats); err != nil {
		return fmt.Errorf("reading memory.stat: %w", err)
	}
	return nil
}

// readUint reads a cgroup file holding one number ("max" is the largest).
func readUint(file string) (uint64, error) {
	raw, err := os.ReadFile(file)
	if err != nil {
		return 0, err
	}
	s := strings.TrimSpace(string(raw))
	if s == "max" {
		return ^uint64(0), nil
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("parsing %s: %w", file, err)
	}
	return v, nil
}

// readKeyed reads a flat keyed cgroup file ("key value" lines) into out;
// lines that are not a key and a number are skipped.
func readKeyed(file string, out map[string]uint64) error {
	raw, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	sc := bufio.NewScanner(bytes.NewReader(raw))
	for sc.Scan() {
		key, value, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			continue
		}
		if v, err := strconv.ParseUint(value, 10, 64); err == nil {
			out[key] = v
		}
	}
	return sc.Err()
}
