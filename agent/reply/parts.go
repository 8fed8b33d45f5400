package reply

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
)

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

func sha256Hex(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// wire is a reply as received, with its result left raw.
type wire struct {
	RequestID string          `json:"requestId"`
	Phase     string          `json:"phase"`
	Seq       int             `json:"seq"`
	Result    json.RawMessage `json:"result"`
}

// Assemble rebuilds the result JSON of one request from the reply payloads
// received for it, in any order: either the final reply carries the result
// itself, or it carries Parts and the numbered parts are joined and checked
// against its size and digest. It returns the result JSON and the final
// reply's payload.
func Assemble(payloads [][]byte) (result, final []byte, err error) {
	pieces := map[int][]byte{}
	var last *wire
	for _, p := range payloads {
		var w wire
		if err := json.Unmarshal(p, &w); err != nil {
			return nil, nil, fmt.Errorf("decoding reply: %w", err)
		}
		switch {
		case w.Phase == InProgress && w.Seq > 0:
			var part Part
			if err := json.Unmarshal(w.Result, &part); err != nil {
				return nil, nil, fmt.Errorf("decoding reply part %d: %w", w.Seq, err)
			}
			pieces[w.Seq] = part.Data
		case w.Phase == Succeeded || w.Phase == Failed || w.Phase == Accepted:
			last, final = &w, p
		}
	}
	if last == nil {
		return nil, nil, errors.New("no final reply")
	}
	var parts Parts
	dec := json.NewDecoder(bytes.NewReader(last.Result))
	dec.DisallowUnknownFields()
	if len(last.Result) == 0 || dec.Decode(&parts) != nil || parts.Parts == 0 {
		return last.Result, final, nil
	}
	var joined []byte
	for i := 1; i <= parts.Parts; i++ {
		piece, ok := pieces[i]
		if !ok {
			return nil, final, fmt.Errorf("part %d of %d missing", i, parts.Parts)
		}
		joined = append(joined, piece...)
	}
	if len(joined) != parts.Bytes || sha256Hex(joined) != parts.SHA256 {
		return nil, final, fmt.Errorf("joined parts: %d bytes, digest %s; want %d bytes, digest %s", len(joined), sha256Hex(joined), parts.Bytes, parts.SHA256)
	}
	return joined, final, nil
}
