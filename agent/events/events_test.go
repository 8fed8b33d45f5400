package events

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/mqlet/mqlet/cri"
)

var _ cri.EventRecorder = (*Recorder)(nil)

// captureSink keeps every emitted event as it would go on the wire.
type captureSink struct {
	mu     sync.Mutex
	events []*v1.Event
	wire   [][]byte
}

func (s *captureSink) Emit(ev *v1.Event) {
	data, err := json.Marshal(ev)
	if err != nil {
		panic(err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.events = append(s.events, ev)
	s.wire = append(s.wire, data)
}

func (s *captureSink) all() []*v1.Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*v1.Event(nil), s.events...)
}

// fakeClock is advanced by hand.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

var start = time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)

func newRecorder(opts Options) (*Recorder, *captureSink, *fakeClock) {
	clock := &fakeClock{now: start}
	sink := &captureSink{}
	if opts.Node == "" {
		opts.Node = "gw-1"
	}
	opts.Clock = clock.Now
	return New(sink, opts, zerolog.Nop()), sink, clock
}

func testPod(name string) *v1.Pod {
	return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "edge", UID: types.UID("uid-" + name), ResourceVersion: "7"}}
}

func decodeStrict(t *testing.T, data []byte) v1.Event {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var ev v1.Event
	if err := dec.Decode(&ev); err != nil {
		t.Fatalf("event does not decode strictly into v1.Event: %v\n%s", err, data)
	}
	return ev
}

func TestPodEventFields(t *testing.T) {
	r, sink, _ := newRecorder(Options{})
	r.Event(testPod("web"), v1.EventTypeNormal, "Pulled", `Container image "busybox" already present on machine`)
	if len(sink.wire) != 1 {
		t.Fatalf("emitted %d events, want 1", len(sink.wire))
	}
	ev := decodeStrict(t, sink.wire[0])
	if !regexp.MustCompile(`^web\.[0-9a-f]+$`).MatchString(ev.Name) {
		t.Errorf("name %q is not <object>.<hex>", ev.Name)
	}
	if want := fmt.Sprintf("web.%x", start.UnixNano()); ev.Name != want {
		t.Errorf("name = %q, want %q", ev.Name, want)
	}
	want := v1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: "edge", Name: "web", UID: "uid-web", ResourceVersion: "7"}
	if ev.InvolvedObject != want {
		t.Errorf("involvedObject = %+v", ev.InvolvedObject)
	}
	if ev.Namespace != "edge" || ev.Kind != "Event" || ev.APIVersion != "v1" {
		t.Errorf("meta = %q %q %q", ev.Namespace, ev.Kind, ev.APIVersion)
	}
	if ev.Source != (v1.EventSource{Component: "mqlet", Host: "gw-1"}) || ev.ReportingController != "mqlet" || ev.ReportingInstance != "gw-1" {
		t.Errorf("source = %+v, reporting %q/%q", ev.Source, ev.ReportingController, ev.ReportingInstance)
	}
	if ev.Count != 1 || !ev.FirstTimestamp.Time.Equal(start) || !ev.LastTimestamp.Time.Equal(start) || ev.Type != v1.EventTypeNormal || ev.Reason != "Pulled" {
		t.Errorf("event = %+v", ev)
	}
}

func TestNodeAndObjectEvents(t *testing.T) {
	r, sink, _ := newRecorder(Options{})
	r.NodeEvent(v1.EventTypeNormal, "Starting", "Starting mqlet.")
	r.ObjectEvent(v1.ObjectReference{Kind: "ConfigMap", Namespace: "edge", Name: "cfg"}, v1.EventTypeWarning, "Rejected", "data too large")
	if len(sink.wire) != 2 {
		t.Fatalf("emitted %d events", len(sink.wire))
	}
	node := decodeStrict(t, sink.wire[0])
	if node.InvolvedObject != (v1.ObjectReference{Kind: "Node", APIVersion: "v1", Name: "gw-1", UID: "gw-1"}) || node.Namespace != "default" {
		t.Errorf("node event = %+v in %q", node.InvolvedObject, node.Namespace)
	}
	if !strings.HasPrefix(node.Name, "gw-1.") {
		t.Errorf("node event name = %q", node.Name)
	}
	cm := decodeStrict(t, sink.wire[1])
	if cm.InvolvedObject.Kind != "ConfigMap" || cm.InvolvedObject.APIVersion != "v1" || cm.Namespace != "edge" || cm.Type != v1.EventTypeWarning {
		t.Errorf("configmap event = %+v", cm)
	}
	if node.Name == cm.Name {
		t.Error("two events share a name")
	}
}

func TestRepeatedBackOffGrowsCount(t *testing.T) {
	r, sink, clock := newRecorder(Options{})
	pod := testPod("web")
	const msg = "Back-off restarting failed container app in pod web_edge(uid-web)"
	for i := 0; i < 5; i++ {
		r.Event(pod, v1.EventTypeWarning, "BackOff", msg)
		clock.Advance(10 * time.Second)
	}
	evs := sink.all()
	if len(evs) != 5 {
		t.Fatalf("emitted %d events, want 5 (every repeat is re-emitted)", len(evs))
	}
	for i, data := range sink.wire {
		ev := decodeStrict(t, data)
		if ev.Name != evs[0].Name {
			t.Errorf("repeat %d has name %q, want %q", i, ev.Name, evs[0].Name)
		}
		if ev.Count != int32(i+1) {
			t.Errorf("repeat %d count = %d", i, ev.Count)
		}
		if !ev.FirstTimestamp.Time.Equal(start) {
			t.Errorf("repeat %d firstTimestamp = %v", i, ev.FirstTimestamp)
		}
		if want := start.Add(time.Duration(i) * 10 * time.Second); !ev.LastTimestamp.Time.Equal(want) {
			t.Errorf("repeat %d lastTimestamp = %v, want %v", i, ev.LastTimestamp, want)
		}
	}
	// A different message is a different event.
	r.Event(pod, v1.EventTypeWarning, "BackOff", "Back-off restarting failed container other")
	last := sink.all()[5]
	if last.Name == evs[0].Name || last.Count != 1 {
		t.Errorf("different message folded into the first: %q count %d", last.Name, last.Count)
	}
	if s := r.Stats(); s.Emitted != 6 || s.Dropped != 0 {
		t.Errorf("stats = %+v", s)
	}
}

func TestSimilarEventsAreCombined(t *testing.T) {
	r, sink, clock := newRecorder(Options{})
	pod := testPod("web")
	for i := 0; i < 14; i++ {
		r.Event(pod, v1.EventTypeWarning, "Failed", fmt.Sprintf("Error: failed to start container attempt %d", i))
		clock.Advance(time.Second)
	}
	evs := sink.all()
	if len(evs) != 14 {
		t.Fatalf("emitted %d events", len(evs))
	}
	for i := 0; i < 9; i++ {
		if strings.HasPrefix(evs[i].Message, combinedPrefix) || evs[i].Count != 1 {
			t.Errorf("event %d combined too early: %q count %d", i, evs[i].Message, evs[i].Count)
		}
	}
	combinedName := evs[9].Name
	for i := 9; i < 14; i++ {
		ev := evs[i]
		if want := combinedPrefix + fmt.Sprintf("Error: failed to start container attempt %d", i); ev.Message != want {
			t.Errorf("event %d message = %q, want %q", i, ev.Message, want)
		}
		if ev.Name != combinedName || ev.Count != int32(i-8) {
			t.Errorf("combined event %d = %q count %d, want %q count %d", i, ev.Name, ev.Count, combinedName, i-8)
		}
		if !ev.FirstTimestamp.Time.Equal(start.Add(9 * time.Second)) {
			t.Errorf("combined event %d firstTimestamp = %v", i, ev.FirstTimestamp)
		}
	}
	if s := r.Stats(); s.Combined != 5 {
		t.Errorf("stats = %+v, want 5 combined", s)
	}

	// After the aggregation interval of quiet, messages stand alone again.
	clock.Advance(DefaultAggregateInterval + time.Minute)
	r.Event(pod, v1.EventTypeWarning, "Failed", "Error: something new")
	if ev := sink.all()[14]; strings.HasPrefix(ev.Message, combinedPrefix) {
		t.Errorf("still combining after a quiet interval: %q", ev.Message)
	}
	// Other reasons were never affected.
	r.Event(pod, v1.EventTypeNormal, "Pulled", "pulled")
	if ev := sink.all()[15]; ev.Message != "pulled" {
		t.Errorf("other reason message = %q", ev.Message)
	}
}

func TestSpamFilterDropsPerObject(t *testing.T) {
	r, sink, clock := newRecorder(Options{})
	web, db := testPod("web"), testPod("db")
	for i := 0; i < 30; i++ {
		r.Event(web, v1.EventTypeWarning, "BackOff", "Back-off restarting failed container")
	}
	if got := len(sink.all()); got != DefaultBurstSize {
		t.Fatalf("emitted %d events for one object in a burst, want %d", got, DefaultBurstSize)
	}
	if s := r.Stats(); s.Emitted != 25 || s.Dropped != 5 {
		t.Fatalf("stats = %+v, want 25 emitted 5 dropped", s)
	}
	// Another object has its own bucket.
	r.Event(db, v1.EventTypeNormal, "Started", "Started container")
	if got := len(sink.all()); got != 26 {
		t.Fatalf("other object's event was dropped (%d emitted)", got)
	}
	// Still empty a minute later...
	clock.Advance(time.Minute)
	r.Event(web, v1.EventTypeWarning, "BackOff", "Back-off restarting failed container")
	if got := len(sink.all()); got != 26 {
		t.Fatalf("event let through before a token was refilled (%d emitted)", got)
	}
	// ...and one token after five minutes, carrying the true count.
	clock.Advance(4 * time.Minute)
	r.Event(web, v1.EventTypeWarning, "BackOff", "Back-off restarting failed container")
	evs := sink.all()
	if len(evs) != 27 {
		t.Fatalf("no event after the refill period (%d emitted)", len(evs))
	}
	if last := evs[26]; last.Count != 32 || last.Name != evs[0].Name {
		t.Errorf("refilled event = %q count %d, want %q count 32 (dropped repeats still counted)", last.Name, last.Count, evs[0].Name)
	}
	r.Event(web, v1.EventTypeWarning, "BackOff", "Back-off restarting failed container")
	if s := r.Stats(); s.Emitted != 27 || s.Dropped != 7 {
		t.Errorf("stats = %+v, want 27 emitted 7 dropped", s)
	}
}

func TestCustomLimits(t *testing.T) {
	r, sink, clock := newRecorder(Options{BurstSize: 2, QPS: 1, AggregateMax: 3, MaxKeys: 2})
	pod := testPod("web")
	for i := 0; i < 4; i++ {
		r.Event(pod, v1.EventTypeNormal, "R", fmt.Sprintf("m%d", i))
	}
	if got := len(sink.all()); got != 2 {
		t.Fatalf("burst 2 let %d through", got)
	}
	clock.Advance(time.Second)
	r.Event(pod, v1.EventTypeNormal, "R", "m4")
	if ev := sink.all()[2]; !strings.HasPrefix(ev.Message, combinedPrefix) {
		t.Errorf("AggregateMax 3 did not combine: %q", ev.Message)
	}
}

func TestCacheEvictionStartsAFreshEvent(t *testing.T) {
	r, sink, clock := newRecorder(Options{MaxKeys: 2})
	pod := testPod("web")
	r.Event(pod, v1.EventTypeNormal, "A", "a")
	clock.Advance(time.Second)
	r.Event(pod, v1.EventTypeNormal, "B", "b")
	clock.Advance(time.Second)
	r.Event(pod, v1.EventTypeNormal, "C", "c") // evicts A
	clock.Advance(time.Second)
	r.Event(pod, v1.EventTypeNormal, "A", "a")
	evs := sink.all()
	if evs[3].Name == evs[0].Name || evs[3].Count != 1 {
		t.Errorf("evicted event continued: %q count %d", evs[3].Name, evs[3].Count)
	}
	if r.seen.len() > 2 || r.similar.len() > 2 || r.buckets.len() > 2 {
		t.Errorf("caches grew past MaxKeys: %d %d %d", r.seen.len(), r.similar.len(), r.buckets.len())
	}
}

func TestDedupeWindow(t *testing.T) {
	r, sink, clock := newRecorder(Options{DedupeWindow: time.Minute})
	pod := testPod("web")
	r.Event(pod, v1.EventTypeNormal, "Pulled", "x")
	clock.Advance(30 * time.Second)
	r.Event(pod, v1.EventTypeNormal, "Pulled", "x")
	clock.Advance(2 * time.Minute)
	r.Event(pod, v1.EventTypeNormal, "Pulled", "x")
	evs := sink.all()
	if evs[1].Name != evs[0].Name || evs[1].Count != 2 {
		t.Errorf("within the window: %q count %d", evs[1].Name, evs[1].Count)
	}
	if evs[2].Name == evs[0].Name || evs[2].Count != 1 {
		t.Errorf("after the window: %q count %d", evs[2].Name, evs[2].Count)
	}
}

func TestSameTickNamesAreUnique(t *testing.T) {
	r, sink, _ := newRecorder(Options{})
	pod := testPod("web")
	for i := 0; i < 5; i++ {
		r.Event(pod, v1.EventTypeNormal, fmt.Sprintf("R%d", i), "m")
	}
	names := map[string]bool{}
	for _, ev := range sink.all() {
		if names[ev.Name] {
			t.Errorf("duplicate name %q", ev.Name)
		}
		names[ev.Name] = true
	}
	if len(names) != 5 {
		t.Errorf("got %d names", len(names))
	}
}

func TestLongMessageIsTruncated(t *testing.T) {
	r, sink, _ := newRecorder(Options{})
	r.Event(testPod("web"), v1.EventTypeWarning, "Failed", strings.Repeat("é", 2000))
	ev := decodeStrict(t, sink.wire[0])
	if len(ev.Message) > MaxMessageBytes || !strings.HasSuffix(ev.Message, "...") || !strings.HasPrefix(ev.Message, "éé") {
		t.Errorf("message of %d bytes, suffix %q", len(ev.Message), ev.Message[len(ev.Message)-5:])
	}
	if strings.ContainsRune(ev.Message, '\uFFFD') {
		t.Error("truncation split a rune")
	}
}

func TestConcurrentUse(t *testing.T) {
	r, sink, _ := newRecorder(Options{})
	const goroutines, perGoroutine = 8, 200
	var wg sync.WaitGroup
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			pod := testPod(fmt.Sprintf("p%d", g%4))
			for i := 0; i < perGoroutine; i++ {
				r.Event(pod, v1.EventTypeWarning, "BackOff", fmt.Sprintf("m%d", i%3))
				if i%50 == 0 {
					r.NodeEvent(v1.EventTypeNormal, "Tick", "tick")
					_ = r.Stats()
				}
			}
		}(g)
	}
	wg.Wait()
	s := r.Stats()
	calls := uint64(goroutines*perGoroutine + goroutines*(perGoroutine/50))
	if s.Emitted+s.Dropped != calls {
		t.Errorf("emitted %d + dropped %d != %d calls", s.Emitted, s.Dropped, calls)
	}
	if uint64(len(sink.all())) != s.Emitted {
		t.Errorf("sink saw %d, stats say %d", len(sink.all()), s.Emitted)
	}
	// Four pods and the node, each limited to one burst.
	if s.Emitted != 5*DefaultBurstSize {
		t.Errorf("emitted %d, want %d (burst per object)", s.Emitted, 5*DefaultBurstSize)
	}
	// Counts of one event name only grow, in emission order.
	last := map[string]int32{}
	for _, ev := range sink.all() {
		if ev.Count <= last[ev.Name] {
			t.Errorf("event %s count went %d -> %d", ev.Name, last[ev.Name], ev.Count)
		}
		last[ev.Name] = ev.Count
	}
}
