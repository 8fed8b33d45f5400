package cri

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// GCPolicy says what GarbageCollect may remove.
type GCPolicy struct {
	// MinAge: dead containers younger than this are kept.
	MinAge time.Duration
	// MaxPerPodContainer dead attempts are kept per container (newest first);
	// negative means keep all.
	MaxPerPodContainer int
	// ImageGCHighThresholdPercent of image filesystem usage triggers image GC;
	// 0 turns image GC off. Unused images are removed until usage is at or
	// below ImageGCLowThresholdPercent.
	ImageGCHighThresholdPercent int
	ImageGCLowThresholdPercent  int
	// KeepImages are never removed: the agent passes the images of every
	// desired pod, which an offline gateway could not pull again.
	KeepImages []string
}

// GarbageCollect removes dead mqlet containers beyond the policy, every mqlet
// sandbox of a pod that is not desired (and superseded dead sandboxes of
// desired ones), orphaned pod and log directories, and unused images when
// the image filesystem is too full. Other clients' objects are never touched.
func (m *Manager) GarbageCollect(ctx context.Context, policy GCPolicy, isDesired func(uid string) bool) error {
	svc, err := m.conn.get()
	if err != nil {
		return err
	}
	ctx = quietContext(ctx)
	m.gcMu.Lock()
	defer m.gcMu.Unlock()
	// Taken after the caller read the desired pods: a pod applied since
	// then is synced after this mark, and what its sync made stays.
	since := m.syncing.mark()
	var errs []error
	if err := m.gcContainers(ctx, svc, policy, isDesired); err != nil {
		errs = append(errs, err)
	}
	if err := m.gcSandboxes(ctx, svc, isDesired); err != nil {
		errs = append(errs, err)
	}
	if err := m.gcPodDirs(ctx, svc, isDesired, since, policy.MinAge); err != nil {
		errs = append(errs, err)
	}
	if err := m.gcImages(ctx, svc, policy); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func (m *Manager) gcContainers(ctx context.Context, svc *services, policy GCPolicy, isDesired func(string) bool) error {
	containers, err := svc.runtime.ListContainers(ctx, &runtimeapi.ContainerFilter{LabelSelector: managedSelector()})
	if err != nil {
		return fmt.Errorf("gc: list containers: %w", err)
	}
	groups := map[string][]*runtimeapi.Container{}
	for _, c := range containers {
		if c.State != runtimeapi.ContainerState_CONTAINER_EXITED {
			continue
		}
		key := c.Labels[LabelPodUID] + "/" + c.Labels[LabelContainerName]
		groups[key] = append(groups[key], c)
	}
	now := time.Now()
	var errs []error
	for key, list := range groups {
		sort.Slice(list, func(i, j int) bool { return list[i].CreatedAt > list[j].CreatedAt })
		uid, _, _ := strings.Cut(key, "/")
		if m.terminating.active(uid) {
			continue // its kill removes them, after the grace period
		}
		keep := policy.MaxPerPodContainer
		if !isDesired(uid) {
			keep = 0
		} else if keep < 0 {
			continue
		}
		for _, c := range list[min(keep, len(list)):] {
			if now.Sub(time.Unix(0, c.CreatedAt)) < policy.MinAge {
				continue
			}
			if err := svc.runtime.RemoveContainer(ctx, c.Id); err != nil && !isNotFound(err) {
				errs = append(errs, fmt.Errorf("gc: remove container %s: %w", c.Id, err))
			}
		}
	}
	return errors.Join(errs...)
}

func (m *Manager) gcSandboxes(ctx context.Context, svc *services, isDesired func(string) bool) error {
	sandboxes, err := svc.runtime.ListPodSandbox(ctx, &runtimeapi.PodSandboxFilter{LabelSelector: managedSelector()})
	if err != nil {
		return fmt.Errorf("gc: list sandboxes: %w", err)
	}
	containers, err := svc.runtime.ListContainers(ctx, &runtimeapi.ContainerFilter{LabelSelector: managedSelector()})
	if err != nil {
		return fmt.Errorf("gc: list containers: %w", err)
	}
	inUse := map[string]bool{}
	alive := map[string]bool{} // sandboxes with a container not yet exited
	for _, c := range containers {
		inUse[c.PodSandboxId] = true
		if c.State != runtimeapi.ContainerState_CONTAINER_EXITED {
			alive[c.PodSandboxId] = true
		}
	}
	newest := map[string]*runtimeapi.PodSandbox{}
	for _, sb := range sandboxes {
		uid := sb.Labels[LabelPodUID]
		if n := newest[uid]; n == nil || sb.CreatedAt > n.CreatedAt {
			newest[uid] = sb
		}
	}
	var errs []error
	for _, sb := range sandboxes {
		uid := sb.Labels[LabelPodUID]
		switch {
		case m.terminating.active(uid):
			// A kill is giving the pod its grace period; removing the
			// sandbox now would kill the containers at once.
			continue
		case !isDesired(uid) && alive[sb.Id]:
			// Stopping running containers is the pod worker's job, with
			// the pod's grace period; GC only removes what has ended.
			continue
		case !isDesired(uid):
			m.log.Info().Str("pod", sb.Labels[LabelPodNamespace]+"/"+sb.Labels[LabelPodName]).Str("uid", uid).Msg("removing sandbox of a pod that is not desired")
		case sb.State != runtimeapi.PodSandboxState_SANDBOX_READY && newest[uid] != sb && !inUse[sb.Id]:
		default:
			continue
		}
		if err := m.removeSandbox(ctx, svc, sb.Id); err != nil {
			errs = append(errs, fmt.Errorf("gc: %w", err))
		}
	}
	return errors.Join(errs...)
}

// gcPodDirs removes volume and log directories, and pod cgroups in every
// hierarchy, of pods that are neither desired nor present in the runtime:
// what an agent killed between making them and creating the sandbox
// leaves, which no delete finds (there is nothing to kill). A pod being
// killed (its grace period), or synced since this collection began (its
// sandbox about to be made), keeps them; so does a pod cgroup younger than
// minAge (another process's pod about to get its sandbox, when two share
// a cgroup root, as tests on one host do).
func (m *Manager) gcPodDirs(ctx context.Context, svc *services, isDesired func(string) bool, since uint64, minAge time.Duration) error {
	present := map[string]bool{}
	sandboxes, err := svc.runtime.ListPodSandbox(ctx, &runtimeapi.PodSandboxFilter{LabelSelector: managedSelector()})
	if err != nil {
		return fmt.Errorf("gc: list sandboxes: %w", err)
	}
	for _, sb := range sandboxes {
		present[sb.Labels[LabelPodUID]] = true
	}
	// Only a direct child of the pods (or logs) directory named by a UUID
	// (ns_name_uuid) is ever removed, never while its pod terminates.
	orphan := func(uid string) bool {
		return IsUID(uid) && !present[uid] && !isDesired(uid) && !m.terminating.active(uid)
	}
	var errs []error
	// remove runs fn for uid unless a sync of it is under way or began
	// since the mark; no sync can begin while it runs.
	remove := func(uid string, fn func() error) {
		m.syncing.ifQuiet(uid, since, func() { errs = append(errs, fn()) })
	}
	if entries, err := os.ReadDir(m.cfg.PodDir); err == nil {
		for _, e := range entries {
			if !e.IsDir() || !orphan(e.Name()) {
				continue
			}
			if dir, err := m.podDir(e.Name()); err == nil {
				remove(e.Name(), func() error { return removeAllUnmounted(dir) })
			}
		}
	}
	if entries, err := os.ReadDir(m.cfg.PodLogDir); err == nil {
		for _, e := range entries {
			parts := strings.Split(e.Name(), "_")
			if !e.IsDir() || len(parts) != 3 || !orphan(parts[2]) {
				continue
			}
			if dir, err := m.podLogDir(parts[0], parts[1], parts[2]); err == nil && dir == filepath.Join(m.cfg.PodLogDir, e.Name()) {
				remove(parts[2], func() error { return os.RemoveAll(dir) })
			}
		}
	}
	// A cgroup still in use refuses the rmdir and stays.
	for _, uid := range m.podCgroupUIDs() {
		if !orphan(uid) || m.podCgroupYoungerThan(uid, minAge) {
			continue
		}
		remove(uid, func() error {
			if err := m.removePodCgroup(uid); err != nil && !errors.Is(err, syscall.EBUSY) {
				return fmt.Errorf("gc: pod cgroup %s: %w", uid, err)
			}
			return nil
		})
	}
	return errors.Join(errs...)
}

func (m *Manager) gcImages(ctx context.Context, svc *services, policy GCPolicy) error {
	if policy.ImageGCHighThresholdPercent <= 0 {
		return nil
	}
	fs, err := svc.image.ImageFsInfo(ctx)
	if err != nil {
		return fmt.Errorf("gc: image filesystem info: %w", err)
	}
	if len(fs.GetImageFilesystems()) == 0 {
		return nil
	}
	mount := fs.GetImageFilesystems()[0].GetFsId().GetMountpoint()
	capacity, used, err := m.statfs(mount)
	if err != nil {
		return fmt.Errorf("gc: statfs %s: %w", mount, err)
	}
	if capacity <= 0 || used*100/capacity < int64(policy.ImageGCHighThresholdPercent) {
		return nil
	}
	target := capacity * int64(policy.ImageGCLowThresholdPercent) / 100
	// Images used by any container of any client stay.
	containers, err := svc.runtime.ListContainers(ctx, nil)
	if err != nil {
		return fmt.Errorf("gc: list containers: %w", err)
	}
	used1 := map[string]bool{}
	for _, c := range containers {
		used1[c.ImageRef] = true
		used1[c.GetImage().GetImage()] = true
	}
	keep := map[string]bool{}
	for _, k := range policy.KeepImages {
		keep[NormalizeImage(k)] = true
	}
	// Offline, a removed sandbox image cannot come back and no pod could
	// start again: never remove it.
	if sandboxImage := m.sandboxImage(ctx, svc); sandboxImage != "" {
		keep[NormalizeImage(sandboxImage)] = true
	}
	images, err := svc.image.ListImages(ctx, nil)
	if err != nil {
		return fmt.Errorf("gc: list images: %w", err)
	}
	now := time.Now()
	var candidates []*runtimeapi.Image
	for _, img := range images {
		if img.Pinned || used1[img.Id] || anyIn(img.RepoTags, used1) || anyIn(img.RepoTags, keep) || anyIn(img.RepoDigests, used1) {
			m.imageUse.record(img.Id, now)
			continue
		}
		candidates = append(candidates, img)
	}
	// As the kubelet: the least recently used first (an image never used
	// since mqlet started counts from when it was first seen).
	lastUsed := m.imageUse.lastUsed(candidates, now)
	sort.SliceStable(candidates, func(i, j int) bool { return lastUsed[candidates[i].Id].Before(lastUsed[candidates[j].Id]) })
	var errs []error
	for _, img := range candidates {
		if used <= target {
			break
		}
		m.log.Info().Strs("tags", img.RepoTags).Uint64("bytes", img.Size).Msg("removing unused image")
		if err := svc.image.RemoveImage(ctx, &runtimeapi.ImageSpec{Image: img.Id}); err != nil && !isNotFound(err) {
			errs = append(errs, fmt.Errorf("gc: remove image %s: %w", img.Id, err))
			continue
		}
		used -= int64(img.Size)
	}
	return errors.Join(errs...)
}

func anyIn(list []string, set map[string]bool) bool {
	for _, s := range list {
		if set[s] {
			return true
		}
	}
	return false
}

// sandboxImage asks the runtime which image its sandboxes use (containerd
// reports its CRI config in the verbose status); "" when it does not say.
func (m *Manager) sandboxImage(ctx context.Context, svc *services) string {
	resp, err := svc.runtime.Status(ctx, true)
	if err != nil {
		return ""
	}
	var cfg struct {
		SandboxImage string `json:"sandboxImage"`
	}
	if json.Unmarshal([]byte(resp.GetInfo()["config"]), &cfg) != nil {
		return ""
	}
	return cfg.SandboxImage
}

// NormalizeImage writes an image reference the way runtimes list repo tags:
// "busybox" is "docker.io/library/busybox:latest".
func NormalizeImage(ref string) string {
	if ref == "" || strings.Contains(ref, "@") {
		return ref
	}
	name, domain := ref, ""
	if i := strings.IndexByte(ref, '/'); i > 0 && (strings.ContainsAny(ref[:i], ".:") || ref[:i] == "localhost") {
		domain, name = ref[:i], ref[i+1:]
	}
	if domain == "" {
		domain = "docker.io"
		if !strings.Contains(name, "/") {
			name = "library/" + name
		}
	}
	if !strings.Contains(name[strings.LastIndexByte(name, '/')+1:], ":") {
		name += ":latest"
	}
	return domain + "/" + name
}

// imageUses remembers when each image (by id) was last used to start a
// container, and when images never used were first seen, for image GC.
type imageUses struct {
	mu    sync.Mutex
	used  map[string]time.Time
	first map[string]time.Time
}

func (u *imageUses) record(id string, at time.Time) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.used == nil {
		u.used = map[string]time.Time{}
	}
	u.used[id] = at
}

// lastUsed returns, per image, its last use or else when it was first seen
// (now for images seen for the first time), and forgets images gone.
func (u *imageUses) lastUsed(images []*runtimeapi.Image, now time.Time) map[string]time.Time {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.first == nil {
		u.first = map[string]time.Time{}
	}
	out := make(map[string]time.Time, len(images))
	for _, img := range images {
		if t, ok := u.used[img.Id]; ok {
			out[img.Id] = t
			continue
		}
		if _, ok := u.first[img.Id]; !ok {
			u.first[img.Id] = now
		}
		out[img.Id] = u.first[img.Id]
	}
	return out
}

// statfsUsage returns the size and the used bytes of the filesystem at path.
func statfsUsage(path string) (capacity, used int64, err error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(path, &st); err != nil {
		return 0, 0, err
	}
	capacity = int64(st.Blocks) * int64(st.Bsize) // Bsize is int32 on 32-bit arm
	return capacity, capacity - int64(st.Bavail)*int64(st.Bsize), nil
}
