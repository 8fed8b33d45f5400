package chaos

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"

	apiv1 "github.com/mqlet/mqlet/api/v1"
)

// problem is one way the runtime, the retained status or the store
// disagrees with the model.
type problem struct {
	inv, pod, detail string
}

func (p problem) String() string { return p.pod + ": " + p.detail }

// desired folds the commands the agent accepted, in the order sent; a
// command not answered yet counts as accepted (it is queued for the agent).
func (r *run) desired() model {
	m := newModel()
	for _, c := range r.sent {
		ok, decided := accepted(r.replyList(c.id))
		if ok || !decided {
			c.effect(&m)
		}
	}
	return m
}

func (r *run) replyList(id string) []apiv1.Reply {
	var out []apiv1.Reply
	for _, m := range r.rec.repliesOf(id) {
		out = append(out, m.reply)
	}
	return out
}

// compare checks CRI and the recorded retained status against d (and the
// store, through get, when withGet).
func (r *run) compare(d model, withGet bool) []problem {
	var out []problem
	add := func(inv, pod, format string, args ...any) {
		out = append(out, problem{inv: inv, pod: pod, detail: fmt.Sprintf(format, args...)})
	}
	snap, err := r.cri.snapshot()
	if err != nil {
		add(invDiverged, "-", "CRI: %v", err)
		return out
	}
	known := map[string]bool{}
	for _, s := range r.gen.slots {
		known[s.name] = true
		if r.excluded[s.name] {
			continue
		}
		ready := snap.readySandboxes(s.name)
		if len(ready) > 1 {
			r.v.add(r.round, invDupSandbox, "pod "+s.name+" uid "+ready[0].Labels[labelPodUID], "%d ready sandboxes at once (%s, %s)", len(ready), ready[0].Id, ready[1].Id)
		}
		running := snap.running(s.name)
		last, seen := r.rec.lastStatus(s.name)
		w, present := d.pods[s.name]
		if !present {
			if snap.holds(s.name) {
				add(invDiverged, s.name, "deleted, yet CRI holds its sandbox or containers")
			}
			if seen && last.pod != nil {
				add(invDiverged, s.name, "deleted, yet its retained status is %s (not cleared)", last.pod.Status.Phase)
			}
			continue
		}
		if !seen || last.pod == nil {
			add(invDiverged, s.name, "no status published")
			continue
		}
		st := last.pod
		if v := markerOf(st); v != w.version {
			add(invDiverged, s.name, "the published pod has spec v=%d, want v=%d", v, w.version)
		}
		if s.job {
			if len(running) > 0 || len(ready) > 0 {
				add(invDiverged, s.name, "job still running (%d containers, %d ready sandboxes)", len(running), len(ready))
			}
			term, ok := terminated(st, "main")
			switch {
			case st.Status.Phase == v1.PodSucceeded && ok && strings.TrimSpace(term.Message) != fmt.Sprintf("v=%d", w.version):
				add(invLostUpdate, s.name, "published Succeeded, but the run's termination message is %q, not v=%d", term.Message, w.version)
			case st.Status.Phase != v1.PodSucceeded:
				add(invDiverged, s.name, "job published %s, want Succeeded", st.Status.Phase)
			}
			continue
		}
		if st.Status.Phase == v1.PodSucceeded || st.Status.Phase == v1.PodFailed {
			add(invLostUpdate, s.name, "long-running pod (%s) published %s (%s) while v=%d should run", s.policy, st.Status.Phase, st.Status.Message, w.version)
		}
		if len(ready) != 1 {
			add(invDiverged, s.name, "%d ready sandboxes, want 1", len(ready))
		}
		if len(running) != 1 {
			add(invDiverged, s.name, "%d running containers, want 1", len(running))
			continue
		}
		c := running[0]
		v, err := r.cri.version(c.Id)
		if err != nil {
			add(invDiverged, s.name, "%v", err)
		} else if v != w.version {
			inv := invDiverged
			if v < w.version {
				inv = invLostUpdate
			}
			add(inv, s.name, "CRI runs v=%d (container %.12s), the last applied spec is v=%d", v, c.Id, w.version)
		}
		if id := runningID(st, "main"); id != c.Id {
			add(invDiverged, s.name, "published container %.12q running, CRI runs %.12s (status %s)", id, c.Id, st.Status.Phase)
		}
		if uid := c.Labels[labelPodUID]; uid != string(st.UID) {
			add(invDiverged, s.name, "CRI runs uid %s, the status has uid %s", uid, st.UID)
		}
	}
	for _, sb := range snap.sandboxes {
		if name := sb.Labels[labelPodName]; !known[name] {
			add(invDiverged, name, "CRI holds sandbox %.12s of a pod the run never applied", sb.Id)
		}
	}
	if len(out) > 0 || !withGet {
		return out
	}
	return append(out, r.compareStore(d)...)
}

// compareStore checks the store, through get, against d: the pods (with
// uid and spec version agreeing with the status), and each configmap's data.
func (r *run) compareStore(d model) []problem {
	var out []problem
	add := func(inv, pod, format string, args ...any) {
		out = append(out, problem{inv: inv, pod: pod, detail: fmt.Sprintf(format, args...)})
	}
	var res apiv1.GetResult
	if err := r.get(fmt.Sprintf(`{"namespace":%q}`, r.ns), &res); err != nil {
		add(invDiverged, "-", "get: %v", err)
		return out
	}
	stored := map[string]*v1.Pod{}
	for _, p := range res.Pods {
		stored[p.Name] = p
	}
	for _, s := range r.gen.slots {
		if r.excluded[s.name] {
			continue
		}
		w, want := d.pods[s.name]
		p, have := stored[s.name]
		switch {
		case want && !have:
			add(invDiverged, s.name, "missing from the store (get)")
		case !want && have:
			add(invDiverged, s.name, "in the store (get), but deleted")
		case want && have:
			if v := markerOf(p); v != w.version {
				add(invDiverged, s.name, "the store holds v=%d, want v=%d", v, w.version)
			}
			if last, ok := r.rec.lastStatus(s.name); ok && last.pod != nil && last.pod.UID != p.UID {
				add(invDiverged, s.name, "the store has uid %s, the retained status %s", p.UID, last.pod.UID)
			}
		}
	}
	cms := map[string]bool{}
	for _, c := range res.ConfigMaps {
		cms[c.Name] = true
	}
	for _, name := range configMapNames {
		v, want := d.cms[name]
		switch {
		case want && !cms[name]:
			add(invDiverged, "configmap "+name, "missing from the store (get)")
		case !want && cms[name]:
			add(invDiverged, "configmap "+name, "in the store (get), but not desired")
		case want:
			var one apiv1.GetResult
			if err := r.get(fmt.Sprintf(`{"kind":"ConfigMap","namespace":%q,"name":%q}`, r.ns, name), &one); err != nil {
				add(invDiverged, "configmap "+name, "get: %v", err)
			} else if len(one.ConfigMaps) != 1 || one.ConfigMaps[0].Data["v"] != strconv.Itoa(v) {
				add(invDiverged, "configmap "+name, "the store holds %v, want v=%d", one.ConfigMaps, v)
			}
		}
	}
	return out
}

// get sends a get and decodes its assembled result into out.
func (r *run) get(payload string, out any) error {
	r.getSeq++
	id := fmt.Sprintf("get-%s-%d", r.gen.run, r.getSeq)
	r.gets = append(r.gets, id)
	if err := r.rec.publish("get", id, []byte(payload)); err != nil {
		return err
	}
	payloads, ok := r.rec.waitFinal(id, 30*time.Second)
	if !ok {
		return fmt.Errorf("no final reply to get %s within 30s", id)
	}
	result, final, err := apiv1.Assemble(payloads)
	if err != nil {
		return fmt.Errorf("assembling get %s: %w", id, err)
	}
	if rep, err := apiv1.DecodeReply(final); err == nil && rep.Phase != apiv1.Succeeded {
		return fmt.Errorf("get %s ended %s: %s", id, rep.Phase, rep.Message)
	}
	return json.Unmarshal(result, out)
}

// markerOf returns the v=N of the pod's main container command (0: none).
func markerOf(p *v1.Pod) int {
	for _, c := range p.Spec.Containers {
		if c.Name != "main" {
			continue
		}
		for _, a := range c.Command {
			if m := versionMarker.FindStringSubmatch(a); m != nil {
				v, _ := strconv.Atoi(m[1])
				return v
			}
		}
	}
	return 0
}
