package validate

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/kubernetes/third_party/forked/golang/expansion"
)

// doublingPod's env doubles through $(VAR) references n times: fully
// expanded, the last value is 2^n bytes.
func doublingPod(n int) *v1.Pod {
	p := basePod()
	env := []v1.EnvVar{{Name: "V0", Value: "x"}}
	for i := 1; i <= n; i++ {
		env = append(env, v1.EnvVar{Name: fmt.Sprintf("V%d", i), Value: fmt.Sprintf("$(V%d)$(V%d)", i-1, i-1)})
	}
	p.Spec.Containers[0].Env = env
	return p
}

func TestEnvDoublingRejected(t *testing.T) {
	errs := ValidatePod(doublingPod(40), node, Policy{})
	// 2^15 = 32768 fits; 2^16 does not.
	if !hasField(errs, "spec.containers[0].env[16].value") || !strings.Contains(FormatErrors(errs), "MaxExpandedValueBytes") {
		t.Fatalf("doubling env not rejected at env[16]: %s", FormatErrors(errs))
	}
	if errs := ValidatePod(doublingPod(15), node, Policy{}); len(errs) != 0 {
		t.Fatalf("32 KiB value rejected: %s", FormatErrors(errs))
	}
}

// TestEnvDoublingCostsLittle: judging the bomb allocates a few KiB, not
// the terabyte its expansion would take.
func TestEnvDoublingCostsLittle(t *testing.T) {
	pod := doublingPod(40)
	allocs := testing.AllocsPerRun(20, func() { _ = CheckBounds(&pod.Spec) })
	t.Logf("CheckBounds on the doubling pod: %.0f allocations", allocs)
	if allocs > 64 { // the map of names and the one error; nothing per expansion
		t.Errorf("CheckBounds on the doubling pod: %.0f allocations per run", allocs)
	}
	r := testing.Benchmark(func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = ValidatePod(pod, node, Policy{})
		}
	})
	if got := r.AllocedBytesPerOp(); got > 256<<10 {
		t.Errorf("ValidatePod on the doubling pod allocates %d bytes per call", got)
	}
}

func TestEnvTotalBound(t *testing.T) {
	p := basePod()
	big := strings.Repeat("y", 30<<10)
	for i := 0; i < 40; i++ { // 40 × 30 KiB > 1 MiB, each value under 32 KiB
		p.Spec.Containers[0].Env = append(p.Spec.Containers[0].Env, v1.EnvVar{Name: fmt.Sprintf("E%d", i), Value: "$(BIG)"})
	}
	p.Spec.Containers[0].Env = append([]v1.EnvVar{{Name: "BIG", Value: big}}, p.Spec.Containers[0].Env...)
	errs := CheckBounds(&p.Spec)
	if len(errs) != 1 || !strings.Contains(errs[0].Detail, "MaxExpandedEnvBytes") || !strings.HasPrefix(errs[0].Field, "spec.containers[0].env[") {
		t.Fatalf("total env bound not enforced: %s", FormatErrors(errs))
	}
	// Redefining a name replaces its value rather than adding to the total.
	p.Spec.Containers[0].Env = nil
	for i := 0; i < 100; i++ {
		p.Spec.Containers[0].Env = append(p.Spec.Containers[0].Env, v1.EnvVar{Name: "SAME", Value: big})
	}
	if errs := CheckBounds(&p.Spec); len(errs) != 0 {
		t.Fatalf("redefined name counted twice: %s", FormatErrors(errs))
	}
}

func TestCommandAndArgsBound(t *testing.T) {
	p := doublingPod(12) // V12 is 4 KiB
	p.Spec.Containers[0].Command = []string{"sh", strings.Repeat("$(V12)", 9)}
	p.Spec.Containers[0].Args = []string{"$(V12)", strings.Repeat("$(V12)", 8) + "z"}
	errs := CheckBounds(&p.Spec)
	if len(errs) != 2 || !hasField(errs, "spec.containers[0].command[1]") || !hasField(errs, "spec.containers[0].args[1]") {
		t.Fatalf("want command[1] and args[1] over the bound: %s", FormatErrors(errs))
	}
}

// TestValueFromCountsAsNonEmpty: an env var from a config map is unknown at
// admission; doubling references over it are still caught.
func TestValueFromCountsAsNonEmpty(t *testing.T) {
	p := doublingPod(40)
	p.Spec.Containers[0].Env[0] = v1.EnvVar{Name: "V0", ValueFrom: &v1.EnvVarSource{ConfigMapKeyRef: &v1.ConfigMapKeySelector{
		LocalObjectReference: v1.LocalObjectReference{Name: "cm"}, Key: "k"}}}
	if errs := CheckBounds(&p.Spec); !hasField(errs, "spec.containers[0].env[16].value") {
		t.Fatalf("doubling over valueFrom not caught: %s", FormatErrors(errs))
	}
}

func TestCountBounds(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*v1.Pod)
		field  string
	}{
		{"containers", func(p *v1.Pod) {
			for i := 0; i < MaxContainers; i++ {
				p.Spec.Containers = append(p.Spec.Containers, v1.Container{Name: fmt.Sprintf("c%d", i), Image: "busybox"})
			}
		}, "spec.containers"},
		{"volumes", func(p *v1.Pod) {
			for i := 0; i <= MaxVolumes; i++ {
				p.Spec.Volumes = append(p.Spec.Volumes, v1.Volume{Name: fmt.Sprintf("v%d", i), VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}})
			}
		}, "spec.volumes"},
		{"env", func(p *v1.Pod) {
			for i := 0; i <= MaxEnvPerContainer; i++ {
				p.Spec.Containers[0].Env = append(p.Spec.Containers[0].Env, v1.EnvVar{Name: fmt.Sprintf("E%d", i), Value: "1"})
			}
		}, "spec.containers[0].env"},
		{"envFrom", func(p *v1.Pod) {
			for i := 0; i <= MaxEnvFromPerContainer; i++ {
				p.Spec.Containers[0].EnvFrom = append(p.Spec.Containers[0].EnvFrom, v1.EnvFromSource{ConfigMapRef: &v1.ConfigMapEnvSource{LocalObjectReference: v1.LocalObjectReference{Name: "cm"}}})
			}
		}, "spec.containers[0].envFrom"},
		{"volumeMounts", func(p *v1.Pod) {
			p.Spec.InitContainers = []v1.Container{{Name: "init", Image: "busybox"}}
			for i := 0; i <= MaxVolumeMountsPerContainer; i++ {
				p.Spec.InitContainers[0].VolumeMounts = append(p.Spec.InitContainers[0].VolumeMounts, v1.VolumeMount{Name: "v", MountPath: fmt.Sprintf("/m%d", i)})
			}
		}, "spec.initContainers[0].volumeMounts"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := basePod()
			tt.mutate(p)
			errs := ValidatePod(p, node, Policy{})
			if !hasField(errs, tt.field) || !strings.Contains(FormatErrors(errs), "Too many") {
				t.Fatalf("no Too many on %s: %.300s", tt.field, FormatErrors(errs))
			}
		})
	}
}

// TestExpandedLenMatchesKubernetes compares the simulated length with the
// real expansion on inputs built from the syntax's tricky pieces.
func TestExpandedLenMatchesKubernetes(t *testing.T) {
	vars := map[string]string{"A": "a", "BB": "bbbb", "EMPTY": "", "D": "$(A)"}
	lens := map[string]int{}
	for k, v := range vars {
		lens[k] = len(v)
	}
	mapping := expansion.MappingFuncFor(vars)
	pieces := []string{"$", "$$", "$(", ")", "(", "A", "$(A)", "$(BB)", "$(EMPTY)", "$(D)", "$(NOPE)", "$()", "x", "é", "\xff", "$\xff", "$é", "$x"}
	rng := rand.New(rand.NewPCG(1, 2))
	check := func(s string) {
		want := len(expansion.Expand(s, mapping))
		got, ok := expandedLen(s, lens, 1<<20)
		if got != want || !ok {
			t.Fatalf("expandedLen(%q) = %d, %v; Expand gives %d", s, got, ok, want)
		}
	}
	for _, p := range pieces {
		check(p)
	}
	for i := 0; i < 20000; i++ {
		var b strings.Builder
		for j := rng.IntN(8); j >= 0; j-- {
			b.WriteString(pieces[rng.IntN(len(pieces))])
		}
		check(b.String())
	}
	if _, ok := expandedLen("$(BB)$(BB)", lens, 7); ok {
		t.Fatal("8 bytes passed a 7-byte limit")
	}
}

func FuzzExpandedLen(f *testing.F) {
	f.Add("$(A)$$(B)$(", "x")
	f.Fuzz(func(t *testing.T, s, val string) {
		vars := map[string]string{"A": val, "B": val + val}
		lens := map[string]int{"A": len(val), "B": 2 * len(val)}
		want := len(expansion.Expand(s, expansion.MappingFuncFor(vars)))
		if got, ok := expandedLen(s, lens, 1<<30); got != want || !ok {
			t.Fatalf("expandedLen(%q) = %d, want %d", s, got, want)
		}
	})
}

func BenchmarkValidatePodEnvDoubling(b *testing.B) {
	pod := doublingPod(40)
	b.ReportAllocs()
	for b.Loop() {
		if errs := ValidatePod(pod, node, Policy{}); len(errs) == 0 {
			b.Fatal("accepted")
		}
	}
}

func BenchmarkValidatePodBaseline(b *testing.B) {
	pod := basePod()
	b.ReportAllocs()
	for b.Loop() {
		if errs := ValidatePod(pod, node, Policy{}); len(errs) != 0 {
			b.Fatal(FormatErrors(errs))
		}
	}
}

func BenchmarkValidatePodRestricted(b *testing.B) {
	pod := restrictedPod()
	pol := Policy{Profile: ProfileRestricted}
	b.ReportAllocs()
	for b.Loop() {
		if errs := ValidatePod(pod, node, pol); len(errs) != 0 {
			b.Fatal(FormatErrors(errs))
		}
	}
}
