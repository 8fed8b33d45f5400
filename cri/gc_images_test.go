package cri

import (
	"context"
	"slices"
	"sort"
	"testing"
	"time"

	"github.com/rs/zerolog"
	internalapi "k8s.io/cri-api/pkg/apis"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// gcImageFake is the part of CRI image GC uses: images of 100 bytes by name.
type gcImageFake struct {
	internalapi.ImageManagerService
	images map[string]*runtimeapi.Image
}

func (f *gcImageFake) ImageFsInfo(context.Context) (*runtimeapi.ImageFsInfoResponse, error) {
	return &runtimeapi.ImageFsInfoResponse{ImageFilesystems: []*runtimeapi.FilesystemUsage{
		{FsId: &runtimeapi.FilesystemIdentifier{Mountpoint: "/var/lib/containerd"}}}}, nil
}

func (f *gcImageFake) ListImages(context.Context, *runtimeapi.ImageFilter) ([]*runtimeapi.Image, error) {
	var out []*runtimeapi.Image
	for _, img := range f.images { // map order: GC must sort itself
		out = append(out, img)
	}
	return out, nil
}

func (f *gcImageFake) RemoveImage(_ context.Context, spec *runtimeapi.ImageSpec) error {
	delete(f.images, spec.Image)
	return nil
}

// gcRuntimeFake runs one container of image "running".
type gcRuntimeFake struct {
	internalapi.RuntimeService
}

func (gcRuntimeFake) ListContainers(context.Context, *runtimeapi.ContainerFilter) ([]*runtimeapi.Container, error) {
	return []*runtimeapi.Container{{Id: "c1", ImageRef: "running", Image: &runtimeapi.ImageSpec{Image: "running"}}}, nil
}

func (gcRuntimeFake) Status(context.Context, bool) (*runtimeapi.StatusResponse, error) {
	return &runtimeapi.StatusResponse{}, nil
}

func TestImageGCRemovesLeastRecentlyUsedDownToLow(t *testing.T) {
	img := &gcImageFake{images: map[string]*runtimeapi.Image{}}
	for _, n := range []string{"old", "recent", "never", "running", "desired"} {
		img.images[n] = &runtimeapi.Image{Id: n, RepoTags: []string{n}, Size: 100}
	}
	rt := gcRuntimeFake{}
	m := newManager(Config{}, zerolog.Nop(), dialCRI)
	used := int64(800)
	m.statfs = func(string) (int64, int64, error) { return 1000, used, nil }
	svc := &services{runtime: rt, image: img}
	now := time.Now()
	m.imageUse.record("old", now.Add(-time.Hour))
	m.imageUse.record("recent", now.Add(-time.Minute))
	policy := GCPolicy{ImageGCHighThresholdPercent: 85, ImageGCLowThresholdPercent: 70, KeepImages: []string{"desired"}}

	// Below the high threshold: nothing goes.
	if err := m.gcImages(context.Background(), svc, policy); err != nil {
		t.Fatal(err)
	}
	if len(img.images) != 5 {
		t.Fatalf("removed below the high threshold: %v", keys(img.images))
	}
	// Above it: the least recently used go until usage is at the low mark
	// (900 → 700: two images of 100); "never" was first seen just now.
	used = 900
	if err := m.gcImages(context.Background(), svc, policy); err != nil {
		t.Fatal(err)
	}
	if got := keys(img.images); !slices.Equal(got, []string{"desired", "never", "running"}) {
		t.Fatalf("kept %v, want desired, never, running (old and recent removed, oldest first)", got)
	}
}

func keys(m map[string]*runtimeapi.Image) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
