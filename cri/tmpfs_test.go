package cri

import (
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

func TestEmptyDirMemorySize(t *testing.T) {
	q := resource.MustParse
	alloc := v1.ResourceList{v1.ResourceMemory: q("1Gi")}
	limited := func(limits ...string) *v1.Pod {
		p := volumePod()
		p.Spec.Containers = nil
		for _, l := range limits {
			p.Spec.Containers = append(p.Spec.Containers, v1.Container{Resources: v1.ResourceRequirements{Limits: v1.ResourceList{v1.ResourceMemory: q(l)}}})
		}
		return p
	}
	size := func(s string) *resource.Quantity { v := q(s); return &v }
	cases := []struct {
		pod  *v1.Pod
		ed   v1.EmptyDirVolumeSource
		want int64
	}{
		{volumePod(), v1.EmptyDirVolumeSource{}, 1 << 30},                           // no limits: allocatable
		{limited("64Mi", "32Mi"), v1.EmptyDirVolumeSource{}, 96 << 20},              // the pod's limit
		{limited("64Mi"), v1.EmptyDirVolumeSource{SizeLimit: size("8Mi")}, 8 << 20}, // the sizeLimit, smaller
		{limited("64Mi"), v1.EmptyDirVolumeSource{SizeLimit: size("2Gi")}, 64 << 20},
		{volumePod(), v1.EmptyDirVolumeSource{SizeLimit: size("2Gi")}, 1 << 30},
	}
	for i, c := range cases {
		if got := emptyDirMemorySize(c.pod, &c.ed, alloc); got != c.want {
			t.Errorf("case %d: %d, want %d", i, got, c.want)
		}
	}
}

// A memory emptyDir is a tmpfs of its sizeLimit that any user may write.
func TestEmptyDirMemoryIsSizedTmpfs(t *testing.T) {
	requireRoot(t)
	m := testManager(t)
	limit := resource.MustParse("2Mi")
	pod := volumePod(v1.Volume{Name: "mem", VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{Medium: v1.StorageMediumMemory, SizeLimit: &limit}}})
	for range 2 {
		paths, err := m.prepareVolumes(pod, fakeObjects{})
		if err != nil {
			t.Fatal(err)
		}
		var st unix.Statfs_t
		must(t, unix.Statfs(paths["mem"], &st))
		if st.Type != unix.TMPFS_MAGIC || int64(st.Blocks)*st.Bsize != 2<<20 {
			t.Fatalf("type %#x, %d bytes; want a 2 MiB tmpfs", st.Type, int64(st.Blocks)*st.Bsize)
		}
		if got := modeOf(t, paths["mem"]); got != 0o777 {
			t.Errorf("mode %#o, want 0777", got)
		}
		if mps, _ := mountPointsUnder(filepath.Clean(paths["mem"])); len(mps) != 1 {
			t.Errorf("%d mounts, want 1", len(mps))
		}
	}
	must(t, m.removePodDirs(testUID, "web", "default"))
}
