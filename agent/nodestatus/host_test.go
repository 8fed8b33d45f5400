package nodestatus

import (
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

func TestReadHostInputsOnThisMachine(t *testing.T) {
	stateDir := filepath.Join(t.TempDir(), "not", "created", "yet")
	got, err := ReadHostInputs(HostConfig{StateDir: stateDir})
	if err != nil {
		t.Fatalf("ReadHostInputs: %v", err)
	}
	h := got.Host
	if h.OperatingSystem != "linux" || h.Architecture != runtime.GOARCH {
		t.Errorf("os/arch = %s/%s", h.OperatingSystem, h.Architecture)
	}
	release, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		t.Fatalf("reading osrelease: %v", err)
	}
	if h.KernelVersion != strings.TrimSpace(string(release)) {
		t.Errorf("kernel = %q, /proc says %q", h.KernelVersion, release)
	}
	if h.OSImage == "" || h.OSImage == "Linux" {
		t.Errorf("osImage = %q", h.OSImage)
	}
	hostname, _ := os.Hostname()
	if h.Hostname != strings.ToLower(hostname) {
		t.Errorf("hostname = %q, want %q", h.Hostname, hostname)
	}
	if len(h.InternalIPs) == 0 {
		t.Errorf("no internal IPs found")
	}
	for _, ip := range h.InternalIPs {
		parsed := net.ParseIP(ip)
		if parsed == nil || parsed.IsLoopback() || !parsed.IsGlobalUnicast() {
			t.Errorf("address %q is not a global unicast address", ip)
		}
	}

	if got.PIDs == nil {
		t.Fatalf("no PID usage")
	}
	pidMax, _ := os.ReadFile("/proc/sys/kernel/pid_max")
	if want, _ := strconv.ParseUint(strings.TrimSpace(string(pidMax)), 10, 64); got.PIDs.Max != want {
		t.Errorf("pid max = %d, want %d", got.PIDs.Max, want)
	}
	entries, _ := os.ReadDir("/proc")
	processes := 0
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err == nil {
			processes++
		}
	}
	// Tasks include threads, so at least the processes (give or take churn).
	if got.PIDs.Running+20 < uint64(processes) || got.PIDs.Running >= got.PIDs.Max {
		t.Errorf("running tasks = %d with %d processes in /proc, max %d", got.PIDs.Running, processes, got.PIDs.Max)
	}

	if got.Disk == nil {
		t.Fatalf("no disk usage")
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(os.TempDir(), &st); err != nil {
		t.Fatalf("statfs: %v", err)
	}
	if got.Disk.CapacityBytes != st.Blocks*uint64(st.Bsize) || got.Disk.AvailableBytes == 0 || got.Disk.AvailableBytes > got.Disk.CapacityBytes {
		t.Errorf("disk = %+v, statfs of the temp dir says capacity %d", got.Disk, st.Blocks*uint64(st.Bsize))
	}
}

func TestReadOSImage(t *testing.T) {
	cases := []struct {
		name, content, want string
		wantErr             bool
	}{
		{"pretty name", "NAME=\"Debian GNU/Linux\"\nPRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\n", "Debian GNU/Linux 12 (bookworm)", false},
		{"single quotes and comments", "# comment\nPRETTY_NAME='Alpine Linux v3.19'\n", "Alpine Linux v3.19", false},
		{"name and version", "NAME=Buildroot\nVERSION=2024.02\n", "Buildroot 2024.02", false},
		{"nothing useful", "ID=x\n", "", true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "os-release")
			if err := os.WriteFile(path, []byte(tc.content), 0o644); err != nil {
				t.Fatal(err)
			}
			got, err := ReadOSImage(path)
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Errorf("ReadOSImage = %q, %v; want %q (error %v)", got, err, tc.want, tc.wantErr)
			}
		})
	}
}

func TestIsContainerInterface(t *testing.T) {
	for name, want := range map[string]bool{
		"eth0": false, "enp3s0": false, "wlan0": false, "wwan0": false,
		"cni0": true, "docker0": true, "veth1234": true, "br-5f2a": true, "flannel.1": true, "cali12": true,
	} {
		if got := IsContainerInterface(name); got != want {
			t.Errorf("IsContainerInterface(%q) = %v, want %v", name, got, want)
		}
	}
}

func TestReadPIDUsageFromFakeProc(t *testing.T) {
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "sys", "kernel"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "sys", "kernel", "pid_max"), []byte("32768\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "loadavg"), []byte("0.10 0.20 0.30 2/517 9999\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := ReadPIDUsage(root)
	if err != nil || got != (PIDUsage{Running: 517, Max: 32768}) {
		t.Errorf("ReadPIDUsage = %+v, %v", got, err)
	}
	if err := os.WriteFile(filepath.Join(root, "loadavg"), []byte("garbage\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadPIDUsage(root); err == nil {
		t.Errorf("garbage loadavg accepted")
	}
}
