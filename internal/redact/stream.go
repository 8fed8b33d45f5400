package redact

import "strings"

// Stream scrubs text that leaves in pieces (log chunks, a followed log's
// latest lines): a value split across two pieces is still replaced, never
// published half in one message and half in the next. Next holds back the
// end of a piece that could begin a value until the following piece shows
// whether it does. Not safe for concurrent use.
type Stream struct {
	s    *Scrubber
	held string
}

// NewStream returns a Stream scrubbing with s (nil: nothing is replaced
// nor held).
func NewStream(s *Scrubber) *Stream { return &Stream{s: s} }

// Next returns the scrubbed text that can be published after piece: all of
// it but a held-back end that begins a value (shorter than the longest
// value), which comes with the next piece or Flush.
func (st *Stream) Next(piece string) string {
	text := st.held + piece
	st.held = ""
	if st.s.Len() == 0 {
		return text
	}
	if k := st.s.partialSuffix(text); k > 0 {
		st.held = text[len(text)-k:]
		text = text[:len(text)-k]
	}
	return st.s.String(text)
}

// Flush returns what is held back, scrubbed: the stream ended.
func (st *Stream) Flush() string {
	text := st.held
	st.held = ""
	return st.s.String(text)
}

// partialSuffix is the length of the longest end of text that is a proper
// beginning of a known value (0: none).
func (s *Scrubber) partialSuffix(text string) int {
	best := 0
	for _, v := range s.values {
		// values are longest first: once a value is no longer than best,
		// no later one can beat it.
		if len(v)-1 <= best {
			break
		}
		for l := min(len(v)-1, len(text)); l > best; l-- {
			if text[len(text)-1] == v[l-1] && strings.HasSuffix(text, v[:l]) {
				best = l
				break
			}
		}
	}
	return best
}
