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

// Scheme builds the topics of one node.
type Scheme struct {
	Prefix string // empty means DefaultPrefix
	Node   string
}

func (s Scheme) base() string {
	p := s.Prefix
	if p == "" {
		p = DefaultPrefix
	}
	return p + "/" + s.Node
}

// Validate reports whether the prefix and node name can form topics.
func (s Scheme) Validate() error {
	if s.Prefix != "" {
		if err := ValidatePrefix(s.Prefix); err != nil {
			return err
		}
	}
	return ValidateNodeName(s.Node)
}

// CommandFilter is the subscription filter for this node's commands.
func (s Scheme) CommandFilter() string { return s.base() + "/cmd/#" }

// Command is the topic of a command verb, with an optional request id.
func (s Scheme) Command(verb, requestID string) string {
	t := s.base() + "/cmd/" + verb
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

// Events is the (non-retained) v1.Event topic.
func (s Scheme) Events() string { return s.base() + "/events" }

// Metrics is the (non-retained, QoS 0) metrics topic.
func (s Scheme) Metrics() string { return s.base() + "/metrics" }

// Input is the topic on which the requester of a running request (a
// followed log) says it still reads: an empty message, QoS 0, at least
// every InputInterval. A follower whose requester is silent for the
// node's logs.unreadTimeout is ended ("unread").
func (s Scheme) Input(requestID string) string { return s.base() + "/in/" + requestID }

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

// ParseCommand splits a command topic of this node into verb and request id
// (empty when the topic has none). It rejects topics of other nodes or
// prefixes, an empty verb, extra levels and unsafe request ids.
func (s Scheme) ParseCommand(topic string) (verb, requestID string, err error) {
	head := s.base() + "/cmd/"
	rest, ok := strings.CutPrefix(topic, head)
	if !ok {
		return "", "", fmt.Errorf("parse command topic %q: %w", topic, ErrNotCommand)
	}
	levels := strings.Split(rest, "/")
	if len(levels) > 2 {
		return "", "", fmt.Errorf("parse command topic %q: too many levels after cmd/ (want <verb>[/<requestId>])", topic)
	}
	verb = levels[0]
	if verb == "" {
		return "", "", fmt.Errorf("parse command topic %q: empty verb", topic)
	}
	if !safeLevel(verb, 64) {
		return "", "", fmt.Errorf("parse command topic %q: verb %q has characters outside [A-Za-z0-9._-]", topic, verb)
	}
	if len(levels) == 2 {
		requestID = levels[1]
		if err := ValidateRequestID(requestID); err != nil {
			return "", "", fmt.Errorf("parse command topic %q: %w", topic, err)
		}
	}
	return verb, requestID, nil
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
// no '/', no wildcards, no leading '$', no NUL.
func ValidateNodeName(node string) error {
	if node == "" {
		return errors.New("node name is empty")
	}
	if strings.Contains(node, "/") {
		return fmt.Errorf("node name %q contains '/'", node)
	}
	return validateTopicText("node name", node)
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
