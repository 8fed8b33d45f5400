package outbox

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/rs/zerolog"
	bolt "go.etcd.io/bbolt"
)

// DefaultMaxBytes bounds the stored messages when Open is given no bound.
const DefaultMaxBytes int64 = 16 << 20

const (
	defaultMaxInflight = 16
	defaultRetryDelay  = 30 * time.Second
	// DefaultAckTimeout bounds the wait for a broker's acknowledgement on a
	// connection that stays up (paho's own write timeout is 30 s).
	DefaultAckTimeout = 60 * time.Second
	dropLogInterval   = 10 * time.Second
	// entryOverhead is the key bytes counted with each stored value.
	entryOverhead = 8
	// defaultMaxOnce bounds the remembered Message.Once names. A name is
	// needed only until its writer records that the put landed (mqlet: the
	// next state-store transaction, or the next start), far fewer puts than
	// this.
	defaultMaxOnce = 1 << 16
)

var (
	bucketEntries = []byte("entries") // seq (big endian) -> encoded message
	bucketLatest  = []byte("latest")  // topic -> seq of its coalesced entry
	bucketRanks   = []byte("ranks")   // rank byte + seq -> empty: the entries of each rank, oldest first
	bucketMeta    = []byte("meta")
	bucketOnce    = []byte("once")       // Message.Once -> seq of its put; count in the bucket's sequence
	bucketOnceAge = []byte("once-order") // seq -> Message.Once, oldest first
	keyDropped    = []byte("dropped")
	keyDropFinal  = []byte("droppedFinal")
)

// ErrFull is returned by Put when the message cannot be stored within the
// byte bound even after dropping every entry it may displace (see Put).
var ErrFull = errors.New("outbox full")

// errConnectionLost ends a drain when the publisher's connection goes away.
var errConnectionLost = errors.New("connection lost")

// Delivery reports the outcome of one Send: Done is closed when the broker
// confirmed it (QoS 1/2) or it was written (QoS 0), or it failed; Err then
// tells which.
type Delivery interface {
	Done() <-chan struct{}
	Err() error
}

// Publisher is what the outbox drains into; mqtt/session satisfies it.
type Publisher interface {
	// Send hands m to the current connection. Sends leave in call order. It
	// may block (bounded by ctx) while the publisher's own window is full.
	Send(ctx context.Context, m Message) (Delivery, error)
	// Connection returns the signals of the current or next connection: up
	// is closed once it can be published on, down once it is lost. Every
	// connection gets a fresh pair, so a deliveries of a lost connection
	// that will never complete can be abandoned.
	Connection() (up, down <-chan struct{})
}

// Stats are the outbox's counters.
type Stats struct {
	Depth   int    // entries stored, sent or not yet acknowledged
	Bytes   int64  // bytes they take, counted against the bound
	Dropped uint64 // entries dropped for lack of room, since the store was created
	// DroppedFinal counts the final replies (and their parts) among Dropped.
	DroppedFinal uint64
	Sent         uint64 // entries acknowledged and removed, since Open
	MaxBytes     int64  // the bound of Bytes
}

// Option tunes an Outbox.
type Option func(*Outbox)

// WithMaxInflight bounds the messages sent and not yet acknowledged.
func WithMaxInflight(n int) Option {
	return func(o *Outbox) {
		if n > 0 {
			o.maxInflight = n
		}
	}
}

// WithRetryDelay sets how long Run waits after a failed publish when the
// publisher does not report its connection lost.
func WithRetryDelay(d time.Duration) Option {
	return func(o *Outbox) {
		if d > 0 {
			o.retryDelay = d
		}
	}
}

// WithAckTimeout sets how long a sent message may wait for its broker
// acknowledgement on a connection that stays up. Past it the outbox
// treats the send as failed and, after the retry delay, resends every
// unconfirmed entry: a broker that swallows a QoS 1 publish without a
// PUBACK (a cluster member that lost its stream leader) delays a final
// reply, it does not lose it.
func WithAckTimeout(d time.Duration) Option {
	return func(o *Outbox) {
		if d > 0 {
			o.ackTimeout = d
		}
	}
}

// Outbox is a persisted store-and-forward queue. Retained and coalesced
// messages keep only their latest value per topic; all others stay in FIFO
// order. It is safe for concurrent use; Run must be called at most once at a
// time.
type Outbox struct {
	db          *bolt.DB
	log         zerolog.Logger
	maxBytes    int64
	maxInflight int
	retryDelay  time.Duration
	ackTimeout  time.Duration
	maxOnce     uint64
	wake        chan struct{}

	mu          sync.Mutex // serialises writes and guards the counters below
	depth       int
	bytes       int64
	dropped     uint64
	dropFinal   uint64
	sent        uint64
	lastDropLog time.Time
	unlogged    uint64
	// drops is signalled (without blocking) after entries were dropped.
	drops chan struct{}
	// sentBelow: entries below this sequence still stored were handed to
	// the publisher on the current connection and wait for their
	// acknowledgement; they are never dropped (they are on their way, and
	// dropping one would count a message that arrives as lost). 0: none.
	sentBelow uint64
}

// Open opens (or creates) the outbox file at path. maxBytes <= 0 means
// DefaultMaxBytes.
func Open(path string, maxBytes int64, log zerolog.Logger, opts ...Option) (*Outbox, error) {
	if maxBytes <= 0 {
		maxBytes = DefaultMaxBytes
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 5 * time.Second})
	if err != nil {
		return nil, fmt.Errorf("open outbox %s: %w", path, err)
	}
	o := &Outbox{
		db:          db,
		log:         log.With().Str("component", "outbox").Logger(),
		maxBytes:    maxBytes,
		maxInflight: defaultMaxInflight,
		retryDelay:  defaultRetryDelay,
		ackTimeout:  DefaultAckTimeout,
		maxOnce:     defaultMaxOnce,
		wake:        make(chan struct{}, 1),
		drops:       make(chan struct{}, 1),
	}
	for _, opt := range opts {
		opt(o)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		indexed := tx.Bucket(bucketRanks) != nil
		for _, name := range [][]byte{bucketEntries, bucketLatest, bucketMeta, bucketOnce, bucketOnceAge, bucketRanks} {
			if _, err := tx.CreateBucketIfNotExists(name); err != nil {
				return err
			}
		}
		if !indexed { // a store from before the index
			ranks := tx.Bucket(bucketRanks)
			if err := tx.Bucket(bucketEntries).ForEach(func(k, v []byte) error {
				return ranks.Put(rankKey(rankOf(v), k), []byte{})
			}); err != nil {
				return err
			}
		}
		if v := tx.Bucket(bucketMeta).Get(keyDropped); len(v) == 8 {
			o.dropped = binary.BigEndian.Uint64(v)
		}
		if v := tx.Bucket(bucketMeta).Get(keyDropFinal); len(v) == 8 {
			o.dropFinal = binary.BigEndian.Uint64(v)
		}
		return tx.Bucket(bucketEntries).ForEach(func(k, v []byte) error {
			o.depth++
			o.bytes += int64(len(v) + entryOverhead)
			return nil
		})
	})
	if err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("initialise outbox %s: %w", path, err)
	}
	if o.depth > 0 {
		o.log.Info().Int("depth", o.depth).Int64("bytes", o.bytes).Msg("outbox reopened with pending messages")
	}
	return o, nil
}

// Close closes the store. Run should have returned first.
func (o *Outbox) Close() error {
	if err := o.db.Close(); err != nil {
		return fmt.Errorf("close outbox: %w", err)
	}
	return nil
}

// Stats returns the current counters.
func (o *Outbox) Stats() Stats {
	o.mu.Lock()
	defer o.mu.Unlock()
	return Stats{Depth: o.depth, Bytes: o.bytes, Dropped: o.dropped, DroppedFinal: o.dropFinal, Sent: o.sent, MaxBytes: o.maxBytes}
}

// Drops is signalled after entries were dropped (or refused) for lack of
// room; one pending signal stands for any number of drops, which Stats
// counts. It lets one watcher report drops without polling.
func (o *Outbox) Drops() <-chan struct{} { return o.drops }

// Put stores m for sending. A retained or Coalesce message replaces the
// stored value of its topic and takes the position of this Put, so it is
// never followed by an older value. When the byte bound would be exceeded,
// entries are dropped (and counted), least valued first and the oldest
// first within a kind: telemetry (events, metrics, accepted and in-progress
// replies), then retained state (statuses), then final replies. A message
// only displaces entries of its own kind or below, so no status or event
// ever pushes out a final reply; when that frees too little, m itself is
// refused with ErrFull (and counted as dropped).
func (o *Outbox) Put(m Message) error {
	return o.PutBatch([]Message{m})
}

// PutBatch stores msgs in order in one transaction (one fsync), each as Put
// would. A message refused for lack of room (ErrFull) or invalid is counted
// and reported in the joined error; the others are stored.
func (o *Outbox) PutBatch(msgs []Message) error {
	if len(msgs) == 0 {
		return nil
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	var (
		refusals     []error
		refusedFinal []bool
		ch           putCounts
	)
	err := o.db.Update(func(tx *bolt.Tx) error {
		refusals, refusedFinal, ch = nil, nil, putCounts{}
		for _, m := range msgs {
			c, err := o.putTx(tx, m, o.bytes+ch.bytes)
			if errors.Is(err, ErrFull) || errors.Is(err, errInvalid) {
				refusals = append(refusals, err)
				refusedFinal = append(refusedFinal, m.Final)
				continue
			}
			if err != nil {
				return fmt.Errorf("outbox put %s: %w", m.Topic, err)
			}
			ch.add(c)
		}
		if ch.dropped > 0 {
			if err := putUint64(tx.Bucket(bucketMeta), keyDropFinal, o.dropFinal+uint64(ch.droppedFinal)); err != nil {
				return err
			}
			return putUint64(tx.Bucket(bucketMeta), keyDropped, o.dropped+uint64(ch.dropped))
		}
		return nil
	})
	if err != nil {
		return err
	}
	o.depth += ch.depth
	o.bytes += ch.bytes
	if ch.dropped > 0 {
		o.dropped += uint64(ch.dropped)
		o.dropFinal += uint64(ch.droppedFinal)
		o.logDropLocked(uint64(ch.dropped))
	}
	for i, r := range refusals {
		if errors.Is(r, ErrFull) {
			o.countRefusedLocked(refusedFinal[i])
		}
	}
	if ch.dropped > 0 || len(refusals) > 0 {
		select {
		case o.drops <- struct{}{}:
		default:
		}
	}
	if ch.depth > 0 || ch.bytes != 0 {
		o.signal()
	}
	return errors.Join(refusals...)
}

// errInvalid marks a message Put refuses without storing anything.
var errInvalid = errors.New("invalid message")

// putCounts is what a put changed: entries and bytes (net), entries
// dropped, final replies among them.
type putCounts struct {
	depth        int
	bytes        int64
	dropped      int
	droppedFinal int
}

func (c *putCounts) add(d putCounts) {
	c.depth += d.depth
	c.bytes += d.bytes
	c.dropped += d.dropped
	c.droppedFinal += d.droppedFinal
}

// putTx stores one message inside tx, given the bytes stored so far
// (including earlier puts of the same transaction). It changes nothing when
// it refuses m.
func (o *Outbox) putTx(tx *bolt.Tx, m Message, stored int64) (putCounts, error) {
	if m.Topic == "" {
		return putCounts{}, fmt.Errorf("outbox put: empty topic: %w", errInvalid)
	}
	if m.QoS > 2 {
		return putCounts{}, fmt.Errorf("outbox put %s: QoS %d: %w", m.Topic, m.QoS, errInvalid)
	}
	if m.Once != "" && tx.Bucket(bucketOnce).Get([]byte(m.Once)) != nil {
		return putCounts{}, nil // put before: stored or already sent
	}
	value := encode(m)
	size := int64(len(value) + entryOverhead)
	coalesce := m.Retained || m.Coalesce
	if size > o.maxBytes {
		return putCounts{}, fmt.Errorf("outbox put %s: message of %d bytes exceeds the bound of %d: %w", m.Topic, size, o.maxBytes, ErrFull)
	}
	entries, latest, ranks := tx.Bucket(bucketEntries), tx.Bucket(bucketLatest), tx.Bucket(bucketRanks)
	var old []byte
	var oldFlags byte // its flags byte, which names its rank
	var replacedBytes int64
	if coalesce {
		if k := latest.Get([]byte(m.Topic)); k != nil {
			if v := entries.Get(k); v != nil {
				old, oldFlags, replacedBytes = append([]byte(nil), k...), v[0], int64(len(v)+entryOverhead)
			}
		}
	}
	var c putCounts
	if need := stored - replacedBytes + size - o.maxBytes; need > 0 {
		victims, freed := dropVictims(entries, ranks, need, rankOf(value), old, o.sentBelow)
		if freed < need {
			return putCounts{}, fmt.Errorf("outbox put %s: no room within %d bytes: %w", m.Topic, o.maxBytes, ErrFull)
		}
		for _, k := range victims {
			v := entries.Get(k)
			c.bytes -= int64(len(v) + entryOverhead)
			if rankOf(v) == rankFinal {
				c.droppedFinal++
			}
			if isCoalesced(v) {
				if dm, err := decode(v); err == nil {
					if cur := latest.Get([]byte(dm.Topic)); cur != nil && string(cur) == string(k) {
						if err := latest.Delete([]byte(dm.Topic)); err != nil {
							return putCounts{}, err
						}
					}
				}
			}
			if err := deleteEntry(entries, ranks, k, v); err != nil {
				return putCounts{}, err
			}
		}
		c.depth -= len(victims)
		c.dropped = len(victims)
	}
	if old != nil {
		if err := deleteEntry(entries, ranks, old, []byte{oldFlags}); err != nil {
			return putCounts{}, err
		}
		c.depth--
		c.bytes -= replacedBytes
	}
	seq, err := entries.NextSequence()
	if err != nil {
		return putCounts{}, err
	}
	key := seqKey(seq)
	if err := entries.Put(key, value); err != nil {
		return putCounts{}, err
	}
	if err := ranks.Put(rankKey(rankOf(value), key), []byte{}); err != nil {
		return putCounts{}, err
	}
	c.depth++
	c.bytes += size
	if m.Once != "" {
		if err := rememberOnce(tx, m.Once, key, o.maxOnce); err != nil {
			return putCounts{}, err
		}
	}
	if coalesce {
		return c, latest.Put([]byte(m.Topic), key)
	}
	return c, nil
}

// rememberOnce records that the message named once was put as entry key,
// forgetting the oldest names beyond limit.
func rememberOnce(tx *bolt.Tx, once string, key []byte, limit uint64) error {
	names, order := tx.Bucket(bucketOnce), tx.Bucket(bucketOnceAge)
	if err := names.Put([]byte(once), key); err != nil {
		return err
	}
	if err := order.Put(key, []byte(once)); err != nil {
		return err
	}
	count := names.Sequence() + 1
	for ; count > limit; count-- {
		k, v := order.Cursor().First()
		if k == nil {
			break
		}
		if err := names.Delete(append([]byte(nil), v...)); err != nil {
			return err
		}
		if err := order.Delete(append([]byte(nil), k...)); err != nil {
			return err
		}
	}
	return names.SetSequence(count)
}

// countRefusedLocked counts a message refused for lack of room as dropped.
func (o *Outbox) countRefusedLocked(final bool) {
	o.dropped++
	if final {
		o.dropFinal++
	}
	err := o.db.Update(func(tx *bolt.Tx) error {
		if err := putUint64(tx.Bucket(bucketMeta), keyDropFinal, o.dropFinal); err != nil {
			return err
		}
		return putUint64(tx.Bucket(bucketMeta), keyDropped, o.dropped)
	})
	if err != nil {
		o.log.Error().Err(err).Msg("persist outbox drop counter")
	}
	o.logDropLocked(1)
}

// logDropLocked logs drops at most once per dropLogInterval so a long outage
// does not turn every event into a log line.
func (o *Outbox) logDropLocked(n uint64) {
	o.unlogged += n
	now := time.Now()
	if now.Sub(o.lastDropLog) < dropLogInterval {
		return
	}
	o.log.Warn().Uint64("dropped", o.unlogged).Uint64("droppedTotal", o.dropped).
		Uint64("droppedFinalTotal", o.dropFinal).Int64("maxBytes", o.maxBytes).Msg("outbox full: dropped the least valued, oldest messages")
	o.lastDropLog, o.unlogged = now, 0
}

// signal wakes Run without blocking; one pending wake is enough.
func (o *Outbox) signal() {
	select {
	case o.wake <- struct{}{}:
	default:
	}
}

// Ranks of stored entries, in the order they are dropped.
const (
	rankTelemetry = iota // events, metrics, accepted and in-progress replies
	rankState            // retained messages: pod and node status, presence
	rankFinal            // final replies and their parts
)

func rankOf(v []byte) int {
	switch {
	case len(v) == 0:
		return rankTelemetry
	case v[0]&flagFinal != 0:
		return rankFinal
	case v[0]&flagRetained != 0:
		return rankState
	}
	return rankTelemetry
}

// dropVictims picks entries to drop until they free at least need bytes
// (or none are left): those of the lowest rank first, the oldest first
// within a rank, never one ranked above upTo, nor skip (the entry the new
// message replaces, counted already), nor one in flight (below sentBelow).
// The rank index reads only the candidates, so a Put into an outbox full
// of final replies does not walk every entry.
func dropVictims(entries, ranks *bolt.Bucket, need int64, upTo int, skip []byte, sentBelow uint64) (keys [][]byte, freed int64) {
	for rank := rankTelemetry; rank <= upTo && freed < need; rank++ {
		c := ranks.Cursor()
		for rk, _ := c.Seek(rankKey(rank, seqKey(sentBelow))); rk != nil && rk[0] == byte(rank) && freed < need; rk, _ = c.Next() {
			k := rk[1:]
			if skip != nil && string(k) == string(skip) {
				continue
			}
			v := entries.Get(k)
			if v == nil {
				continue
			}
			keys = append(keys, append([]byte(nil), k...))
			freed += int64(len(v) + entryOverhead)
		}
	}
	return keys, freed
}

// rankKey is an entry's key in the rank index.
func rankKey(rank int, key []byte) []byte {
	return append([]byte{byte(rank)}, key...)
}

// deleteEntry removes the entry at key (whose stored value is v, or at
// least its flags byte) and its rank index key.
func deleteEntry(entries, ranks *bolt.Bucket, key, v []byte) error {
	if err := ranks.Delete(rankKey(rankOf(v), key)); err != nil {
		return err
	}
	return entries.Delete(key)
}

type entry struct {
	seq uint64
	msg Message
}

// readFrom returns up to n entries with sequence >= from, in order.
func (o *Outbox) readFrom(from uint64, n int) ([]entry, error) {
	var out []entry
	err := o.db.View(func(tx *bolt.Tx) error {
		c := tx.Bucket(bucketEntries).Cursor()
		for k, v := c.Seek(seqKey(from)); k != nil && len(out) < n; k, v = c.Next() {
			m, err := decode(v)
			if err != nil {
				return fmt.Errorf("decode entry %d: %w", binary.BigEndian.Uint64(k), err)
			}
			out = append(out, entry{seq: binary.BigEndian.Uint64(k), msg: m})
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read outbox: %w", err)
	}
	return out, nil
}

// remove deletes acknowledged entries. An entry already replaced or dropped
// since it was sent is simply gone.
func (o *Outbox) remove(seqs []uint64) error {
	if len(seqs) == 0 {
		return nil
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	var n int
	var freed int64
	err := o.db.Update(func(tx *bolt.Tx) error {
		entries, latest, ranks := tx.Bucket(bucketEntries), tx.Bucket(bucketLatest), tx.Bucket(bucketRanks)
		for _, seq := range seqs {
			key := seqKey(seq)
			v := entries.Get(key)
			if v == nil {
				continue
			}
			if isCoalesced(v) {
				if m, err := decode(v); err == nil {
					if cur := latest.Get([]byte(m.Topic)); cur != nil && string(cur) == string(key) {
						if err := latest.Delete([]byte(m.Topic)); err != nil {
							return err
						}
					}
				}
			}
			n++
			freed += int64(len(v) + entryOverhead)
			if err := deleteEntry(entries, ranks, key, v); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("remove acknowledged outbox entries: %w", err)
	}
	o.depth -= n
	o.bytes -= freed
	o.sent += uint64(n)
	return nil
}

// Run drains the outbox into pub whenever pub is connected, until ctx ends.
// At most the configured number of messages are in flight; an entry is
// deleted only once its delivery is confirmed. After a failed publish Run
// waits for the connection to be replaced (or the retry delay) and resends
// everything unconfirmed, so delivery is at least once.
func (o *Outbox) Run(ctx context.Context, pub Publisher) error {
	for {
		up, down := pub.Connection()
		select {
		case <-up:
		case <-ctx.Done():
			return ctx.Err()
		}
		err := o.drain(ctx, pub, down)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if errors.Is(err, errConnectionLost) {
			o.log.Debug().Msg("connection lost; outbox waits for the next one")
			continue
		}
		o.log.Warn().Err(err).Msg("outbox publish failed; waiting for the next connection")
		retry := time.NewTimer(o.retryDelay)
		select {
		case <-down:
		case <-retry.C:
		case <-ctx.Done():
		}
		retry.Stop()
	}
}

type inflight struct {
	seq  uint64
	d    Delivery
	sent time.Time
}

// errAckTimeout: the head of the window was not acknowledged in time.
var errAckTimeout = errors.New("no acknowledgement from the broker")

// drain sends entries in order over one connection until it fails.
func (o *Outbox) drain(ctx context.Context, pub Publisher, down <-chan struct{}) error {
	var (
		next   uint64 // every unconfirmed entry is resent on a new connection
		window []inflight
	)
	defer o.setSentBelow(0) // nothing is in flight once the connection is gone
	for {
		// Fill the window in order.
		for len(window) < o.maxInflight {
			batch, err := o.readFrom(next, o.maxInflight-len(window))
			if err != nil {
				return err
			}
			if len(batch) == 0 {
				break
			}
			for _, e := range batch {
				d, err := pub.Send(ctx, e.msg)
				if err != nil {
					return fmt.Errorf("send %s: %w", e.msg.Topic, err)
				}
				window = append(window, inflight{seq: e.seq, d: d, sent: time.Now()})
				next = e.seq + 1
				o.setSentBelow(next)
			}
		}
		var wake, headDone <-chan struct{}
		var headLate <-chan time.Time
		if len(window) < o.maxInflight {
			wake = o.wake // room for more: a Put may refill the window
		}
		var late *time.Timer
		if len(window) > 0 {
			headDone = window[0].d.Done()
			late = time.NewTimer(o.ackTimeout - time.Since(window[0].sent))
			headLate = late.C
		}
		select {
		case <-headDone:
		case <-headLate:
			return fmt.Errorf("%w within %v (entry %d); resending what is unconfirmed", errAckTimeout, o.ackTimeout, window[0].seq)
		case <-wake:
			if late != nil {
				late.Stop()
			}
			continue
		case <-down:
			return errConnectionLost
		case <-ctx.Done():
			return ctx.Err()
		}
		if late != nil {
			late.Stop()
		}
		// Collect every completed delivery at the head, in order.
		var acked []uint64
		var failed error
		for len(window) > 0 && isClosed(window[0].d.Done()) {
			if err := window[0].d.Err(); err != nil {
				failed = err
				break
			}
			acked = append(acked, window[0].seq)
			window = window[1:]
		}
		if err := o.remove(acked); err != nil {
			return err
		}
		if failed != nil {
			return fmt.Errorf("publish: %w", failed)
		}
	}
}

func (o *Outbox) setSentBelow(seq uint64) {
	o.mu.Lock()
	o.sentBelow = seq
	o.mu.Unlock()
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func seqKey(seq uint64) []byte {
	var k [8]byte
	binary.BigEndian.PutUint64(k[:], seq)
	return k[:]
}

func putUint64(b *bolt.Bucket, key []byte, v uint64) error {
	var buf [8]byte
	binary.BigEndian.PutUint64(buf[:], v)
	return b.Put(key, buf[:])
}

// Entry encoding: flags, QoS, uvarint topic length, topic, payload.
const (
	flagRetained = 1 << iota
	flagCoalesce
	flagFinal
)

func encode(m Message) []byte {
	var flags byte
	if m.Retained {
		flags |= flagRetained
	}
	if m.Coalesce {
		flags |= flagCoalesce
	}
	if m.Final {
		flags |= flagFinal
	}
	buf := make([]byte, 0, 2+binary.MaxVarintLen64+len(m.Topic)+len(m.Payload))
	buf = append(buf, flags, m.QoS)
	buf = binary.AppendUvarint(buf, uint64(len(m.Topic)))
	buf = append(buf, m.Topic...)
	return append(buf, m.Payload...)
}

// isCoalesced: retained messages always coalesce.
func isCoalesced(v []byte) bool { return len(v) > 0 && v[0]&(flagCoalesce|flagRetained) != 0 }

func decode(v []byte) (Message, error) {
	if len(v) < 3 {
		return Message{}, errors.New("entry too short")
	}
	flags, qos := v[0], v[1]
	n, w := binary.Uvarint(v[2:])
	if w <= 0 || uint64(len(v)-2-w) < n {
		return Message{}, errors.New("bad topic length")
	}
	start := 2 + w
	topic := string(v[start : start+int(n)])
	payload := append([]byte(nil), v[start+int(n):]...)
	return Message{
		Topic:    topic,
		Payload:  payload,
		QoS:      qos,
		Retained: flags&flagRetained != 0,
		Coalesce: flags&flagCoalesce != 0,
		Final:    flags&flagFinal != 0,
	}, nil
}
