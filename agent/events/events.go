// Package events records Kubernetes-style events (v1.Event) about pods, the
// node and other objects and hands them to a Sink (the MQTT events topic).
// Like client-go's record.EventCorrelator it deduplicates identical events
// into one event with a growing count, folds floods of similar events into a
// "(combined from similar events)" event, and rate-limits each object so a
// crash loop cannot flood the broker.
package events

import (
	"fmt"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/rs/zerolog"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/mqlet/mqlet/internal/defaults"
)

// Sink receives every event the Recorder lets through, including re-emissions
// of a deduplicated event with a higher count (same name). Emit is called
// in order, one call at a time, outside the Recorder's lock: it may be slow
// (a write to disk) without holding up other callers of the Recorder, whose
// events wait in a bounded queue meanwhile. The event is the sink's to keep.
type Sink interface {
	Emit(ev *v1.Event)
}

// Defaults, as client-go's event correlator uses them.
const (
	DefaultComponent         = "mqlet"
	DefaultBurstSize         = 25
	DefaultQPS               = 1.0 / 300 // one token per 5 minutes per object
	DefaultMaxKeys           = 4096
	DefaultAggregateMax      = 10
	DefaultAggregateInterval = 10 * time.Minute
	// DefaultQueueSize bounds the events waiting for a slow sink.
	DefaultQueueSize = 1024
	// MaxMessageBytes bounds a message (the events.k8s.io note limit), so
	// one runaway error text cannot make a huge payload.
	MaxMessageBytes = 1024

	combinedPrefix = "(combined from similar events): "
)

// Options tune a Recorder; zero fields take the defaults above.
type Options struct {
	// Node is this node's name: source.host, reportingInstance, and the
	// involved object of NodeEvent.
	Node string
	// Component is source.component and reportingComponent ("mqlet").
	Component string
	// BurstSize and QPS form the per-object token bucket of the spam filter.
	BurstSize int
	QPS       float64
	// MaxKeys bounds each cache (dedupe, aggregation, spam filter), LRU.
	MaxKeys int
	// AggregateMax distinct messages with the same reason within
	// AggregateInterval turn into one combined event.
	AggregateMax      int
	AggregateInterval time.Duration
	// DedupeWindow, when set, stops counting an identical event into the
	// previous one after this long; zero keeps counting as long as the
	// cache remembers it (as Kubernetes does).
	DedupeWindow time.Duration
	// QueueSize bounds the events waiting for the sink; past it new ones
	// are dropped and counted (Stats.Overflowed).
	QueueSize int
	// Clock returns the current time; time.Now when nil.
	Clock func() time.Time
}

func (o Options) withDefaults() Options {
	defaults.Set(&o.Component, DefaultComponent)
	defaults.Set(&o.BurstSize, DefaultBurstSize)
	defaults.Set(&o.QPS, DefaultQPS)
	defaults.Set(&o.MaxKeys, DefaultMaxKeys)
	defaults.Set(&o.AggregateMax, DefaultAggregateMax)
	defaults.Set(&o.AggregateInterval, DefaultAggregateInterval)
	defaults.Set(&o.QueueSize, DefaultQueueSize)
	if o.Clock == nil {
		o.Clock = time.Now
	}
	return o
}

// Stats counts what the Recorder did since it was created.
type Stats struct {
	Emitted    uint64 // handed to the sink (re-emissions included)
	Dropped    uint64 // held back by the spam filter
	Combined   uint64 // emitted as a "(combined from similar events)" event
	Overflowed uint64 // dropped because the queue to a slow sink was full
}

// Recorder turns calls into deduplicated, rate-limited events. It is safe
// for concurrent use. Events are queued under the lock and written to the
// sink outside it, by the caller that found no write in progress: the
// others only queue and return, so a slow sink holds up one caller, not
// all of them, and the order is kept.
type Recorder struct {
	sink Sink
	opts Options
	log  zerolog.Logger

	mu         sync.Mutex
	seen       *lru[observed]   // event key -> what was last emitted under it
	similar    *lru[*aggregate] // aggregate key -> distinct messages seen
	buckets    *lru[*bucket]    // spam key -> token bucket
	lastSuffix int64
	stats      Stats
	queue      []*v1.Event // waiting for the sink
	writing    bool        // a caller is handing the queue to the sink
}

type observed struct {
	name  string
	count int32
	first metav1.Time
	last  time.Time
}

type aggregate struct {
	messages map[string]struct{}
	last     time.Time
}

type bucket struct {
	tokens float64
	last   time.Time
}

// New returns a Recorder that emits into sink.
func New(sink Sink, opts Options, log zerolog.Logger) *Recorder {
	opts = opts.withDefaults()
	return &Recorder{
		sink:    sink,
		opts:    opts,
		log:     log.With().Str("component", "events").Logger(),
		seen:    newLRU[observed](opts.MaxKeys),
		similar: newLRU[*aggregate](opts.MaxKeys),
		buckets: newLRU[*bucket](opts.MaxKeys),
	}
}

// Event records an event about a pod (eventType v1.EventTypeNormal or
// v1.EventTypeWarning). It satisfies runtime.EventRecorder.
func (r *Recorder) Event(pod *v1.Pod, eventType, reason, message string) {
	if pod == nil {
		return
	}
	r.ObjectEvent(v1.ObjectReference{
		Kind:            "Pod",
		APIVersion:      "v1",
		Namespace:       pod.Namespace,
		Name:            pod.Name,
		UID:             pod.UID,
		ResourceVersion: pod.ResourceVersion,
	}, eventType, reason, message)
}

// NodeEvent records an event about this node.
func (r *Recorder) NodeEvent(eventType, reason, message string) {
	// The kubelet uses the node name as the node reference's UID.
	r.ObjectEvent(v1.ObjectReference{
		Kind:       "Node",
		APIVersion: "v1",
		Name:       r.opts.Node,
		UID:        types.UID(r.opts.Node),
	}, eventType, reason, message)
}

// ObjectEvent records an event about any object (ConfigMaps, Secrets,
// rejected manifests). An empty APIVersion becomes "v1".
func (r *Recorder) ObjectEvent(ref v1.ObjectReference, eventType, reason, message string) {
	if ref.APIVersion == "" {
		ref.APIVersion = "v1"
	}
	if eventType != v1.EventTypeNormal && eventType != v1.EventTypeWarning {
		r.log.Warn().Str("type", eventType).Str("reason", reason).Msg("unknown event type, recording as Warning")
		eventType = v1.EventTypeWarning
	}
	if r.record(ref, eventType, reason, message) {
		r.write()
	}
}

// record turns the call into an event and queues it; it reports whether
// the caller is to write the queue out (no one else is).
func (r *Recorder) record(ref v1.ObjectReference, eventType, reason, message string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.opts.Clock()
	ev := r.newEvent(ref, eventType, reason, truncate(message), now)

	ev, key := r.aggregate(ev, now)
	r.observe(ev, key, now)
	if !r.allow(ev, now) {
		r.stats.Dropped++
		r.log.Debug().Str("object", ref.Kind+"/"+ref.Namespace+"/"+ref.Name).Str("reason", reason).Int32("count", ev.Count).Msg("event dropped by the spam filter")
		return false
	}
	if len(r.queue) >= r.opts.QueueSize {
		r.stats.Overflowed++
		r.log.Debug().Str("object", ref.Kind+"/"+ref.Namespace+"/"+ref.Name).Str("reason", reason).Msg("event dropped: the sink is behind")
		return false
	}
	if strings.HasPrefix(ev.Message, combinedPrefix) {
		r.stats.Combined++
	}
	r.stats.Emitted++
	r.queue = append(r.queue, ev)
	if r.writing {
		return false
	}
	r.writing = true
	return true
}

// write hands the queue to the sink until it is empty, outside the lock.
func (r *Recorder) write() {
	for {
		r.mu.Lock()
		batch := r.queue
		r.queue = nil
		if len(batch) == 0 {
			r.writing = false
			r.mu.Unlock()
			return
		}
		r.mu.Unlock()
		r.emit(batch)
	}
}

// emit hands batch to the sink; a panic in the sink lets the next caller
// write instead of leaving the queue stuck.
func (r *Recorder) emit(batch []*v1.Event) {
	done := false
	defer func() {
		if !done {
			r.mu.Lock()
			r.writing = false
			r.mu.Unlock()
		}
	}()
	for _, ev := range batch {
		r.sink.Emit(ev)
	}
	done = true
}

// Stats returns the counters so far.
func (r *Recorder) Stats() Stats {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.stats
}

func (r *Recorder) newEvent(ref v1.ObjectReference, eventType, reason, message string, now time.Time) *v1.Event {
	ns := ref.Namespace
	if ns == "" {
		ns = metav1.NamespaceDefault
	}
	t := metav1.NewTime(now)
	return &v1.Event{
		TypeMeta:            metav1.TypeMeta{Kind: "Event", APIVersion: "v1"},
		ObjectMeta:          metav1.ObjectMeta{Name: r.eventName(ref.Name, now), Namespace: ns},
		InvolvedObject:      ref,
		Reason:              reason,
		Message:             message,
		Source:              v1.EventSource{Component: r.opts.Component, Host: r.opts.Node},
		FirstTimestamp:      t,
		LastTimestamp:       t,
		Count:               1,
		Type:                eventType,
		ReportingController: r.opts.Component,
		ReportingInstance:   r.opts.Node,
	}
}

// eventName is "<object>.<hex nanoseconds>" like client-go, made strictly
// increasing so two events in the same clock tick never share a name.
func (r *Recorder) eventName(object string, now time.Time) string {
	suffix := now.UnixNano()
	if suffix <= r.lastSuffix {
		suffix = r.lastSuffix + 1
	}
	r.lastSuffix = suffix
	return fmt.Sprintf("%s.%x", object, suffix)
}

// aggregate counts distinct messages per (object, type, reason); past
// AggregateMax within AggregateInterval the event becomes a combined one
// keyed by the aggregate key, so the dedupe step folds them together.
func (r *Recorder) aggregate(ev *v1.Event, now time.Time) (*v1.Event, string) {
	aggKey := aggregateKey(ev)
	rec, ok := r.similar.get(aggKey)
	if !ok || now.Sub(rec.last) > r.opts.AggregateInterval {
		rec = &aggregate{messages: map[string]struct{}{}}
	}
	rec.messages[ev.Message] = struct{}{}
	rec.last = now
	r.similar.put(aggKey, rec)
	if len(rec.messages) < r.opts.AggregateMax {
		return ev, eventKey(ev)
	}
	// Keep the set bounded: forget one message (which is not important).
	for m := range rec.messages {
		if m != ev.Message {
			delete(rec.messages, m)
			break
		}
	}
	combined := ev.DeepCopy()
	combined.Message = truncate(combinedPrefix + ev.Message)
	return combined, aggKey
}

// observe folds ev into an earlier identical event: same name and first
// timestamp, count+1.
func (r *Recorder) observe(ev *v1.Event, key string, now time.Time) {
	prev, ok := r.seen.get(key)
	if ok && (r.opts.DedupeWindow <= 0 || now.Sub(prev.last) <= r.opts.DedupeWindow) {
		ev.Name = prev.name
		ev.FirstTimestamp = prev.first
		ev.Count = prev.count + 1
	}
	r.seen.put(key, observed{name: ev.Name, count: ev.Count, first: ev.FirstTimestamp, last: now})
}

// allow takes a token from the object's bucket.
func (r *Recorder) allow(ev *v1.Event, now time.Time) bool {
	key := spamKey(ev)
	b, ok := r.buckets.get(key)
	if !ok {
		b = &bucket{tokens: float64(r.opts.BurstSize), last: now}
		r.buckets.put(key, b)
	}
	if elapsed := now.Sub(b.last); elapsed > 0 {
		b.tokens = min(float64(r.opts.BurstSize), b.tokens+elapsed.Seconds()*r.opts.QPS)
		b.last = now
	}
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

func join(parts ...string) string { return strings.Join(parts, "\x00") }

func objectKey(ev *v1.Event) string {
	o := ev.InvolvedObject
	return join(ev.Source.Component, ev.Source.Host, o.Kind, o.Namespace, o.Name, string(o.UID), o.APIVersion)
}

func spamKey(ev *v1.Event) string { return objectKey(ev) }

func aggregateKey(ev *v1.Event) string {
	return join(objectKey(ev), ev.Type, ev.Reason, ev.ReportingController, ev.ReportingInstance)
}

func eventKey(ev *v1.Event) string {
	return join(objectKey(ev), ev.InvolvedObject.FieldPath, ev.Type, ev.Reason, ev.Message)
}

// truncate cuts s to MaxMessageBytes on a rune boundary.
func truncate(s string) string {
	if len(s) <= MaxMessageBytes {
		return s
	}
	const ellipsis = "..."
	cut := MaxMessageBytes - len(ellipsis)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + ellipsis
}
