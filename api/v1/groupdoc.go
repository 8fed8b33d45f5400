package apiv1

// This file holds a group's desired-state document: the retained message
// that late and returning members of a group converge to
// (docs/fleet.md, "The group document").

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Identity of a group document.
const (
	GroupDocumentAPIVersion = "mqlet.io/v1"
	GroupDocumentKind       = "GroupDocument"
)

// DesiredLevel is the last level of a group's document topic,
// <prefix>/group/<group>/desired.
const DesiredLevel = "desired"

// VerbDesired is the verb a signed group document names in its claims
// (and the verb of its replies): it is no command verb, so an envelope
// signed for a document is never taken as a command, nor one signed for
// a command as a document. A key signs documents when it may sign sync.
const VerbDesired = "desired"

// Reasons of the node events about group documents: a tool waiting for
// members' answers to a document takes a refusal event as the answer of
// a member that refused it without applying it.
const (
	ReasonAppliedGroupDocument = "AppliedGroupDocument"
	ReasonStaleGroupDocument   = "StaleGroupDocument"
	ReasonFailedGroupDocument  = "FailedGroupDocument"
)

// MaxGeneration bounds a document's generation to the integers a
// JavaScript dashboard reads exactly (2^53 - 1).
const MaxGeneration = 1<<53 - 1

// GroupDocument is the retained payload of <prefix>/group/<group>/desired
// (unsigned, or as the body of a signed envelope whose claims name the
// group and VerbDesired). A member applies it as the group's sync of
// Objects, once: only when Generation is newer than the one it last
// applied for the group, which it keeps in its store and publishes in its
// state (NodeState.GroupGenerations).
type GroupDocument struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	// Group must be the group of the topic.
	Group string `json:"group"`
	// Generation orders the group's documents: 1 to MaxGeneration, and
	// each new one higher than the last.
	Generation uint64 `json:"generation"`
	// Objects are everything the group's members should run from the
	// group: a Kubernetes List of Pods, ConfigMaps and Secrets (an empty
	// List removes the group's objects).
	Objects json.RawMessage `json:"objects"`
}

// DecodeGroupDocument decodes a document strictly (an unknown field, a
// missing or wrong apiVersion, kind or group, a generation out of range,
// no objects are errors) and checks that it is the document of group.
func DecodeGroupDocument(group string, payload []byte) (GroupDocument, error) {
	var d GroupDocument
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&d); err != nil {
		return GroupDocument{}, fmt.Errorf("group document: %w", err)
	}
	if dec.More() {
		return GroupDocument{}, errors.New("group document: trailing data after the document")
	}
	switch {
	case d.APIVersion != GroupDocumentAPIVersion || d.Kind != GroupDocumentKind:
		return GroupDocument{}, fmt.Errorf("group document: apiVersion %q, kind %q: want %s, %s", bounded(d.APIVersion), bounded(d.Kind), GroupDocumentAPIVersion, GroupDocumentKind)
	case d.Group != group:
		return GroupDocument{}, fmt.Errorf("group document: names group %q but came on the topic of group %q", bounded(d.Group), group)
	case d.Generation < 1 || d.Generation > MaxGeneration:
		return GroupDocument{}, fmt.Errorf("group document: generation %d: want 1 to %d", d.Generation, uint64(MaxGeneration))
	case len(bytes.TrimSpace(d.Objects)) == 0 || bytes.Equal(bytes.TrimSpace(d.Objects), []byte("null")):
		return GroupDocument{}, errors.New("group document: no objects (an empty List removes the group's objects)")
	}
	return d, nil
}

// GroupDesired is the retained topic of group's document.
func (s Scheme) GroupDesired(group string) string {
	return s.prefix() + "/" + GroupLevel + "/" + group + "/" + DesiredLevel
}

// ParseGroupDesired returns the group of a group document topic; ok is
// false for any other topic, err set for a document topic whose group
// name is not valid.
func (s Scheme) ParseGroupDesired(topic string) (group string, ok bool, err error) {
	rest, found := strings.CutPrefix(topic, s.prefix()+"/"+GroupLevel+"/")
	if !found {
		return "", false, nil
	}
	group, found = strings.CutSuffix(rest, "/"+DesiredLevel)
	if !found || strings.Contains(group, "/") {
		return "", false, nil
	}
	if err := ValidateGroupName(group); err != nil {
		return "", true, fmt.Errorf("group document topic %q: %w", bounded(topic), err)
	}
	return group, true, nil
}

// GroupDocumentRequestID is the request id under which a member answers
// the apply of a group document (accepted, in_progress, then succeeded or
// failed on <prefix>/<node>/reply/<id>), so a rollout tool collects every
// member's answer to one generation on <prefix>/+/reply/<id>.
func GroupDocumentRequestID(group string, generation uint64) string {
	return DesiredLevel + "." + group + "." + strconv.FormatUint(generation, 10)
}
