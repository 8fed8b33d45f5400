package podworker

import (
	"sync"

	"github.com/mqlet/mqlet/agent/restart"
)

// runnerSet is the pool's runners by pod key.
type runnerSet struct {
	policy restart.Policy // of the runners it makes

	mu    sync.Mutex
	byKey map[string]*runner
}

// get returns key's runner, made when missing.
func (s *runnerSet) get(key string) *runner {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.byKey[key]
	if !ok {
		r = newRunner(key, s.policy)
		s.byKey[key] = r
	}
	return r
}

// find returns key's runner, or nil.
func (s *runnerSet) find(key string) *runner {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.byKey[key]
}

// drop forgets r unless its key has another runner since.
func (s *runnerSet) drop(r *runner) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.byKey[r.key] == r {
		delete(s.byKey, r.key)
	}
}

// keyOf returns the key of the runner that last synced runtime uid, or "".
func (s *runnerSet) keyOf(uid string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, r := range s.byKey {
		if r.hasUID(uid) {
			return k
		}
	}
	return ""
}

// keys returns the keys of every runner.
func (s *runnerSet) keys() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	keys := make([]string, 0, len(s.byKey))
	for k := range s.byKey {
		keys = append(keys, k)
	}
	return keys
}

// each calls f on every runner, under the set's lock.
func (s *runnerSet) each(f func(*runner)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range s.byKey {
		f(r)
	}
}
