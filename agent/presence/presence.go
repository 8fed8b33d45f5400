// Package presence builds the node's retained state message: "online" with
// a boot id and a connection sequence number on every connect, "offline" as
// the MQTT will and on clean shutdown.
package presence

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"time"

	"github.com/mqlet/mqlet/agent/retained"
	apiv1 "github.com/mqlet/mqlet/api/v1"
	"github.com/mqlet/mqlet/mqtt/outbox"
)

// SeqSource hands out the persisted, ever-increasing connection sequence.
type SeqSource interface {
	NextSeq() (uint64, error)
}

// Presence knows this process's identity.
type Presence struct {
	topic     string
	bootID    string
	version   string
	startedAt time.Time
	seqs      SeqSource
	now       func() time.Time
	// sealingKey is published in every state message (also the will), so
	// an offline node can still be sent sealed Secrets.
	sealingKey string
	// groups, when set, gives the groups published in every state message.
	groups func() []string
	// generations, when set, gives the group documents applied.
	generations func() map[string]uint64
}

// SetGroups makes every state message made after it name the node's
// groups, as groups gives them at that moment.
func (p *Presence) SetGroups(groups func() []string) { p.groups = groups }

// SetGenerations makes every state message made after it name the
// generation of each group document the node applied.
func (p *Presence) SetGenerations(gens func() map[string]uint64) { p.generations = gens }

// New returns a Presence for one process start (a new boot id);
// sealingKey is the node's public sealing key ("" for none).
func New(stateTopic, version, sealingKey string, seqs SeqSource, now func() time.Time) *Presence {
	if now == nil {
		now = time.Now
	}
	return &Presence{topic: stateTopic, bootID: newBootID(), version: version, sealingKey: sealingKey, startedAt: now().UTC(), seqs: seqs, now: now}
}

// BootID is this process's boot id.
func (p *Presence) BootID() string { return p.bootID }

// Online returns the birth message for a new connection; each call takes
// the next sequence number.
func (p *Presence) Online() (outbox.Message, error) {
	seq, err := p.seqs.NextSeq()
	if err != nil {
		return outbox.Message{}, fmt.Errorf("taking the next connection sequence number: %w", err)
	}
	return p.message(apiv1.NodeState{State: apiv1.StateOnline, Seq: seq}), nil
}

// Offline returns the death message (the MQTT will, and the clean-shutdown message).
func (p *Presence) Offline() outbox.Message {
	return p.message(apiv1.NodeState{State: apiv1.StateOffline})
}

func (p *Presence) message(s apiv1.NodeState) outbox.Message {
	s.BootID, s.Version, s.StartedAt, s.TS, s.SealingKey = p.bootID, p.version, p.startedAt, p.now().UTC(), p.sealingKey
	if p.groups != nil {
		s.Groups = p.groups()
	}
	if p.generations != nil && s.State == apiv1.StateOnline {
		s.GroupGenerations = p.generations()
	}
	payload, _ := json.Marshal(s) // a struct of strings, numbers and times always encodes
	return retained.Message(p.topic, payload)
}

func newBootID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b) // crypto/rand never fails on Linux
	b[6] = (b[6] & 0x0f) | 0x40
	b[8] = (b[8] & 0x3f) | 0x80
	h := hex.EncodeToString(b)
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}
