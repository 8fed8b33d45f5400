package podworker

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"
	"k8s.io/apimachinery/pkg/types"

	"github.com/mqlet/mqlet/agent/store"
)

// SuspectDeaths is how many agent deaths in a row, each with the same
// pod's sync in flight past its first runtime read and no sync of that pod
// completed in between, quarantine the pod. One death proves nothing: an
// operator's kill -9, the OOM killer acting on the node's memory, a power
// loss or a watchdog stop the agent in whatever sync is running (at a
// start-up adoption, every pod is synced within a second or two). Two in a
// row still happen by chance when kills come in quick succession during
// adoption (a fault run kills at chosen points) or while containerd hangs
// a create; three in a row with the same pod caught mid-sync each time is
// what a pod that makes the agent die at every sync (an OOM kill each
// time) does, and it is caught at its third restart. A Go crash traced to
// the pod's sync quarantines at once (Death).
const SuspectDeaths = 3

// Death is what the previous process's end tells, besides its marks.
type Death struct {
	// Crashed says the Go runtime crashed (an unrecovered panic or a fatal
	// error; the crash output file held a report). An external SIGKILL
	// leaves no report.
	Crashed bool
	// Goroutines are the ids of the goroutine that crashed and of the one
	// that created it.
	Goroutines []uint64
}

// Phases of a sync, as its mark records them.
const (
	// phaseRead: waiting on a runtime read (the pod's status, the listing).
	// A sync stuck here when the agent died was waiting on the runtime
	// (containerd stopped or slow), not running anything of the pod's; such
	// a death is not counted against the pod.
	phaseRead = "read"
	// phaseSync: everything else of the sync (SyncPod, building the status).
	phaseSync = "sync"
)

// syncMark is the value of a slot's in-flight mark: "<key> <phase> <goroutine>".
// A pod key holds no space.
type syncMark struct {
	key       string
	phase     string
	goroutine uint64
}

func (m syncMark) String() string {
	return m.key + " " + m.phase + " " + strconv.FormatUint(m.goroutine, 10)
}

// parseMark reads a mark; a bare key (left by an older mqlet) is a sync
// phase of an unknown goroutine.
func parseMark(v string) (syncMark, bool) {
	f := strings.Fields(v)
	switch len(f) {
	case 1:
		return syncMark{key: f[0], phase: phaseSync}, true
	case 3:
		g, err := strconv.ParseUint(f[2], 10, 64)
		if err != nil || (f[1] != phaseRead && f[1] != phaseSync) {
			return syncMark{}, false
		}
		return syncMark{key: f[0], phase: f[1], goroutine: g}, true
	}
	return syncMark{}, false
}

// Ledger keeps small values in the store (its meta bucket).
type Ledger interface {
	Meta(key string) ([]byte, bool, error)
	SetMeta(key string, value []byte) error
}

// deathsKey holds the suspects: pod key → suspect.
const deathsKey = "podworker/sync-deaths"

// suspect counts the deaths in a row a pod version's sync was in flight at.
type suspect struct {
	UID        types.UID `json:"uid"`
	Generation int64     `json:"generation"`
	Deaths     int       `json:"deaths"`
}

// suspects are the pods with deaths counted; a completed sync of one
// clears its count. Only the first completed sync of a suspect after a
// start writes to the store: the others find it absent from the map.
type suspects struct {
	ledger Ledger // nil: deaths are not counted
	log    zerolog.Logger

	mu     sync.Mutex
	counts map[string]suspect
}

func (s *suspects) load() (map[string]suspect, error) {
	counts := map[string]suspect{}
	if s.ledger == nil {
		return counts, nil
	}
	raw, ok, err := s.ledger.Meta(deathsKey)
	if err != nil || !ok {
		return counts, err
	}
	if err := json.Unmarshal(raw, &counts); err != nil {
		return map[string]suspect{}, fmt.Errorf("reading the pods' agent-death counts: %w", err)
	}
	return counts, nil
}

// save persists counts; called with s.mu held or before the pool runs.
func (s *suspects) save(counts map[string]suspect) error {
	if s.ledger == nil {
		return nil
	}
	raw, err := json.Marshal(counts)
	if err != nil {
		return fmt.Errorf("encoding the pods' agent-death counts: %w", err)
	}
	if err := s.ledger.SetMeta(deathsKey, raw); err != nil {
		return fmt.Errorf("saving the pods' agent-death counts: %w", err)
	}
	return nil
}

// completed clears key's count: a sync of it ran to its end.
func (s *suspects) completed(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.counts[key]; !ok {
		return
	}
	next := make(map[string]suspect, len(s.counts))
	for k, v := range s.counts {
		if k != key {
			next[k] = v
		}
	}
	if err := s.save(next); err != nil {
		s.log.Warn().Err(err).Str("pod", key).Msg("clearing the pod's agent-death count after a completed sync")
		return
	}
	s.counts = next
	s.log.Info().Str("pod", key).Msg("a sync of the pod completed; its agent-death count is cleared")
}

// Quarantine evidence (store.Quarantine.Evidence).
const (
	evidenceCrash  = "crash"
	evidenceDeaths = "deaths"
)

// Recover deals with the marks the previous process left (left) and how
// it ended (death): a pod whose sync was running when the Go runtime
// crashed in it, or in a goroutine it started, is quarantined; a pod whose
// sync was in flight past its first runtime read has the death counted,
// and is quarantined at SuspectDeaths in a row. A death that finds a pod
// waiting on a runtime read neither counts nor breaks its row; one that
// does not find the pod in flight, a completed sync of it, or a new spec
// or uid starts its row again. A pod quarantined under the rule of an
// older mqlet (any death) is lifted when next synced. Call it before Run.
func (p *Pool) Recover(left []string, death Death) error {
	counts, err := p.suspects.load()
	if err != nil {
		p.log.Error().Err(err).Msg("the pods' agent-death counts are unreadable; counting afresh")
	}
	var errs []error
	var marks []syncMark
	inFlight := map[string]bool{}
	for _, v := range left {
		if m, ok := parseMark(v); ok {
			marks = append(marks, m)
			inFlight[m.key] = true
		}
	}
	// Deaths count in a row: a pod not in flight at this one starts again.
	for key := range counts {
		if !inFlight[key] {
			delete(counts, key)
		}
	}
	for _, m := range marks {
		namespace, name, ok := strings.Cut(m.key, "/")
		if !ok {
			continue
		}
		pod, err := p.desired.DesiredPod(namespace, name)
		if err != nil {
			errs = append(errs, fmt.Errorf("reading pod %s whose sync was in flight at the agent's death: %w", m.key, err))
			continue
		}
		if pod == nil {
			delete(counts, m.key) // removed since; nothing to sync
			continue
		}
		log := p.log.With().Str("pod", m.key).Str("uid", string(pod.UID)).Int64("generation", pod.Generation).Str("phase", m.phase).Logger()
		c := counts[m.key]
		if c.UID != pod.UID || c.Generation != pod.Generation {
			c = suspect{UID: pod.UID, Generation: pod.Generation}
		}
		var q *store.Quarantine
		switch {
		case death.Crashed && m.goroutine != 0 && slices.Contains(death.Goroutines, m.goroutine):
			log.Error().Msg("the agent crashed (Go runtime error) in this pod's sync; quarantining it")
			q = &store.Quarantine{Reason: MsgStoppedAgent + " with a Go runtime error", Evidence: evidenceCrash}
		case m.phase == phaseRead:
			log.Warn().Msg("the agent died while this pod's sync waited on the runtime; not counted against the pod")
			continue
		default:
			c.Deaths++
			if c.Deaths < SuspectDeaths {
				log.Warn().Int("deaths", c.Deaths).Int("quarantineAt", SuspectDeaths).Msg("this pod's sync was in flight when the agent died; counted, not quarantined")
				counts[m.key] = c
				continue
			}
			log.Error().Int("deaths", c.Deaths).Msg("this pod's sync was in flight at every one of the agent's last deaths; quarantining it")
			q = &store.Quarantine{Reason: fmt.Sprintf("%s %d times in a row", MsgStoppedAgent, c.Deaths), Evidence: evidenceDeaths}
		}
		q.UID, q.Generation, q.Phase, q.Since = pod.UID, pod.Generation, m.phase, time.Now().UTC()
		if p.opts.Quarantines == nil {
			continue
		}
		if err := p.opts.Quarantines.SetQuarantine(m.key, *q); err != nil {
			errs = append(errs, err)
			continue
		}
		delete(counts, m.key)
	}
	p.suspects.mu.Lock()
	defer p.suspects.mu.Unlock()
	if err := p.suspects.save(counts); err != nil {
		errs = append(errs, err)
	}
	p.suspects.counts = counts
	return errors.Join(errs...)
}

// isOlderRule reports whether q was set by an mqlet that quarantined a pod
// for any death with its sync in flight (no evidence recorded).
func isOlderRule(q store.Quarantine) bool { return q.Evidence == "" }
