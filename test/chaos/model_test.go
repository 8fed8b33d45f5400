package chaos

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const busybox = "docker.io/mqlet/busybox:test"

// slot is one pod name of the run and what kind of pod it always is.
type slot struct {
	name   string
	policy v1.RestartPolicy
	// job pods run a few seconds and exit 0, writing their spec's version
	// to the termination log; the others run until stopped and exit 0 on
	// SIGTERM (so a replaced container's graceful exit looks like success:
	// the case where a lost spec update once ended a pod Succeeded).
	job       bool
	downward  bool // a downwardAPI volume: a tmpfs mount in the pod dir
	configMap bool // an optional configMap volume
}

// podWant is the desired version of a present pod.
type podWant struct {
	version int
	sleep   int // a job's run time, seconds
}

// model is the desired state: present pods by name, configmaps by name.
type model struct {
	pods map[string]podWant
	cms  map[string]int
}

func newModel() model { return model{pods: map[string]podWant{}, cms: map[string]int{}} }

func (m model) clone() model {
	c := newModel()
	for k, v := range m.pods {
		c.pods[k] = v
	}
	for k, v := range m.cms {
		c.cms[k] = v
	}
	return c
}

// command is one command sent to the agent, with its effect on the model
// once the agent accepted it.
type command struct {
	id, verb string
	payload  []byte
	desc     string
	effect   func(*model)
	deletes  []string // pods it removes (for kills during deletes)
}

// slots are the run's pod names: long-running pods of each restart policy
// and short jobs.
func makeSlots() []slot {
	var out []slot
	policies := []v1.RestartPolicy{v1.RestartPolicyAlways, v1.RestartPolicyOnFailure, v1.RestartPolicyNever}
	for i := range 24 {
		s := slot{name: fmt.Sprintf("p%02d", i)}
		switch {
		case i < 18:
			s.policy = policies[i/6]
			s.downward = i%2 == 0
			s.configMap = i%3 == 0
		default:
			s.job = true
			s.policy = policies[1+i%2]
		}
		out = append(out, s)
	}
	return out
}

var configMapNames = []string{"cm0", "cm1", "cm2"}

// gen makes commands from the planned model (every command assumed
// accepted); the checks fold the commands the agent really accepted.
type gen struct {
	rng     *rand.Rand
	ns      string
	slots   []slot
	bySlot  map[string]slot
	planned model
	version int
	ids     int
	run     string
}

func newGen(rng *rand.Rand, ns, run string) *gen {
	g := &gen{rng: rng, ns: ns, slots: makeSlots(), bySlot: map[string]slot{}, planned: newModel(), run: run}
	for _, s := range g.slots {
		g.bySlot[s.name] = s
	}
	return g
}

func (g *gen) nextID(verb string) string {
	g.ids++
	return fmt.Sprintf("%s-%s-%d", verb, g.run, g.ids)
}

func (g *gen) nextVersion() int { g.version++; return g.version }

// next makes one random command.
func (g *gen) next() command {
	switch x := g.rng.IntN(100); {
	case x < 35:
		return g.applyPod()
	case x < 55:
		return g.updatePod()
	case x < 70:
		return g.deletePod()
	case x < 80:
		return g.sync()
	default:
		return g.applyConfigMap()
	}
}

func (g *gen) want(s slot) podWant {
	w := podWant{version: g.nextVersion()}
	if s.job {
		w.sleep = 1 + g.rng.IntN(4)
	}
	return w
}

// applyPod applies a pod that is absent in the plan (else an update).
func (g *gen) applyPod() command {
	var absent []slot
	for _, s := range g.slots {
		if _, ok := g.planned.pods[s.name]; !ok {
			absent = append(absent, s)
		}
	}
	if len(absent) == 0 {
		return g.updatePod()
	}
	s := absent[g.rng.IntN(len(absent))]
	w := g.want(s)
	g.planned.pods[s.name] = w
	return g.podCommand("apply", s, w, "create")
}

// updatePod changes the command of a present long-running pod: a spec
// update the agent must carry out by replacing the container.
func (g *gen) updatePod() command {
	var long []slot
	for _, s := range g.slots {
		if _, ok := g.planned.pods[s.name]; ok && !s.job {
			long = append(long, s)
		}
	}
	if len(long) == 0 {
		return g.applyPod()
	}
	s := long[g.rng.IntN(len(long))]
	w := g.want(s)
	g.planned.pods[s.name] = w
	return g.podCommand("apply", s, w, "update")
}

func (g *gen) podCommand(verb string, s slot, w podWant, what string) command {
	payload, err := json.Marshal(g.pod(s, w))
	if err != nil {
		panic(err)
	}
	name := s.name
	return command{id: g.nextID(verb), verb: verb, payload: payload,
		desc:   fmt.Sprintf("%s pod %s (%s%s) v=%d", what, name, s.policy, map[bool]string{true: " job"}[s.job], w.version),
		effect: func(m *model) { m.pods[name] = w }}
}

func (g *gen) deletePod() command {
	var present []string
	for name := range g.planned.pods {
		present = append(present, name)
	}
	if len(present) == 0 {
		return g.applyPod()
	}
	sort.Strings(present)
	name := present[g.rng.IntN(len(present))]
	delete(g.planned.pods, name)
	grace := g.rng.IntN(3)
	return command{id: g.nextID("delete"), verb: "delete", deletes: []string{name},
		payload: fmt.Appendf(nil, `{"kind":"Pod","namespace":%q,"name":%q,"gracePeriodSeconds":%d}`, g.ns, name, grace),
		desc:    fmt.Sprintf("delete pod %s (grace %ds)", name, grace),
		effect:  func(m *model) { delete(m.pods, name) }}
}

// sync sends the whole desired state as a List of 20 objects: a few
// configmaps and pods, some of them with a new version; whatever else
// the plan holds is deleted by it.
func (g *gen) sync() command {
	next := newModel()
	ncm := g.rng.IntN(len(configMapNames) + 1)
	for _, name := range configMapNames[:ncm] {
		v, ok := g.planned.cms[name]
		if !ok || g.rng.IntN(3) == 0 {
			v = g.nextVersion()
		}
		next.cms[name] = v
	}
	order := g.rng.Perm(len(g.slots))[:20-ncm]
	for _, i := range order {
		s := g.slots[i]
		w, ok := g.planned.pods[s.name]
		if !ok || (!s.job && g.rng.IntN(4) == 0) {
			w = g.want(s)
		}
		next.pods[s.name] = w
	}
	return g.syncTo(next)
}

// syncTo sends next as the node's whole desired state.
func (g *gen) syncTo(next model) command {
	var items []any
	var deletes []string
	for _, name := range configMapNames {
		if v, ok := next.cms[name]; ok {
			items = append(items, g.configMap(name, v))
		}
	}
	for _, s := range g.slots {
		if w, ok := next.pods[s.name]; ok {
			items = append(items, g.pod(s, w))
		} else if _, was := g.planned.pods[s.name]; was {
			deletes = append(deletes, s.name)
		}
	}
	if items == nil {
		items = []any{}
	}
	payload, err := json.Marshal(map[string]any{"apiVersion": "v1", "kind": "List", "items": items})
	if err != nil {
		panic(err)
	}
	g.planned = next.clone()
	return command{id: g.nextID("sync"), verb: "sync", payload: payload, deletes: deletes,
		desc:   fmt.Sprintf("sync %d objects (%d pods, %d deleted)", len(items), len(next.pods), len(deletes)),
		effect: func(m *model) { *m = next.clone() }}
}

func (g *gen) applyConfigMap() command {
	name := configMapNames[g.rng.IntN(len(configMapNames))]
	v := g.nextVersion()
	g.planned.cms[name] = v
	payload, err := json.Marshal(g.configMap(name, v))
	if err != nil {
		panic(err)
	}
	return command{id: g.nextID("apply"), verb: "apply", payload: payload,
		desc:   fmt.Sprintf("apply configmap %s v=%d", name, v),
		effect: func(m *model) { m.cms[name] = v }}
}

func (g *gen) configMap(name string, v int) *v1.ConfigMap {
	return &v1.ConfigMap{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: g.ns},
		Data:       map[string]string{"v": fmt.Sprint(v)}}
}

// podCommandLine is the container's command for version w: its "v=N"
// marker is read back from CRI (the running process's arguments), the
// store and the termination message.
func podCommandLine(s slot, w podWant) string {
	if s.job {
		return fmt.Sprintf("echo v=%d > /dev/termination-log; sleep %d; exit 0", w.version, w.sleep)
	}
	return fmt.Sprintf("trap 'exit 0' TERM; sleep 3600 & wait; # v=%d", w.version)
}

func (g *gen) pod(s slot, w podWant) *v1.Pod {
	grace := int64(2)
	p := &v1.Pod{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: s.name, Namespace: g.ns, Labels: map[string]string{"chaos": s.name}},
		Spec: v1.PodSpec{RestartPolicy: s.policy, TerminationGracePeriodSeconds: &grace,
			Containers: []v1.Container{{Name: "main", Image: busybox, ImagePullPolicy: v1.PullNever,
				Command: []string{"sh", "-c", podCommandLine(s, w)}}}}}
	if s.downward {
		p.Spec.Volumes = append(p.Spec.Volumes, v1.Volume{Name: "info", VolumeSource: v1.VolumeSource{DownwardAPI: &v1.DownwardAPIVolumeSource{
			Items: []v1.DownwardAPIVolumeFile{{Path: "labels", FieldRef: &v1.ObjectFieldSelector{FieldPath: "metadata.labels"}}}}}})
		p.Spec.Containers[0].VolumeMounts = append(p.Spec.Containers[0].VolumeMounts, v1.VolumeMount{Name: "info", MountPath: "/info"})
	}
	if s.configMap {
		optional := true
		p.Spec.Volumes = append(p.Spec.Volumes, v1.Volume{Name: "cfg", VolumeSource: v1.VolumeSource{ConfigMap: &v1.ConfigMapVolumeSource{
			LocalObjectReference: v1.LocalObjectReference{Name: "cm0"}, Optional: &optional}}})
		p.Spec.Containers[0].VolumeMounts = append(p.Spec.Containers[0].VolumeMounts, v1.VolumeMount{Name: "cfg", MountPath: "/cfg"})
	}
	return p
}

// sortedNames lists the keys of a map in order.
func sortedNames[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
