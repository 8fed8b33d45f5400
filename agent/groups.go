package agent

import (
	"context"
	"fmt"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"

	"github.com/mqlet/mqlet/agent/store"
	apiv1 "github.com/mqlet/mqlet/api/v1"
)

// Reasons of the node events about groups.
const (
	ReasonJoinedGroup = "JoinedGroup"
	ReasonLeftGroup   = "LeftGroup"
)

// groups are the groups the node is in now.
func (a *Agent) groups() []string {
	if a.opts.Live != nil {
		return a.opts.Live.Groups()
	}
	return slices.Clone(a.opts.Groups)
}

// liveLabels are the node's labels that change while it runs: its
// configured nodeLabels (live through the config verb) and its groups'
// (group.mqlet.io/<g>: "true"), published on its v1.Node and admitted
// against.
func (a *Agent) liveLabels() map[string]string {
	configured := a.opts.Telemetry.NodeLabels
	if a.opts.Live != nil {
		configured = a.opts.Live.NodeLabels()
	}
	groups := a.groups()
	out := make(map[string]string, len(configured)+len(groups))
	for k, v := range configured {
		out[k] = v
	}
	for _, g := range groups {
		out[apiv1.GroupLabel(g)] = "true"
	}
	return out
}

// commandFilters are the command subscriptions for the node in groups.
func (a *Agent) commandFilters(groups []string) []string {
	filters := a.opts.Topics.CommandFilters()
	for _, g := range groups {
		filters = append(filters, a.opts.Topics.GroupFilters(g)...)
		// The group's retained document: a member that was offline, or
		// joins now, gets the group's current desired state.
		filters = append(filters, a.opts.Topics.GroupDesired(g))
	}
	return filters
}

// followGroups keeps the node's subscriptions and desired state in step
// with its live groups: a joined group's topics are subscribed; a left
// group's are dropped and its objects removed (its pods stopped
// gracefully). At start it also removes the objects of groups the node
// left while it was down (its config changed).
func (a *Agent) followGroups(ctx context.Context) {
	current := a.groups()
	a.removeStrayGroups(current)
	for {
		changed := a.opts.Live.Changes()
		select {
		case <-ctx.Done():
			return
		case <-a.stateChanged:
			// A group document applied: the state names its generation.
			a.publishState(ctx)
			continue
		case <-changed:
		}
		next := a.groups()
		if slices.Equal(next, current) {
			continue
		}
		if err := a.sess.SetCommandFilters(ctx, a.commandFilters(next)); err != nil {
			a.log.Warn().Err(err).Strs("groups", next).Msg("changing the group subscriptions; they follow at the next connect")
		}
		for _, g := range next {
			if !slices.Contains(current, g) {
				a.log.Info().Str("group", g).Msg("joined group")
				a.events.ObjectEvent(a.nodeRef(), v1.EventTypeNormal, ReasonJoinedGroup, "joined group "+g)
			}
		}
		for _, g := range current {
			if !slices.Contains(next, g) {
				a.leaveGroup(g)
			}
		}
		current = next
		a.publishState(ctx)
	}
}

// publishState publishes the node's state again (its groups and the
// generations of their documents applied); at worst the next connect does.
func (a *Agent) publishState(ctx context.Context) {
	if online, err := a.presence.Online(); err == nil {
		if err := a.sess.Publish(ctx, online); err != nil {
			a.log.Debug().Err(err).Msg("publishing the node state with its groups; the next connect does")
		}
	}
}

// groupApplied is told by the intake of a group document applied.
func (a *Agent) groupApplied(group string, generation uint64) {
	a.log.Info().Str("group", group).Uint64("generation", generation).Msg("group document applied")
	select {
	case a.stateChanged <- struct{}{}:
	default:
	}
}

// groupGenerations are the generations of the group documents applied.
func (a *Agent) groupGenerations() map[string]uint64 {
	gens, err := a.store.GroupGenerations()
	if err != nil {
		a.log.Warn().Err(err).Msg("reading the group documents applied for the node state")
		return nil
	}
	return gens
}

// leaveGroup removes the objects of group g from the desired state and
// stops its pods.
func (a *Agent) leaveGroup(g string) {
	changes, err := a.store.Replace(nil, store.Scope{Source: apiv1.Scope{Group: g}.Source()})
	if err != nil {
		a.log.Error().Err(err).Str("group", g).Msg("removing the objects of a group left; they stay until the next change")
		return
	}
	var removed []string
	for _, c := range changes {
		if c.Action != store.Deleted {
			continue
		}
		removed = append(removed, c.Kind+" "+c.Key)
		if c.Kind == store.KindPod {
			a.pool.EnqueueDelete(c.Key, nil)
		}
	}
	// Joining again takes the group's document again.
	if err := a.store.SetGroupApplied(g, nil); err != nil {
		a.log.Error().Err(err).Str("group", g).Msg("forgetting the group document applied of a group left")
	}
	a.log.Info().Str("group", g).Int("objects", len(removed)).Msg("left group; its objects removed")
	msg := "left group " + g
	if len(removed) > 0 {
		msg += fmt.Sprintf("; removed its %d objects: %s", len(removed), strings.Join(removed, ", "))
	}
	a.events.ObjectEvent(a.nodeRef(), v1.EventTypeNormal, ReasonLeftGroup, msg)
}

// removeStrayGroups removes the objects of groups the node is no longer
// in (left while mqlet was down).
func (a *Agent) removeStrayGroups(groups []string) {
	seen := map[string]bool{}
	note := func(m map[string]string) {
		if src := m[apiv1.AnnotationSource]; strings.HasPrefix(src, apiv1.GroupLevel+"/") {
			seen[strings.TrimPrefix(src, apiv1.GroupLevel+"/")] = true
		}
	}
	pods, err := a.store.ListPods()
	if err != nil {
		a.log.Warn().Err(err).Msg("listing pods to find groups left")
		return
	}
	for _, p := range pods {
		note(p.Annotations)
	}
	cms, _ := a.store.ListConfigMaps()
	for _, c := range cms {
		note(c.Annotations)
	}
	secrets, _ := a.store.ListSecrets()
	for _, s := range secrets {
		note(s.Annotations)
	}
	for g := range seen {
		if !slices.Contains(groups, g) {
			a.leaveGroup(g)
		}
	}
}

func (a *Agent) nodeRef() v1.ObjectReference {
	return v1.ObjectReference{Kind: "Node", Name: a.opts.Topics.Node}
}
