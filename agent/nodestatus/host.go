package nodestatus

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
)

// HostConfig says where ReadHostInputs looks; empty fields take the usual
// locations.
type HostConfig struct {
	// StateDir is mqlet's state directory; its filesystem is the node's disk.
	StateDir string
	// OSReleasePath defaults to /etc/os-release.
	OSReleasePath string
	// ProcRoot defaults to /proc.
	ProcRoot string
}

// HostInputs is the part of Inputs read from the host.
type HostInputs struct {
	Host HostInfo
	Disk *DiskUsage
	PIDs *PIDUsage
}

// ReadHostInputs reads the host's identity, addresses, disk and PID usage.
// What could be read is returned even when some part failed; the error then
// says which parts are missing.
func ReadHostInputs(cfg HostConfig) (HostInputs, error) {
	if cfg.OSReleasePath == "" {
		cfg.OSReleasePath = "/etc/os-release"
	}
	if cfg.ProcRoot == "" {
		cfg.ProcRoot = "/proc"
	}
	var errs []error
	out := HostInputs{Host: HostInfo{OperatingSystem: runtime.GOOS, Architecture: runtime.GOARCH}}
	var err error
	if out.Host.OSImage, err = ReadOSImage(cfg.OSReleasePath); err != nil {
		errs = append(errs, err)
	}
	if out.Host.KernelVersion, err = KernelVersion(); err != nil {
		errs = append(errs, err)
	}
	if out.Host.Hostname, err = os.Hostname(); err != nil {
		errs = append(errs, fmt.Errorf("reading hostname: %w", err))
	}
	out.Host.Hostname = strings.ToLower(out.Host.Hostname)
	if out.Host.InternalIPs, err = InternalIPs(); err != nil {
		errs = append(errs, err)
	}
	if pids, err := ReadPIDUsage(cfg.ProcRoot); err != nil {
		errs = append(errs, err)
	} else {
		out.PIDs = &pids
	}
	if cfg.StateDir != "" {
		if disk, err := ReadDiskUsage(cfg.StateDir); err != nil {
			errs = append(errs, err)
		} else {
			out.Disk = &disk
		}
	}
	return out, errors.Join(errs...)
}

// ReadOSImage returns PRETTY_NAME from an os-release file (as kubelet's
// osImage), falling back to NAME VERSION.
func ReadOSImage(path string) (string, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("reading OS image from %s: %w", path, err)
	}
	fields := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(raw))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		key, value, ok := strings.Cut(line, "=")
		if !ok {
			continue
		}
		if unquoted, err := strconv.Unquote(value); err == nil {
			value = unquoted
		} else {
			value = strings.Trim(value, `'"`)
		}
		fields[key] = value
	}
	if name := fields["PRETTY_NAME"]; name != "" {
		return name, nil
	}
	if name := strings.TrimSpace(fields["NAME"] + " " + fields["VERSION"]); name != "" {
		return name, nil
	}
	return "", fmt.Errorf("reading OS image from %s: no PRETTY_NAME or NAME", path)
}

// KernelVersion is uname's release, e.g. "6.1.0-18-amd64".
func KernelVersion() (string, error) {
	var uts syscall.Utsname
	if err := syscall.Uname(&uts); err != nil {
		return "", fmt.Errorf("reading kernel version: %w", err)
	}
	release := make([]byte, 0, len(uts.Release))
	for _, c := range uts.Release {
		if c == 0 {
			break
		}
		release = append(release, byte(c))
	}
	return string(release), nil
}

// containerInterfacePrefixes name the bridges and tunnels that container
// runtimes and CNI plugins create; their addresses are not the node's.
var containerInterfacePrefixes = []string{
	"cni", "docker", "veth", "br-", "virbr", "flannel", "cali", "cilium", "weave",
	"kube-", "lxc", "lxd", "podman", "nerdctl", "vxlan", "tunl", "genev", "mqlet",
}

// IsContainerInterface reports whether name looks like a container bridge,
// veth or overlay device.
func IsContainerInterface(name string) bool {
	for _, prefix := range containerInterfacePrefixes {
		if strings.HasPrefix(name, prefix) {
			return true
		}
	}
	return false
}

// InternalIPs lists the global unicast addresses of the up, non-loopback,
// non-container interfaces, IPv4 first, in interface order.
func InternalIPs() ([]string, error) {
	ifaces, err := net.Interfaces()
	if err != nil {
		return nil, fmt.Errorf("listing network interfaces: %w", err)
	}
	var v4, v6 []string
	for _, iface := range ifaces {
		if iface.Flags&net.FlagUp == 0 || iface.Flags&net.FlagLoopback != 0 || IsContainerInterface(iface.Name) {
			continue
		}
		addrs, err := iface.Addrs()
		if err != nil {
			return nil, fmt.Errorf("listing addresses of %s: %w", iface.Name, err)
		}
		for _, addr := range addrs {
			ipNet, ok := addr.(*net.IPNet)
			if !ok || !ipNet.IP.IsGlobalUnicast() {
				continue
			}
			if ipNet.IP.To4() != nil {
				v4 = append(v4, ipNet.IP.String())
			} else {
				v6 = append(v6, ipNet.IP.String())
			}
		}
	}
	return append(v4, v6...), nil
}

// ReadPIDUsage compares the tasks alive with kernel.pid_max. Every thread
// takes a PID, so the kernel's task count (the total in /proc/loadavg's
// "running/total" field) is used, not just the process directories in /proc.
func ReadPIDUsage(procRoot string) (PIDUsage, error) {
	raw, err := os.ReadFile(filepath.Join(procRoot, "sys", "kernel", "pid_max"))
	if err != nil {
		return PIDUsage{}, fmt.Errorf("reading pid_max: %w", err)
	}
	limit, err := strconv.ParseUint(strings.TrimSpace(string(raw)), 10, 64)
	if err != nil {
		return PIDUsage{}, fmt.Errorf("parsing pid_max %q: %w", raw, err)
	}
	loadavg, err := os.ReadFile(filepath.Join(procRoot, "loadavg"))
	if err != nil {
		return PIDUsage{}, fmt.Errorf("counting tasks: %w", err)
	}
	fields := strings.Fields(string(loadavg))
	if len(fields) < 4 {
		return PIDUsage{}, fmt.Errorf("counting tasks: unexpected loadavg %q", loadavg)
	}
	_, total, ok := strings.Cut(fields[3], "/")
	tasks, err := strconv.ParseUint(total, 10, 64)
	if !ok || err != nil {
		return PIDUsage{}, fmt.Errorf("counting tasks: unexpected loadavg field %q", fields[3])
	}
	return PIDUsage{Running: tasks, Max: limit}, nil
}

// ReadDiskUsage statfs'es the filesystem holding dir (or its nearest existing
// parent, so a state directory not created yet still has a disk).
func ReadDiskUsage(dir string) (DiskUsage, error) {
	existing := filepath.Clean(dir)
	for {
		if _, err := os.Stat(existing); err == nil {
			break
		}
		parent := filepath.Dir(existing)
		if parent == existing {
			break
		}
		existing = parent
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(existing, &st); err != nil {
		return DiskUsage{}, fmt.Errorf("statfs %s: %w", existing, err)
	}
	return DiskUsage{
		CapacityBytes:  st.Blocks * uint64(st.Bsize),
		AvailableBytes: st.Bavail * uint64(st.Bsize),
	}, nil
}

// ReadMemTotal is the machine's memory in bytes (MemTotal of
// <procRoot>/meminfo, what cAdvisor reports as memory capacity).
func ReadMemTotal(procRoot string) (uint64, error) {
	f, err := os.Open(filepath.Join(procRoot, "meminfo"))
	if err != nil {
		return 0, fmt.Errorf("reading meminfo: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) == 3 && fields[0] == "MemTotal:" && fields[2] == "kB" {
			kb, err := strconv.ParseUint(fields[1], 10, 64)
			if err != nil {
				return 0, fmt.Errorf("parsing MemTotal %q: %w", fields[1], err)
			}
			return kb * 1024, nil
		}
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("reading meminfo: %w", err)
	}
	return 0, errors.New("reading meminfo: no MemTotal line")
}
