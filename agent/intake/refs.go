package intake

import (
	v1 "k8s.io/api/core/v1"
	podutil "k8s.io/kubernetes/pkg/api/v1/pod"

	"github.com/mqlet/mqlet/agent/pending"
	"github.com/mqlet/mqlet/agent/store"
)

// usersOf returns the keys of the stored pods that refer to a ConfigMap
// or Secret changed or deleted by changes (in volumes, projections, env
// or image pull secrets), so their workers refresh the mounted volumes at
// once, as the kubelet does after its next sync, and a pod waiting for
// a missing object retries now it is there.
func usersOf(changes []store.Change, pods []*v1.Pod) []string {
	changed := map[string]map[string]bool{} // kind -> namespace/name
	for _, c := range changes {
		if c.Action == store.Unchanged || (c.Kind != store.KindConfigMap && c.Kind != store.KindSecret) {
			continue
		}
		if changed[c.Kind] == nil {
			changed[c.Kind] = map[string]bool{}
		}
		changed[c.Kind][c.Key] = true
	}
	if len(changed) == 0 {
		return nil
	}
	var keys []string
	for _, p := range pods {
		uses := false
		visit := func(kind string) podutil.Visitor {
			return func(name string) bool {
				if changed[kind][p.Namespace+"/"+name] {
					uses = true
				}
				return !uses
			}
		}
		podutil.VisitPodConfigmapNames(p, visit(store.KindConfigMap))
		if !uses {
			podutil.VisitPodSecretNames(p, visit(store.KindSecret))
		}
		if uses {
			keys = append(keys, p.Namespace+"/"+p.Name)
		}
	}
	return keys
}

// enqueueUsers queues the pods using what changes changed, except those
// in skip (queued already).
func (in *Intake) enqueueUsers(changes []store.Change, skip map[string]pending.Want) {
	for _, c := range changes {
		if c.Kind == store.KindConfigMap || c.Kind == store.KindSecret {
			pods, err := in.store.ListPods()
			if err != nil {
				in.log.Warn().Err(err).Msg("listing pods to refresh their volumes")
				return
			}
			for _, key := range usersOf(changes, pods) {
				if _, ok := skip[key]; !ok {
					in.pods.Enqueue(key)
				}
			}
			return
		}
	}
}
