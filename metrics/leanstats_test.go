package metrics

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/opencontainers/cgroups"
)

func writeFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// The lean reader fills exactly what cAdvisor turns into the Summary's cpu
// and memory figures, from the v1 and the v2 file layouts.
func TestLeanStatsReadWhatTheSummaryUses(t *testing.T) {
	// The library reads only files on cgroupfs; its test mode lets it read
	// this temporary tree. The real-cgroup tests keep the check.
	cgroups.TestMode = true
	t.Cleanup(func() { cgroups.TestMode = false })
	root := t.TempDir()
	cpuacct, memory := filepath.Join(root, "cpuacct", "pod1"), filepath.Join(root, "memory", "pod1")
	writeFiles(t, cpuacct, map[string]string{"cpuacct.usage": "123456789\n"})
	writeFiles(t, memory, map[string]string{
		"memory.usage_in_bytes": "1048576\n",
		"memory.use_hierarchy":  "1\n",
		"memory.stat":           "cache 10\nrss 20\ntotal_rss 4096\ntotal_inactive_file 512\npgfault 77\npgmajfault 3\n",
	})
	v1 := &leanStats{paths: map[string]string{"cpuacct": cpuacct, "memory": memory, "cpu": filepath.Join(root, "cpu", "pod1")}}
	st, err := v1.GetStats()
	if err != nil {
		t.Fatal(err)
	}
	m := st.MemoryStats
	if st.CpuStats.CpuUsage.TotalUsage != 123456789 || m.Usage.Usage != 1048576 || !m.UseHierarchy ||
		m.Stats["total_rss"] != 4096 || m.Stats["total_inactive_file"] != 512 || m.Stats["pgfault"] != 77 || m.Stats["pgmajfault"] != 3 {
		t.Errorf("v1 stats: cpu %d, memory %+v", st.CpuStats.CpuUsage.TotalUsage, m)
	}

	unified := filepath.Join(root, "unified", "pod1")
	writeFiles(t, unified, map[string]string{
		"cpu.stat":       "usage_usec 2500\nuser_usec 2000\nsystem_usec 500\n",
		"memory.current": "2097152\n",
		"memory.stat":    "anon 8192\nfile 100\ninactive_file 1024\npgfault 9\npgmajfault 1\n",
	})
	v2 := &leanStats{paths: map[string]string{"": unified}, unified: true}
	st, err = v2.GetStats()
	if err != nil {
		t.Fatal(err)
	}
	m = st.MemoryStats
	if st.CpuStats.CpuUsage.TotalUsage != 2_500_000 || m.Usage.Usage != 2097152 ||
		m.Stats["anon"] != 8192 || m.Stats["inactive_file"] != 1024 || m.Stats["pgfault"] != 9 {
		t.Errorf("v2 stats: cpu %d, memory %+v", st.CpuStats.CpuUsage.TotalUsage, m)
	}

	// A cgroup removed meanwhile is an error, not zeros.
	gone := &leanStats{paths: map[string]string{"cpuacct": filepath.Join(root, "cpuacct", "gone"), "memory": filepath.Join(root, "memory", "gone")}}
	if _, err := gone.GetStats(); err == nil {
		t.Error("stats of a removed cgroup read without an error")
	}
	// A malformed number is an error too.
	bad := filepath.Join(root, "memory", "bad")
	writeFiles(t, bad, map[string]string{"memory.usage_in_bytes": "lots\n", "memory.stat": ""})
	if _, err := (&leanStats{paths: map[string]string{"memory": bad}}).GetStats(); err == nil {
		t.Error("a malformed memory.usage_in_bytes read without an error")
	}
}
