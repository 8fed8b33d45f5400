package manifest

import "fmt"

// yamlValuesAtLeast counts, without allocating, values that the yaml.v3
// parse tree of one YAML document will hold: never more than the tree
// has, so refusing on it refuses nothing the tree's own bound would let
// through. It exists because the tree costs about 250 bytes a value to
// build: the densest 1 MiB YAML (a flow sequence of one-letter values,
// 512 Ki values) took 131 MiB before the tree's bound could refuse it.
//
// It reads the document line by line:
//   - a flow collection ([...], {...}) counts itself and each entry, two for
//     an entry with a key (key and value, every entry of a mapping), across
//     lines;
//   - a line of block structure counts each "- " entry and each "key:" (two:
//     the tree gives an empty value a null node of its own);
//   - quoted scalars (across lines) and comments count nothing;
//   - a line indented past the last key or entry, when that one had a
//     value on its line, continues a scalar (plain or block: | and >) and
//     counts nothing.
//
// What it cannot place (a quote inside a plain scalar, a compact mapping
// on a "- " line's next lines) it counts as nothing, so it only ever counts
// too few. It stops counting once limit is passed.
func yamlValuesAtLeast(doc []byte, limit int) int {
	s := prescan{src: doc, limit: limit, column: -1, opened: true}
	for s.pos < len(s.src) && s.count <= s.limit {
		s.line()
	}
	return s.count
}

type prescan struct {
	src   []byte
	pos   int // start of the line being read
	count int
	limit int

	flow int // depth of flow collections open
	// mappings has bit d set when the flow collection open at depth d+1
	// is a mapping (the first 64 levels; deeper ones count as sequences).
	mappings uint64
	quote    byte // ' or " while inside a quoted scalar, else 0
	// closedQuote: a quoted scalar just ended in a flow collection, where
	// a ':' right after it makes it a key.
	closedQuote bool
	// The innermost flow collection's current entry: whether it holds
	// anything yet and whether it had a key indicator.
	entryUsed, entryKey bool
	// pending: a "- " entry or a key waits for its value, which counts one
	// unless it is a flow collection (that counts itself).
	pending bool
	// column is where the last key or entry of block structure started;
	// opened says its value was left empty on its line (what follows,
	// indented further, is a nested node, not more of a scalar).
	column int
	opened bool
}

// line reads one line (or what is left of one after a multi-line quoted
// scalar or flow collection ends).
func (s *prescan) line() {
	end := s.pos
	for end < len(s.src) && s.src[end] != '\n' {
		end++
	}
	defer func() { s.pos = min(end+1, len(s.src)) }()
	if s.quote != 0 || s.flow > 0 {
		s.inline(s.pos, end)
		return
	}
	indent := 0
	for s.pos+indent < end && s.src[s.pos+indent] == ' ' {
		indent++
	}
	i := s.pos + indent
	if onlySpace(s.src[i:end]) || s.src[i] == '#' {
		return // blank or comment
	}
	if indent > s.column && !s.opened {
		return // more of a plain or block scalar
	}
	s.opened = false
	s.block(i, end)
}

// value counts the value a "- " entry or a key waits for, when it is not
// a flow collection.
func (s *prescan) value(flowCollection bool) {
	if s.pending && !flowCollection {
		s.count++
	}
	s.pending = false
}

// block reads block structure from i: "- " entries, "? " keys, then one
// value (flow, quoted, block scalar header, alias, plain), which may turn
// out to be a key.
func (s *prescan) block(i, end int) {
	defer func() {
		if s.quote == 0 && s.flow == 0 && s.pending { // an empty value, or a nested node on the next lines
			s.value(false)
			s.opened = true
		}
	}()
	for i < end {
		c := s.src[i]
		if (c == '-' || c == '?') && (i+1 == end || isBlank(s.src[i+1])) {
			if c == '-' {
				s.value(false) // an entry holding an entry: a sequence
				s.pending = true
			}
			s.column = i - s.pos
			i = skipBlanks(s.src, i+1, end)
			continue
		}
		switch c {
		case '#':
			return
		case '[', '{':
			s.value(true)
			s.openFlow(c)
			s.inline(i+1, end)
			return
		case '"', '\'':
			s.value(false)
			s.quote = c
			s.inline(i+1, end)
			return
		case '|', '>':
			s.value(false)
			return // a block scalar: its lines are indented past column
		case '&', '!':
			for i < end && !isBlank(s.src[i]) {
				i++
			}
			i = skipBlanks(s.src, i, end)
			continue
		case '*':
			s.value(false)
			return
		}
		// A plain scalar: to its end, or to ": " when it is a key.
		s.value(false)
		start := i
		for i < end && !(s.src[i] == ':' && (i+1 == end || isBlank(s.src[i+1]))) {
			if s.src[i] == '#' && i > start && isBlank(s.src[i-1]) {
				return
			}
			i++
		}
		if i == end {
			return
		}
		s.key(start)
		i = skipBlanks(s.src, i+1, end)
	}
}

// key counts a key of block structure starting at start; its value is
// pending.
func (s *prescan) key(start int) {
	s.count++
	s.column = start - s.pos
	s.pending = true
}

// inline reads the rest of a line inside a quoted scalar or a flow
// collection, and what follows them on the line.
func (s *prescan) inline(i, end int) {
	for i < end {
		c := s.src[i]
		if s.quote != 0 {
			switch {
			case s.quote == '"' && c == '\\':
				i += 2
				continue
			case s.quote == '\'' && c == '\'' && i+1 < end && s.src[i+1] == '\'':
				i += 2 // '' inside single quotes
				continue
			case c == s.quote:
				s.quote = 0
				s.closedQuote = s.flow > 0
			}
			i++
			continue
		}
		if s.flow == 0 {
			// After a quoted scalar or a flow collection in block
			// context: a ": " makes it a key.
			i = skipBlanks(s.src, i, end)
			if i < end && s.src[i] == ':' && (i+1 == end || isBlank(s.src[i+1])) {
				s.count++ // the key; the scalar was counted as a value
				s.pending = true
				s.block(skipBlanks(s.src, i+1, end), end)
			}
			return
		}
		closedQuote := s.closedQuote
		s.closedQuote = false
		switch {
		case c == '[' || c == '{':
			s.openFlow(c)
		case c == ']' || c == '}' || c == ',':
			s.endEntry()
			if c != ',' {
				// The closed collection was the outer entry's content,
				// already counted; what the outer entry had before it is
				// not kept, so it counts nothing more.
				s.flow--
			}
		case c == '"' || c == '\'':
			if tokenStart(s.src, i) {
				s.quote = c
				s.entryUsed = true
			} else {
				s.entryUsed = true
			}
		case c == '#' && i > 0 && isBlank(s.src[i-1]):
			return
		case c == ':' && (i+1 == end || isBlank(s.src[i+1]) || closedQuote):
			s.entryKey = true
			s.entryUsed = true
		case !isBlank(c):
			s.entryUsed = true
		}
		i++
	}
}

// openFlow counts a flow collection and starts its first entry.
func (s *prescan) openFlow(c byte) {
	s.count++
	if s.flow < 64 {
		bit := uint64(1) << s.flow
		if c == '{' {
			s.mappings |= bit
		} else {
			s.mappings &^= bit
		}
	}
	s.flow++
	s.entryUsed, s.entryKey = false, false
}

// endEntry counts the flow entry that ends here: two values for one with a
// key (key and value; in a mapping every entry has both, an empty value is
// a null), one for a plain entry, none for an empty one (the trailing comma
// of [a, ]).
func (s *prescan) endEntry() {
	inMapping := s.flow <= 64 && s.mappings&(uint64(1)<<(s.flow-1)) != 0
	switch {
	case s.entryKey || s.entryUsed && inMapping:
		s.count += 2
	case s.entryUsed:
		s.count++
	}
	s.entryUsed, s.entryKey = false, false
}

func skipBlanks(src []byte, i, end int) int {
	for i < end && isBlank(src[i]) {
		i++
	}
	return i
}

func isBlank(c byte) bool { return c == ' ' || c == '\t' || c == '\r' }

func isFlowIndicator(c byte) bool { return c == ',' || c == '[' || c == ']' || c == '{' || c == '}' }

func onlySpace(b []byte) bool {
	for _, c := range b {
		if !isBlank(c) {
			return false
		}
	}
	return true
}

// tokenStart says whether a quote at i starts a scalar: at the start of a
// line or after a separator or flow indicator (a quote inside a plain
// scalar is just a character).
func tokenStart(src []byte, i int) bool {
	if i == 0 {
		return true
	}
	p := src[i-1]
	return isBlank(p) || p == '\n' || p == ':' || isFlowIndicator(p)
}

// checkYAMLDensity refuses a document that holds more values than the
// payload has left before the tree is built.
func checkYAMLDensity(doc []byte, left int) error {
	if n := yamlValuesAtLeast(doc, left); n > left {
		return fmt.Errorf("%w: more than %d values", ErrTooLarge, MaxNodes)
	}
	return nil
}
