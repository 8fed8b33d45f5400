package manifest

import (
	"errors"
	"fmt"

	yaml3 "go.yaml.in/yaml/v3"
)

// Bounds on what one payload may expand to. They are checked on a parse tree
// that keeps YAML aliases as references (so a payload costs memory in
// proportion to its own size), before anything is converted or decoded: a
// small YAML whose aliases expand to gigabytes is refused instead of
// expanded.
const (
	// MaxExpandedBytes bounds the size of a payload with every alias
	// replaced by what it names (about the size of the JSON it converts to).
	MaxExpandedBytes = 4 << 20
	// MaxDepth bounds the nesting of mappings and sequences, aliases
	// followed. A Pod nests about 12 deep.
	MaxDepth = 64
	// MaxNodes bounds the number of values (scalars, mappings, sequences),
	// aliases counted at their expanded size, in one payload.
	MaxNodes = 200_000
	// MaxObjects bounds the objects of one payload: documents plus List
	// items. It is above pods.maxPods' default (110) so a whole node fits
	// in one sync with its ConfigMaps and Secrets.
	MaxObjects = 256
)

// ErrTooLarge is returned (wrapped) when a payload exceeds one of the bounds.
var ErrTooLarge = errors.New("payload exceeds the decoding bounds")

// expansion is what a node stands for once aliases are expanded.
type expansion struct {
	bytes, nodes, depth int
}

// treeBounds measures YAML parse trees. Anchored nodes are measured once and
// remembered, so an alias costs O(1) however often it is used; a node being
// measured is marked, so an alias to its own ancestor is caught.
type treeBounds struct {
	done   map[*yaml3.Node]expansion
	active map[*yaml3.Node]bool
}

func newTreeBounds() *treeBounds {
	return &treeBounds{done: map[*yaml3.Node]expansion{}, active: map[*yaml3.Node]bool{}}
}

// measure returns the expansion of n. Only anchored nodes (the ones aliases
// can name) are remembered and marked, which keeps the maps small. It stops early once a bound is
// exceeded, so the walk itself stays cheap on hostile input.
func (b *treeBounds) measure(n *yaml3.Node) (expansion, error) {
	if n == nil {
		return expansion{}, nil
	}
	if e, ok := b.done[n]; ok {
		return e, nil
	}
	if b.active[n] {
		return expansion{}, fmt.Errorf("%w: an alias refers to a value that contains it", ErrTooLarge)
	}
	var e expansion
	switch n.Kind {
	case yaml3.AliasNode:
		// The target is anchored, so measured once and remembered.
		inner, err := b.measure(n.Alias)
		if err != nil {
			return expansion{}, err
		}
		e = inner
	case yaml3.ScalarNode:
		// The value plus quotes and a separator, roughly as JSON writes it.
		e = expansion{bytes: len(n.Value) + 3, nodes: 1}
	default: // document, mapping, sequence
		if n.Anchor != "" {
			b.active[n] = true
		}
		e = expansion{bytes: 2, nodes: 1}
		for _, c := range n.Content {
			ce, err := b.measure(c)
			if err != nil {
				delete(b.active, n)
				return expansion{}, err
			}
			e.bytes += ce.bytes
			e.nodes += ce.nodes
			e.depth = max(e.depth, ce.depth)
			if err := e.check(); err != nil {
				delete(b.active, n)
				return expansion{}, err
			}
		}
		delete(b.active, n)
		if n.Kind != yaml3.DocumentNode {
			e.depth++
		}
	}
	if err := e.check(); err != nil {
		return expansion{}, err
	}
	if n.Anchor != "" {
		b.done[n] = e
	}
	return e, nil
}

func (e expansion) check() error {
	switch {
	case e.bytes > MaxExpandedBytes:
		return fmt.Errorf("%w: expands to more than %d bytes (aliases counted at their expanded size)", ErrTooLarge, MaxExpandedBytes)
	case e.nodes > MaxNodes:
		return fmt.Errorf("%w: more than %d values", ErrTooLarge, MaxNodes)
	case e.depth > MaxDepth:
		return fmt.Errorf("%w: nested deeper than %d levels", ErrTooLarge, MaxDepth)
	}
	return nil
}

// add accumulates the expansion of one document into a payload's total.
func (e *expansion) add(d expansion) error {
	e.bytes += d.bytes
	e.nodes += d.nodes
	e.depth = max(e.depth, d.depth)
	return e.check()
}

// yamlObjectCount is how many objects a document holds: the length of items
// for a List, else one.
func yamlObjectCount(doc *yaml3.Node) int {
	root := doc
	if root.Kind == yaml3.DocumentNode && len(root.Content) == 1 {
		root = root.Content[0]
	}
	root = resolveAlias(root)
	if root.Kind != yaml3.MappingNode {
		return 1
	}
	var kind string
	var items *yaml3.Node
	for i := 0; i+1 < len(root.Content); i += 2 {
		k, v := resolveAlias(root.Content[i]), resolveAlias(root.Content[i+1])
		switch k.Value {
		case "kind":
			kind = v.Value
		case "items":
			items = v
		}
	}
	if kind == KindList && items != nil && items.Kind == yaml3.SequenceNode {
		return len(items.Content)
	}
	return 1
}

// resolveAlias follows aliases (a bounded number of times: the tree passed
// measure, which rejects cycles).
func resolveAlias(n *yaml3.Node) *yaml3.Node {
	for i := 0; n != nil && n.Kind == yaml3.AliasNode && i < MaxDepth; i++ {
		n = n.Alias
	}
	if n == nil {
		return &yaml3.Node{}
	}
	return n
}

// checkYAMLDocument parses one YAML document into a tree that keeps aliases
// as references and measures it. objects is 1, or a List's item count.
func checkYAMLDocument(raw []byte, b *treeBounds) (e expansion, objects int, err error) {
	var doc yaml3.Node
	if err := yaml3.Unmarshal(raw, &doc); err != nil {
		return expansion{}, 0, fmt.Errorf("invalid YAML: %w", err)
	}
	e, err = b.measure(&doc)
	if err != nil {
		return expansion{}, 0, err
	}
	return e, yamlObjectCount(&doc), nil
}

// checkJSON measures a JSON payload without building anything: its nesting
// depth, its number of values (an upper bound: commas, colons and openings
// outside strings) and the item count of a top-level "items" array. Invalid
// JSON passes here and is reported by the decoder, which then works on
// bounded input.
func checkJSON(data []byte) (objects int, err error) {
	depth, nodes := 0, 1
	inString, escaped := false, false
	var key []byte   // last string seen at depth 1, the candidate key
	itemsDepth := -1 // depth of the top-level items array while inside it
	items, itemValues := 0, false
	keyStart := -1
	for i, c := range data {
		if inString {
			switch {
			case escaped:
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				inString = false
				if depth == 1 && keyStart >= 0 {
					key = data[keyStart:i]
				}
				keyStart = -1
			}
			continue
		}
		if itemsDepth >= 0 && depth == itemsDepth && !itemValues && c != ' ' && c != '\t' && c != '\n' && c != '\r' && c != ']' {
			itemValues = true
			items = 1
		}
		switch c {
		case '"':
			inString = true
			if depth == 1 {
				keyStart = i + 1
			}
		case '{', '[':
			depth++
			nodes++
			if depth > MaxDepth {
				return 0, fmt.Errorf("%w: nested deeper than %d levels", ErrTooLarge, MaxDepth)
			}
			if c == '[' && depth == 2 && string(key) == "items" {
				itemsDepth, items, itemValues = 2, 0, false
			}
		case '}', ']':
			if itemsDepth >= 0 && depth == itemsDepth {
				itemsDepth = -1
				objects = max(objects, items)
			}
			depth--
		case ',':
			nodes++
			if itemsDepth >= 0 && depth == itemsDepth {
				items++
			}
		case ':':
			nodes++
		}
		if nodes > MaxNodes {
			return 0, fmt.Errorf("%w: more than %d values", ErrTooLarge, MaxNodes)
		}
	}
	if len(data) > MaxExpandedBytes {
		return 0, fmt.Errorf("%w: more than %d bytes", ErrTooLarge, MaxExpandedBytes)
	}
	return max(objects, 1), nil
}

func checkObjects(n int) error {
	if n > MaxObjects {
		return fmt.Errorf("%w: %d objects, at most %d per payload (documents plus List items)", ErrTooLarge, n, MaxObjects)
	}
	return nil
}
