package cri

import "sync"

// syncs tracks, by pod uid, the syncs under way and the ones begun since
// the garbage collector's last look, so the collector never removes the
// cgroups or directories a sync has just made for a sandbox it is about
// to create (a pod applied after the collector read the desired pods).
type syncs struct {
	mu      sync.Mutex
	seq     uint64
	active  map[string]int
	lastSeq map[string]uint64 // the seq at which the uid's last sync began
}

// begin marks a sync of uid under way until end is called.
func (s *syncs) begin(uid string) (end func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.active == nil {
		s.active, s.lastSeq = map[string]int{}, map[string]uint64{}
	}
	s.seq++
	s.active[uid]++
	s.lastSeq[uid] = s.seq
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.active[uid]--; s.active[uid] <= 0 {
			delete(s.active, uid)
		}
	}
}

// mark starts a collection: what begins after it counts as recent. Uids
// neither syncing nor begun since are forgotten, so the maps hold only
// the pods being synced now and lately.
func (s *syncs) mark() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	for uid := range s.lastSeq {
		if s.active[uid] == 0 {
			delete(s.lastSeq, uid)
		}
	}
	return s.seq
}

// ifQuiet runs remove while no sync of uid can begin, if none is under
// way and none began after since; it reports whether remove ran.
func (s *syncs) ifQuiet(uid string, since uint64, remove func()) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.active[uid] > 0 || s.lastSeq[uid] > since {
		return false
	}
	remove()
	return true
}
