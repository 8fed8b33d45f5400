package intake

import (
	"fmt"
	"sort"

	"github.com/mqlet/mqlet/agent/pending"
	"github.com/mqlet/mqlet/agent/store"
	"github.com/mqlet/mqlet/internal/faultpoint"
	"github.com/mqlet/mqlet/mqtt/outbox"
)

// PendingStore holds the pending replies of accepted commands.
type PendingStore interface {
	ListPending() ([]store.PendingReply, error)
	DropPending(entries map[string]uint64) error
}

// RestorePending owes again, at start, the final replies the previous
// process owed when it stopped. A request whose final reply was decided is
// queued again under its once-key (a no-op if it was queued before the
// stop) and its entry dropped; every other one is handed to tracker in the
// order the commands were accepted (so a later command supersedes an
// earlier one as it did), with its deadline: one passed while mqlet was
// down is answered failed when the tracker runs. It returns the pod keys
// the restored requests wait on, for the workers to look at even when
// nothing of them is desired or runs any more (a delete's pod that went
// while mqlet was down is reported gone that way). Call it before Run and
// before the workers run.
func (g *Group) RestorePending(st PendingStore, tracker Tracker) ([]string, error) {
	entries, listErr := st.ListPending()
	var msgs []outbox.Message
	decided := map[string]uint64{}
	keys := map[string]bool{}
	for _, p := range entries {
		if p.Decided() {
			msgs = append(msgs, outbox.Message{Topic: p.FinalTopic, Payload: p.FinalPayload, QoS: 1, Once: p.OnceKey(), Final: true})
			decided[p.RequestID] = p.Seq
			continue
		}
		want := make(map[string]pending.Want, len(p.Want))
		for k, w := range p.Want {
			want[k] = pending.Want{Generation: w.Generation, Gone: w.Gone}
			keys[k] = true
		}
		tracker.Add(p.RequestID, p.Verb, want, p.Deadline)
	}
	if len(msgs) > 0 {
		if err := g.out.PutBatch(msgs); err != nil {
			return sortedSet(keys), fmt.Errorf("queueing %d final replies decided before the stop: %w", len(msgs), err)
		}
		if err := st.DropPending(decided); err != nil {
			return sortedSet(keys), fmt.Errorf("dropping %d answered pending replies: %w", len(decided), err)
		}
	}
	if len(entries) > 0 {
		g.log.Info().Int("followed", len(entries)-len(decided)).Int("answered", len(decided)).Msg("restored the final replies owed at the last stop")
	}
	// Killed here: at a start, with the owed replies followed again and
	// nothing of them answered yet.
	faultpoint.Hit("replies.after-restore")
	return sortedSet(keys), listErr
}

func sortedSet(set map[string]bool) []string {
	out := make([]string, 0, len(set))
	for k := range set {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
