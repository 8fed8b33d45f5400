package telemetry

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/cadvisor/lib/fs"
	"github.com/google/cadvisor/lib/machine"
	cadvisorapi "github.com/google/cadvisor/lib/model"
	"github.com/google/cadvisor/lib/utils/sysfs"
)

// ReadMemAvailable returns MemAvailable from a meminfo file (the kernel's
// estimate of memory available without swapping), in bytes.
func ReadMemAvailable(path string) (uint64, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("reading available memory: %w", err)
	}
	sc := bufio.NewScanner(bytes.NewReader(raw))
	for sc.Scan() {
		key, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok || key != "MemAvailable" {
			continue
		}
		fields := strings.Fields(rest)
		if len(fields) == 0 {
			break
		}
		kb, err := strconv.ParseUint(fields[0], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("parsing MemAvailable in %s: %w", path, err)
		}
		if len(fields) > 1 && fields[1] != "kB" {
			return 0, fmt.Errorf("parsing MemAvailable in %s: unexpected unit %q", path, fields[1])
		}
		return kb * 1024, nil
	}
	return 0, fmt.Errorf("reading available memory: no MemAvailable in %s", path)
}

// machineInfoMaxAge is how long a HostMachine reuses its MachineInfo, as
// cAdvisor's manager does.
const machineInfoMaxAge = 5 * time.Minute

// HostMachine reads cAdvisor's MachineInfo without a metrics collector, for
// when metrics are turned off. It is safe for concurrent use.
type HostMachine struct {
	fsInfo fs.FsInfo
	sysFs  sysfs.SysFs

	mu   sync.Mutex
	info *cadvisorapi.MachineInfo
	at   time.Time
}

// NewHostMachine prepares the filesystem view MachineInfo needs.
func NewHostMachine() (*HostMachine, error) {
	fsInfo, err := fs.NewFsInfo(fs.Context{})
	if err != nil {
		return nil, fmt.Errorf("reading filesystems for machine info: %w", err)
	}
	return &HostMachine{fsInfo: fsInfo, sysFs: sysfs.NewRealSysFs()}, nil
}

// MachineInfo returns the machine's description, cached for a few minutes.
func (m *HostMachine) MachineInfo() (*cadvisorapi.MachineInfo, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.info != nil && time.Since(m.at) < machineInfoMaxAge {
		return m.info.Clone(), nil
	}
	info, err := machine.Info(m.sysFs, m.fsInfo, true)
	if err != nil {
		if m.info != nil {
			return m.info.Clone(), nil
		}
		return nil, fmt.Errorf("reading machine info: %w", err)
	}
	if info == nil {
		return nil, errors.New("reading machine info: cAdvisor returned none")
	}
	m.info, m.at = info, time.Now()
	return info.Clone(), nil
}
