package agent

import (
	"os"
	"path/filepath"
	"testing"
)

// memory.available of a cgroup is its limit less its working set (usage
// less inactive file pages); an unlimited cgroup counts the node's memory.
func TestCgroupMemory(t *testing.T) {
	write := func(dir string, files map[string]string) {
		for name, v := range files {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(v), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	v1 := t.TempDir()
	write(v1, map[string]string{"memory.limit_in_bytes": "209715200\n", "memory.usage_in_bytes": "150000000\n",
		"memory.stat": "cache 1\ntotal_inactive_file 20000000\ntotal_rss 5\n"})
	obs, err := cgroupMemory(v1, 1<<34)
	if err != nil || obs.Capacity != 209715200 || obs.Available != 209715200-130000000 {
		t.Fatalf("v1: %+v %v", obs, err)
	}
	v2 := t.TempDir()
	write(v2, map[string]string{"memory.max": "max\n", "memory.current": "1000\n", "memory.stat": "inactive_file 100\n"})
	obs, err = cgroupMemory(v2, 1<<30)
	if err != nil || obs.Capacity != 1<<30 || obs.Available != 1<<30-900 {
		t.Fatalf("v2 unlimited: %+v %v", obs, err)
	}
	if _, err := cgroupMemory(t.TempDir(), 1<<30); err == nil {
		t.Fatal("no cgroup files: no error")
	}
}
