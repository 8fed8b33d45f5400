package cri

import (
	"context"
	"fmt"
	"io/fs"
	"path/filepath"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// ContainerFs is how much disk one container uses: its writable layer (as
// the runtime reports it) and its log files.
type ContainerFs struct {
	RootfsUsedBytes uint64
	RootfsMount     string // the filesystem holding the writable layer ("" if unknown)
	LogsUsedBytes   uint64
	LogsDir         string
}

// ContainerFilesystems reports the disk use of every mqlet container, by
// container ID.
func (m *Manager) ContainerFilesystems(ctx context.Context) (map[string]ContainerFs, error) {
	svc, err := m.conn.get()
	if err != nil {
		return nil, err
	}
	containers, byID, err := listManagedWithStats(quietContext(ctx), svc, "disk usage")
	if err != nil {
		return nil, err
	}
	out := make(map[string]ContainerFs, len(containers))
	for _, c := range containers {
		var usage ContainerFs
		if dir, err := m.podLogDir(c.Labels[LabelPodNamespace], c.Labels[LabelPodName], c.Labels[LabelPodUID]); err == nil && checkLabelName("container", c.Labels[LabelContainerName]) == nil {
			usage.LogsDir = filepath.Join(dir, c.Labels[LabelContainerName])
		}
		if s := byID[c.Id]; s != nil && s.GetWritableLayer() != nil {
			usage.RootfsUsedBytes = s.GetWritableLayer().GetUsedBytes().GetValue()
			usage.RootfsMount = s.GetWritableLayer().GetFsId().GetMountpoint()
		}
		if usage.LogsDir != "" {
			usage.LogsUsedBytes = dirBytes(usage.LogsDir)
		}
		out[c.Id] = usage
	}
	return out, nil
}

// dirBytes adds up the sizes of the regular files under dir (0 if missing).
func dirBytes(dir string) uint64 {
	var total uint64
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil // a file rotated away while walking is no error
		}
		if d.Type().IsRegular() {
			if info, err := d.Info(); err == nil {
				total += uint64(info.Size())
			}
		}
		return nil
	})
	return total
}

// listManagedWithStats lists mqlet's containers and their stats, the stats
// by container ID; what names the reader in errors.
func listManagedWithStats(ctx context.Context, svc *services, what string) ([]*runtimeapi.Container, map[string]*runtimeapi.ContainerStats, error) {
	containers, err := svc.runtime.ListContainers(ctx, &runtimeapi.ContainerFilter{LabelSelector: managedSelector()})
	if err != nil {
		return nil, nil, fmt.Errorf("list containers for %s: %w", what, err)
	}
	stats, err := svc.runtime.ListContainerStats(ctx, &runtimeapi.ContainerStatsFilter{LabelSelector: managedSelector()})
	if err != nil {
		return nil, nil, fmt.Errorf("list container stats for %s: %w", what, err)
	}
	byID := make(map[string]*runtimeapi.ContainerStats, len(stats))
	for _, s := range stats {
		byID[s.GetAttributes().GetId()] = s
	}
	return containers, byID, nil
}
