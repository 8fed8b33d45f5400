package apiv1

// This file holds the wire of an interactive exec (exec -it): once the
// node answers the exec command in_progress ("terminal open"), the
// requester sends ShellInput on the request's input topic
// (<prefix>/<node>/in/<requestId>, QoS 1) and the node sends ShellOutput
// on its output topic (<prefix>/<node>/out/<requestId>, QoS 1). Messages
// that carry data or a resize are numbered from 1 in each direction and
// handed on in order exactly once (internal/shellwire), so QoS 1
// redeliveries and a broker that reorders change nothing; each side
// acknowledges cumulatively what it handed on, and a sender keeps at most
// a window of bytes unacknowledged. The last output message carries the
// exit code; the final reply of the exec command carries it too.

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
)

// Bounds of the interactive wire; a message outside them ends the session.
const (
	// ShellMaxData is the most data one message carries.
	ShellMaxData = 16 << 10
	// ShellMaxMessageBytes bounds one message as published (base64 data
	// and the fields around it).
	ShellMaxMessageBytes = 32 << 10
	// ShellOutputWindow is how many output bytes the node sends ahead of
	// the requester's acknowledgement; ShellInputWindow the same for the
	// requester's input.
	ShellOutputWindow = 256 << 10
	ShellInputWindow  = 64 << 10
	// ShellMaxAhead is how many messages a receiver holds that arrived
	// before one they follow.
	ShellMaxAhead = 256
	// ShellMaxTermSize bounds a terminal's columns and rows.
	ShellMaxTermSize = 4096
)

// TermSize is a terminal's size in characters.
type TermSize struct {
	Cols uint16 `json:"cols"`
	Rows uint16 `json:"rows"`
}

// Validate accepts 1..ShellMaxTermSize columns and rows.
func (t TermSize) Validate() error {
	if t.Cols < 1 || t.Rows < 1 || t.Cols > ShellMaxTermSize || t.Rows > ShellMaxTermSize {
		return fmt.Errorf("terminal size %dx%d: columns and rows must be 1 to %d", t.Cols, t.Rows, ShellMaxTermSize)
	}
	return nil
}

// ShellInput is one message of the requester of an interactive exec.
type ShellInput struct {
	// Seq numbers a message with Data or Resize (from 1); 0 for one that
	// only acknowledges.
	Seq    uint64    `json:"seq,omitempty"`
	Data   []byte    `json:"data,omitempty"`
	Resize *TermSize `json:"resize,omitempty"`
	// Ack: every output message up to this one was written.
	Ack uint64 `json:"ack,omitempty"`
	// MAC authenticates the message when the session has an input key
	// (ExecRequest.InputKey): ShellInputMAC.
	MAC []byte `json:"mac,omitempty"`
}

// The input key of an interactive exec: its size and the names it is
// sealed under (with the request id as the name).
const (
	ShellKeyBytes     = 32
	ShellKeyNamespace = "exec"
	ShellKeyName      = "inputKey"
)

// ShellInputMAC is the HMAC-SHA256 under key of input message in of
// request requestID (its MAC field aside): the request id, seq, ack, the
// data and the resize, each length-prefixed or fixed-size.
func ShellInputMAC(key []byte, requestID string, in ShellInput) []byte {
	h := hmac.New(sha256.New, key)
	var n [8]byte
	put := func(v uint64) {
		binary.BigEndian.PutUint64(n[:], v)
		h.Write(n[:])
	}
	put(uint64(len(requestID)))
	h.Write([]byte(requestID))
	put(in.Seq)
	put(in.Ack)
	put(uint64(len(in.Data)))
	h.Write(in.Data)
	if in.Resize != nil {
		put(1)
		put(uint64(in.Resize.Cols)<<16 | uint64(in.Resize.Rows))
	} else {
		put(0)
	}
	return h.Sum(nil)
}

// ShellOutput is one message of the node to the requester.
type ShellOutput struct {
	Seq  uint64 `json:"seq,omitempty"`
	Data []byte `json:"data,omitempty"`
	// Ack: every input message up to this one reached the terminal.
	Ack uint64 `json:"ack,omitempty"`
	// Exit, on the last message, is the command's exit code.
	Exit *int32 `json:"exit,omitempty"`
}

// DecodeShellInput decodes and checks one input message (strictly: an
// unknown field is refused).
func DecodeShellInput(b []byte) (ShellInput, error) {
	var in ShellInput
	if err := decodeShell(b, &in); err != nil {
		return in, err
	}
	switch {
	case len(in.Data) > ShellMaxData:
		return in, fmt.Errorf("shell input: %d bytes of data, at most %d", len(in.Data), ShellMaxData)
	case in.Seq == 0 && (len(in.Data) > 0 || in.Resize != nil):
		return in, errors.New("shell input: data or resize without a sequence number")
	case in.Seq != 0 && len(in.Data) == 0 && in.Resize == nil:
		return in, errors.New("shell input: a sequence number without data or resize")
	}
	if in.Resize != nil {
		if err := in.Resize.Validate(); err != nil {
			return in, fmt.Errorf("shell input: %w", err)
		}
	}
	return in, nil
}

// DecodeShellOutput decodes and checks one output message.
func DecodeShellOutput(b []byte) (ShellOutput, error) {
	var out ShellOutput
	if err := decodeShell(b, &out); err != nil {
		return out, err
	}
	switch {
	case len(out.Data) > ShellMaxData:
		return out, fmt.Errorf("shell output: %d bytes of data, at most %d", len(out.Data), ShellMaxData)
	case out.Seq == 0 && (len(out.Data) > 0 || out.Exit != nil):
		return out, errors.New("shell output: data or exit without a sequence number")
	}
	return out, nil
}

func decodeShell(b []byte, v any) error {
	if len(b) > ShellMaxMessageBytes {
		return fmt.Errorf("shell message of %d bytes, at most %d", len(b), ShellMaxMessageBytes)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("shell message: %w", err)
	}
	if dec.More() {
		return errors.New("shell message: data after the JSON object")
	}
	return nil
}
