package apiv1

// This file holds the topic scheme: which topics a node subscribes to and
// publishes on, and the parsing of command topics.

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// DefaultPrefix is the topic prefix when none is configured.
const DefaultPrefix = "mqlet/v1"

// MaxRequestIDLen bounds a request id so it stays a sane topic level and key.
const MaxRequestIDLen = 128

// ErrNotCommand is returned by ParseCommand for a topic that is not a command
// of this node (another node, another prefix, or not under cmd/).
var ErrNotCommand = errors.New("not a command topic of this node")

// GroupLevel is the topic level under the prefix that holds group topics
// (<prefix>/group/<group>/...); no node may be named so.
const GroupLevel = "group"

// Scope is who a command was sent to and what it may touch: this node or
// one of its groups (Group, "" for the node itself), every namespace or
// one (Namespace, "" for all). A command may only touch objects of its
// scope's namespace.
type Scope struct {
	Group     string `json:"group,omitempty"`
	Namespace string `json:"namespace,omitempty"`
}

// Source is the name of the desired-state source a scope writes to:
// SourceNode for the node's own commands, "group/<name>" for a group's.
func (s Scope) Source() string {
	if s.Group == "" {
		return SourceNode
	}
	return GroupLevel + "/" + s.Group
}

// String names the scope for messages: "node", "node, namespace a",
// "group line-1, namespace a".
func (s Scope) String() string {
	out := "node"
	if s.Group != "" {
		out = "group " + s.Group
	}
	if s.Namespace != "" {
		out += ", namespace " + s.Namespace
	}
	return out
}

// SourceNode is the source of objects stored by the node's own commands.
const SourceNode = "node"

// AnnotationSource records on every stored object (and so on every
// published pod) the source it came from: SourceNode or "group/<name>"
// (Scope.Source). mqlet sets it; a command may only repeat it.
const AnnotationSource = "mqlet.io/source"

// CommandTopic is a parsed command topic.
type CommandTopic struct {
	Verb      string
	RequestID string // empty when the topic carries none
	Scope     Scope
}

// Scheme builds the topics of one node.
type Scheme struct {
	Prefix string // empty means DefaultPrefix
	Node   string
}

func (s Scheme) prefix() string {
	if s.Prefix == "" {
		return DefaultPrefix
	}
	return s.Prefix
}

func (s Scheme) base() string { return s.prefix() + "/" + s.Node }

// Validate reports whether the prefix and node name can form topics.
func (s Scheme) Validate() error {
	if s.Prefix != "" {
		if err := ValidatePrefix(s.Prefix); err != nil {
			return err
		}
	}
	return ValidateNodeName(s.Node)
}

// CommandFilters are the subscription filters for this node's own
// commands: node-wide and namespace-scoped.
func (s Scheme) CommandFilters() []string {
	return []string{s.base() + "/cmd/#", s.base() + "/ns/+/cmd/#"}
}

// GroupFilters are the subscription filters for the commands of group:
// group-wide and namespace-scoped.
func (s Scheme) GroupFilters(group string) []string {
	b := s.prefix() + "/" + GroupLevel + "/" + group
	return []string{b + "/cmd/#", b + "/ns/+/cmd/#"}
}

// Command is the topic of a node-wide command verb, with an optional
// request id.
func (s Scheme) Command(verb, requestID string) string {
	return s.CommandIn(Scope{}, verb, requestID)
}

// CommandIn is the topic of a command verb in scope (this node's or a
// group's, node-wide or of one namespace), with an optional request id.
func (s Scheme) CommandIn(scope Scope, verb, requestID string) string {
	t := s.base()
	if scope.Group != "" {
		t = s.prefix() + "/" + GroupLevel + "/" + scope.Group
	}
	if scope.Namespace != "" {
		t += "/ns/" + scope.Namespace
	}
	t += "/cmd/" + verb
	if requestID != "" {
		t += "/" + requestID
	}
	return t
}

// State is the retained online/offline topic (also the MQTT will).
func (s Scheme) State() string { return s.base() + "/state" }

// NodeTopic is the retained v1.Node topic.
func (s Scheme) NodeTopic() string { return s.base() + "/node" }

// Pod is the retained status topic of one pod.
func (s Scheme) Pod(namespace, name string) string {
	return s.base() + "/pods/" + namespace + "/" + name
}

// PodFilter matches the status topic of every pod of the node.
func (s Scheme) PodFilter() string { return s.base() + "/pods/+/+" }

// ParsePod splits a pod status topic of this node into namespace and name;
// ok is false for any other topic.
func (s Scheme) ParsePod(topic string) (namespace, name string, ok bool) {
	rest, found := strings.CutPrefix(topic, s.base()+"/pods/")
	if !found {
		return "", "", false
	}
	namespace, name, found = strings.Cut(rest, "/")
	if !found || namespace == "" || name == "" || strings.Contains(name, "/") {
		return "", "", false
	}
	return namespace, name, true
}

// Events is the (non-retained) v1.Event topic.
func (s Scheme) Events() string { return s.base() + "/events" }

// Metrics is the (non-retained, QoS 0) metrics topic.
func (s Scheme) Metrics() string { return s.base() + "/metrics" }

// Input is the topic on which the requester of a running request (a
// followed log) says it still reads: an empty message, QoS 0, at least
// every InputInterval. A follower whose requester is silent for the
// node's logs.unreadTimeout is ended ("unread").
func (s Scheme) Input(requestID string) string { return s.base() + "/in/" + requestID }

// Output is the topic on which the node sends the terminal of an
// interactive exec (ShellOutput, QoS 1, not retained).
func (s Scheme) Output(requestID string) string { return s.base() + "/out/" + requestID }

// InputFilter is the subscription filter for the input of this node's
// running requests.
func (s Scheme) InputFilter() string { return s.base() + "/in/+" }

// InputInterval is how often a reader says it still reads (Input); the
// shortest logs.unreadTimeout a node accepts is three of them.
const InputInterval = 5 * time.Second

// ParseInput returns the request id of an input topic of this node.
func (s Scheme) ParseInput(topic string) (string, error) {
	id, ok := strings.CutPrefix(topic, s.base()+"/in/")
	if !ok {
		return "", fmt.Errorf("parse input topic %q: not an input topic of this node", topic)
	}
	if err := ValidateRequestID(id); err != nil {
		return "", fmt.Errorf("parse input topic %q: %w", topic, err)
	}
	return id, nil
}

// Reply is the topic answering one request.
func (s Scheme) Reply(requestID string) string { return s.base() + "/reply/" + requestID }

// ParseCommand splits a command topic this node listens on into verb,
// request id (empty when the topic has none) and scope: its own node
// topics, node-wide or of one namespace, and any group's topics (whether
// the node is in that group is the intake's question, since membership is
// live). It rejects topics of other nodes or prefixes, an empty verb, extra
// levels, unsafe request ids, group and namespace names that are not valid.
func (s Scheme) ParseCommand(topic string) (CommandTopic, error) {
	bad := func(format string, args ...any) (CommandTopic, error) {
		return CommandTopic{}, fmt.Errorf("parse command topic %q: "+format, append([]any{topic}, args...)...)
	}
	p := s.Prefix
	if p == "" {
		p = DefaultPrefix
	}
	rest, ok := strings.CutPrefix(topic, p+"/")
	if !ok {
		return bad("%w", ErrNotCommand)
	}
	var c CommandTopic
	switch {
	case strings.HasPrefix(rest, s.Node+"/"):
		rest = rest[len(s.Node)+1:]
	case strings.HasPrefix(rest, GroupLevel+"/"):
		rest = rest[len(GroupLevel)+1:]
		g, after, _ := strings.Cut(rest, "/")
		if err := ValidateGroupName(g); err != nil {
			return bad("%w", err)
		}
		c.Scope.Group, rest = g, after
	default:
		return bad("%w", ErrNotCommand)
	}
	if ns, ok := strings.CutPrefix(rest, "ns/"); ok {
		name, after, _ := strings.Cut(ns, "/")
		if err := ValidateNamespace(name); err != nil {
			return bad("%w", err)
		}
		c.Scope.Namespace, rest = name, after
	}
	rest, ok = strings.CutPrefix(rest, "cmd/")
	if !ok {
		return bad("%w", ErrNotCommand)
	}
	levels := strings.Split(rest, "/")
	if len(levels) > 2 {
		return bad("too many levels after cmd/ (want <verb>[/<requestId>])")
	}
	c.Verb = levels[0]
	if c.Verb == "" {
		return bad("empty verb")
	}
	if !safeLevel(c.Verb, 64) {
		return bad("verb %q has characters outside [A-Za-z0-9._-]", c.Verb)
	}
	if len(levels) == 2 {
		c.RequestID = levels[1]
		if err := ValidateRequestID(c.RequestID); err != nil {
			return bad("%w", err)
		}
	}
	return c, nil
}

// ValidateRequestID accepts 1..128 characters of [A-Za-z0-9._-], not "." or
// containing "..", so an id is safe as a topic level and as a file or key name.
func ValidateRequestID(id string) error {
	if id == "" {
		return errors.New("empty request id")
	}
	if len(id) > MaxRequestIDLen {
		return fmt.Errorf("request id longer than %d characters", MaxRequestIDLen)
	}
	if !safeLevel(id, MaxRequestIDLen) {
		return fmt.Errorf("request id %q has characters outside [A-Za-z0-9._-]", id)
	}
	if id == "." || strings.Contains(id, "..") {
		return fmt.Errorf("request id %q contains a dot path", id)
	}
	return nil
}

func safeLevel(s string, maxLen int) bool {
	if s == "" || len(s) > maxLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '.', c == '_', c == '-':
		default:
			return false
		}
	}
	return true
}

// ValidateNodeName accepts a node name usable as one topic level: not empty,
// no '/', no wildcards, no leading '$', no NUL, and not GroupLevel (the
// level under which group topics live).
func ValidateNodeName(node string) error {
	if node == "" {
		return errors.New("node name is empty")
	}
	if strings.Contains(node, "/") {
		return fmt.Errorf("node name %q contains '/'", node)
	}
	if node == GroupLevel {
		return fmt.Errorf("node name %q is reserved: <prefix>/%s/<group>/... are the group topics", node, GroupLevel)
	}
	if node == RolloutLevel {
		return fmt.Errorf("node name %q is reserved: <prefix>/%s/<id> are the rollout documents", node, RolloutLevel)
	}
	return validateTopicText("node name", node)
}

// MaxGroupNameLen bounds a group name (a topic level and part of every
// stored object's source).
const MaxGroupNameLen = 63

// ValidateGroupName accepts a group name: 1..63 characters of
// [A-Za-z0-9._-], starting and ending with a letter or digit (so it is also
// a label name: the node's labels name its groups). Group names are
// narrower than node names: they appear in ACL patterns and in the source
// of stored objects.
func ValidateGroupName(group string) error {
	if group == "" {
		return errors.New("group name is empty")
	}
	alnum := func(c byte) bool { return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' }
	if !safeLevel(group, MaxGroupNameLen) || !alnum(group[0]) || !alnum(group[len(group)-1]) {
		return fmt.Errorf("group name %q: want 1 to %d characters of [A-Za-z0-9._-], starting and ending with a letter or digit", bounded(group), MaxGroupNameLen)
	}
	return nil
}

// GroupLabel is the label of the v1.Node naming one group it is in
// (value "true").
func GroupLabel(group string) string { return "group.mqlet.io/" + group }

// ValidateNamespace accepts a Kubernetes namespace name (an RFC 1123 DNS
// label: 1..63 characters of [a-z0-9-], starting and ending alphanumeric).
func ValidateNamespace(ns string) error {
	if ns == "" {
		return errors.New("namespace is empty")
	}
	if len(ns) > 63 {
		return fmt.Errorf("namespace %q is longer than 63 characters", bounded(ns))
	}
	for i := 0; i < len(ns); i++ {
		c := ns[i]
		alnum := c >= 'a' && c <= 'z' || c >= '0' && c <= '9'
		if !alnum && (c != '-' || i == 0 || i == len(ns)-1) {
			return fmt.Errorf("namespace %q is not a DNS label (lower-case alphanumerics and '-', starting and ending alphanumeric)", bounded(ns))
		}
	}
	return nil
}

// bounded shortens a name from a topic before it is echoed in an error.
func bounded(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}

// ValidatePrefix accepts a topic prefix of one or more non-empty levels with
// no wildcards and no leading '$' (so dashboards subscribed to '#' see it).
func ValidatePrefix(prefix string) error {
	if prefix == "" {
		return errors.New("topic prefix is empty")
	}
	for _, level := range strings.Split(prefix, "/") {
		if level == "" {
			return fmt.Errorf("topic prefix %q has an empty level", prefix)
		}
	}
	return validateTopicText("topic prefix", prefix)
}

func validateTopicText(what, s string) error {
	if strings.HasPrefix(s, "$") {
		return fmt.Errorf("%s %q starts with '$' (reserved for broker topics)", what, s)
	}
	if strings.ContainsAny(s, "+#") {
		return fmt.Errorf("%s %q contains an MQTT wildcard", what, s)
	}
	if strings.ContainsRune(s, 0) {
		return fmt.Errorf("%s %q contains NUL", what, s)
	}
	return nil
}
