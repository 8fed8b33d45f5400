package apiv1

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// Phases of a command, in the order they are reported: accepted, then any
// number of in_progress, then exactly one of succeeded or failed, after
// which nothing more is published for the request.
const (
	Accepted   = "accepted"
	InProgress = "in_progress"
	Succeeded  = "succeeded"
	Failed     = "failed"
)

// PhaseRank orders the phases (accepted < in_progress < final); an unknown
// phase ranks 0.
func PhaseRank(phase string) int {
	switch phase {
	case Accepted:
		return 1
	case InProgress:
		return 2
	case Succeeded, Failed:
		return 3
	}
	return 0
}

// Reply is the payload published on <prefix>/<node>/reply/<requestId>.
type Reply struct {
	RequestID string `json:"requestId"`
	// Node is the node answering: a group command is answered by every
	// member, each on its own reply topic.
	Node    string `json:"node,omitempty"`
	Verb    string `json:"verb,omitempty"`
	Phase   string `json:"phase"`
	Message string `json:"message,omitempty"`
	// Result is the verb's result type when sending; DecodeReply leaves it
	// as json.RawMessage so each reader decodes the shape it expects.
	Result any      `json:"result,omitempty"`
	Errors []string `json:"errors,omitempty"`
	// Seq numbers the parts of a result sent in pieces (1..N), and the
	// chunks of a streamed result; 0 otherwise.
	Seq int       `json:"seq,omitempty"`
	TS  time.Time `json:"ts"`
}

// Final reports whether no further reply follows this one.
func (r Reply) Final() bool { return r.Phase == Succeeded || r.Phase == Failed }

// RawResult is the result of a decoded reply, nil when it had none.
func (r Reply) RawResult() json.RawMessage {
	switch v := r.Result.(type) {
	case json.RawMessage:
		return v
	case *json.RawMessage:
		if v != nil {
			return *v
		}
	}
	return nil
}

// DecodeReply decodes a reply payload, keeping its result raw. Unknown
// fields are ignored, so an older reader understands a newer agent.
func DecodeReply(payload []byte) (Reply, error) {
	var raw json.RawMessage
	r := Reply{Result: &raw} // encoding/json decodes into the pointer an interface holds
	if err := json.Unmarshal(payload, &r); err != nil {
		return Reply{}, fmt.Errorf("decoding reply: %w", err)
	}
	r.Result = nil
	if len(raw) > 0 && !bytes.Equal(raw, []byte("null")) {
		r.Result = raw
	}
	return r, nil
}

// Part is the result of an in_progress reply that carries one piece of a
// result too large for one message.
type Part struct {
	Data []byte `json:"data"` // base64 in JSON
}

// Parts is the result of the reply that ends a result sent in pieces.
type Parts struct {
	Parts  int    `json:"parts"`
	Bytes  int    `json:"bytes"`
	SHA256 string `json:"sha256"`
}

// SHA256Hex is the digest Parts names.
func SHA256Hex(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// Assemble rebuilds the result JSON of one request from the reply payloads
// received for it, in any order: either the final reply carries the result
// itself, or it carries Parts and the numbered parts are joined and checked
// against its size and digest. It returns the result JSON and the final
// reply's payload.
func Assemble(payloads [][]byte) (result, final []byte, err error) {
	pieces := map[int][]byte{}
	var last *Reply
	for _, p := range payloads {
		r, err := DecodeReply(p)
		if err != nil {
			return nil, nil, err
		}
		switch {
		case r.Phase == InProgress && r.Seq > 0:
			var part Part
			if err := json.Unmarshal(r.RawResult(), &part); err != nil {
				return nil, nil, fmt.Errorf("decoding reply part %d: %w", r.Seq, err)
			}
			pieces[r.Seq] = part.Data
		case r.Phase == Succeeded || r.Phase == Failed || r.Phase == Accepted:
			last, final = &r, p
		}
	}
	if last == nil {
		return nil, nil, errors.New("no final reply")
	}
	res := last.RawResult()
	var parts Parts
	dec := json.NewDecoder(bytes.NewReader(res))
	dec.DisallowUnknownFields()
	if len(res) == 0 || dec.Decode(&parts) != nil || parts.Parts == 0 {
		return res, final, nil
	}
	var joined []byte
	for i := 1; i <= parts.Parts; i++ {
		piece, ok := pieces[i]
		if !ok {
			return nil, final, fmt.Errorf("part %d of %d missing", i, parts.Parts)
		}
		joined = append(joined, piece...)
	}
	if len(joined) != parts.Bytes || SHA256Hex(joined) != parts.SHA256 {
		return nil, final, fmt.Errorf("joined parts: %d bytes, digest %s; want %d bytes, digest %s", len(joined), SHA256Hex(joined), parts.Bytes, parts.SHA256)
	}
	return joined, final, nil
}
