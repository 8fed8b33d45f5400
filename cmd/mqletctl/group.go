package main

// mqletctl group: a group's desired-state document, retained on
// <prefix>/group/<g>/desired (apiv1.GroupDocument), which members that
// were offline when it was published, or join later, apply when they
// connect (docs/fleet.md, "The group document"). publish makes and
// publishes it and collects the online members' answers; status shows
// which generation each member applied.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/duration"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	apiv1 "github.com/mqlet/mqlet/api/v1"
	"github.com/mqlet/mqlet/signing"
)

// maxGroupDocBytes bounds a document mqletctl publishes or reads: the
// largest mqtt.maxPayloadBytes a node takes. A node refuses a document
// over its own mqtt.maxPayloadBytes (1 MiB by default), which publish
// warns about.
const (
	maxGroupDocBytes      = 256 << 20
	defaultNodeMaxPayload = 1 << 20
)

func runGroup(ctx context.Context, cfg *globalConfig, args []string, e env) error {
	if len(args) == 0 {
		return usageError{errors.New("group: want publish or status")}
	}
	if isHelpFlag(args[0]) || (len(args) > 1 && isHelpFlag(args[1])) {
		return runGroupPublish(ctx, cfg, []string{"--help"}, e)
	}
	switch args[0] {
	case "publish":
		return runGroupPublish(ctx, cfg, args[1:], e)
	case "status":
		return runGroupStatus(ctx, cfg, args[1:], e)
	}
	return usageError{fmt.Errorf("group: unknown subcommand %q (publish, status)", args[0])}
}

// groupArg is the one GROUP argument of a group subcommand.
func groupArg(sub string, pos []string) (string, error) {
	if len(pos) != 1 {
		return "", usageError{fmt.Errorf("group %s: want one GROUP, got %d arguments", sub, len(pos))}
	}
	if err := apiv1.ValidateGroupName(pos[0]); err != nil {
		return "", usageError{fmt.Errorf("group %s: %w", sub, err)}
	}
	return pos[0], nil
}

func runGroupPublish(ctx context.Context, cfg *globalConfig, args []string, e env) error {
	fs := newFlagSet("group", cfg)
	var files fileList
	fs.Var(&files, "f", "manifest `FILE` or directory of the group's whole desired state (Pods and ConfigMaps; - for stdin; repeatable)")
	fs.Var(&files, "filename", "same as -f")
	gen := fs.Uint64("generation", 0, "the document's generation `N` (default: one above the newest retained or applied by a member); members apply only a newer one")
	noWait := fs.Bool("no-wait", false, "publish: return once the broker has the document (default: wait for every online member's answer)")
	cfg.registerOutput(fs, "json (one line per member); status: json or yaml")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	group, err := groupArg("publish", pos)
	if err != nil {
		return err
	}
	if len(files) == 0 {
		return usageError{errors.New("group publish: -f FILE (or -f - for stdin) is required")}
	}
	if *gen > apiv1.MaxGeneration {
		return usageError{fmt.Errorf("group publish: --generation %d: want 1 to %d", *gen, uint64(apiv1.MaxGeneration))}
	}
	if err := cfg.checkOutput("json"); err != nil {
		return err
	}
	if err := cfg.resolveFleet(); err != nil {
		return err
	}
	manifest, err := readManifests(files, e.stdin)
	if err != nil {
		return err
	}
	objects, err := groupObjects(manifest)
	if err != nil {
		return fmt.Errorf("group publish %s: %w", group, err)
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	rows, err := readFleetTopics(ctx, cfg, false)
	if err != nil {
		return err
	}
	var members []*nodeRow
	for _, r := range rows {
		if inGroup(r, group) {
			members = append(members, r)
		}
	}
	c, err := dial(ctx, cfg)
	if err != nil {
		return err
	}
	defer c.close()
	retained, err := readGroupDocument(ctx, c, cfg, group)
	if err != nil && !errors.Is(err, errNoGroupDocument) {
		return err
	}
	// The newest generation anyone has: the retained document's, or one a
	// member applied (a document since replaced by an older one, or
	// cleared).
	newest, by := uint64(0), ""
	if retained != nil {
		newest, by = retained.Doc.Generation, "the retained document"
	}
	for _, m := range members {
		if g := m.State.GroupGenerations[group]; g > newest {
			newest, by = g, "member "+m.Node
		}
	}
	switch {
	case *gen == 0 && newest >= apiv1.MaxGeneration:
		return fmt.Errorf("group publish %s: generation %d (%s) is the highest there is", group, newest, by)
	case *gen == 0:
		*gen = newest + 1
	case *gen <= newest:
		return fmt.Errorf("group publish %s: --generation %d is not newer than generation %d (%s): members would refuse it (StaleGroupDocument); give --generation %d or more, or leave it out", group, *gen, newest, by, newest+1)
	}
	doc, err := json.Marshal(apiv1.GroupDocument{APIVersion: apiv1.GroupDocumentAPIVersion, Kind: apiv1.GroupDocumentKind, Group: group, Generation: *gen, Objects: objects})
	if err != nil {
		return fmt.Errorf("encoding the group document: %w", err)
	}
	if len(doc) > defaultNodeMaxPayload {
		fmt.Fprintf(e.stderr, "warning: the document is %d bytes, over the %d a node takes by default (mqtt.maxPayloadBytes): members with the default refuse it (FailedGroupDocument)\n", len(doc), defaultNodeMaxPayload)
	}
	payload := doc
	signedBy := ""
	if cfg.signer != nil {
		if payload, err = cfg.signer.SignDocument(group, cfg.now(), doc); err != nil {
			return err
		}
		signedBy = ", signed by key " + cfg.signer.KeyID()
	}
	topic := apiv1.Scheme{Prefix: cfg.Prefix}.GroupDesired(group)
	send := func(ctx context.Context) error {
		if err := wait(ctx, c.mqtt.Publish(topic, 1, true, payload)); err != nil {
			return fmt.Errorf("publishing the document of group %s on %s: %w", group, c.broker, err)
		}
		return nil
	}
	published := fmt.Sprintf("group %s: generation %d published, retained on %s%s", group, *gen, topic, signedBy)
	if *noWait || len(members) == 0 {
		if err := send(ctx); err != nil {
			return err
		}
		fmt.Fprintln(e.stderr, published)
		if len(members) == 0 {
			fmt.Fprintf(e.stderr, "no node under prefix %s names group %s in its retained state yet: the document waits, retained, for its first member\n", cfg.Prefix, group)
		}
		return nil
	}
	results, err := collectGroupAnswers(ctx, c, cfg, group, *gen, members, send)
	if err != nil {
		return err
	}
	fmt.Fprintln(e.stderr, published)
	if err := printFleetResults(cfg, e, results); err != nil {
		return err
	}
	return fleetOutcome(results, "group "+group)
}

// groupObjects makes the document's List of the manifests' objects (a
// List in them is taken item by item). Only Pods and ConfigMaps: a Secret
// is sealed to each node's key, and a retained document is opened by
// members that join later, whose keys nobody knows at the publish.
func groupObjects(manifest []byte) (json.RawMessage, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(manifest), 4096)
	items := []json.RawMessage{}
	add := func(raw json.RawMessage) error {
		var meta struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
			Metadata   struct {
				Name string `json:"name"`
			} `json:"metadata"`
		}
		if err := json.Unmarshal(raw, &meta); err != nil {
			return fmt.Errorf("manifest object %d: %w", len(items)+1, err)
		}
		switch meta.Kind {
		case "Pod", "ConfigMap":
		case "Secret":
			return fmt.Errorf("Secret %q: a group document carries Pods and ConfigMaps only (a Secret is sealed to each node's key, and a member that joins later has a key nobody knew at the publish); send Secrets with 'sync --group' or to each node", bounded(meta.Metadata.Name))
		default:
			return fmt.Errorf("object %d: kind %q: a group document carries Pods and ConfigMaps", len(items)+1, bounded(meta.Kind))
		}
		items = append(items, raw)
		return nil
	}
	for {
		var raw json.RawMessage
		err := dec.Decode(&raw)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("reading the manifests: %w", err)
		}
		if len(bytes.TrimSpace(raw)) == 0 || bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
			continue
		}
		var list struct {
			Kind  string            `json:"kind"`
			Items []json.RawMessage `json:"items"`
		}
		if err := json.Unmarshal(raw, &list); err == nil && list.Kind == "List" {
			for _, it := range list.Items {
				if err := add(it); err != nil {
					return nil, err
				}
			}
			continue
		}
		if err := add(raw); err != nil {
			return nil, err
		}
	}
	out, err := json.Marshal(map[string]any{"apiVersion": "v1", "kind": "List", "items": items})
	if err != nil {
		return nil, fmt.Errorf("encoding the group's objects: %w", err)
	}
	return out, nil
}

// retainedGroupDoc is a group's retained document as read, its signature
// not checked (mqletctl holds no node's trusted keys; the nodes check it).
type retainedGroupDoc struct {
	Doc      apiv1.GroupDocument
	Signed   bool
	KeyID    string
	IssuedAt time.Time
	Bytes    int
}

// errNoGroupDocument: nothing retained on the group's document topic.
var errNoGroupDocument = errors.New("no group document retained")

// readGroupDocument reads the document retained for group.
func readGroupDocument(ctx context.Context, c *client, cfg *globalConfig, group string) (*retainedGroupDoc, error) {
	payload, err := c.readRetainedOne(ctx, cfg.Prefix, cfg.RetainedWait, apiv1.Scheme{Prefix: cfg.Prefix}.GroupDesired(group))
	if errors.Is(err, errNothingRetained) {
		return nil, errNoGroupDocument
	} else if err != nil {
		return nil, err
	}
	return decodeRetainedGroupDoc(group, payload)
}

func decodeRetainedGroupDoc(group string, payload []byte) (*retainedGroupDoc, error) {
	if len(payload) > maxGroupDocBytes {
		return nil, fmt.Errorf("group %s: retained document of %d bytes, over %d", group, len(payload), maxGroupDocBytes)
	}
	out := &retainedGroupDoc{Bytes: len(payload)}
	body := payload
	if signing.LooksSigned(payload) {
		g, kid, iat, b, err := signing.PeekDocument(payload)
		if err != nil {
			return nil, fmt.Errorf("group %s: the retained document: %w", group, err)
		}
		if g != group {
			return nil, fmt.Errorf("group %s: the retained document is signed for %q", group, bounded(g))
		}
		out.Signed, out.KeyID, out.IssuedAt, body = true, kid, iat, b
	}
	doc, err := apiv1.DecodeGroupDocument(group, body)
	if err != nil {
		return nil, fmt.Errorf("group %s: the retained document: %w", group, err)
	}
	out.Doc = doc
	return out, nil
}

// collectGroupAnswers subscribes to the members' replies to the document
// of generation gen, their states and their events, sends it, and waits
// until every online member gave a final answer. A member that refuses
// the document without applying it (a bad signature, a newer generation
// applied) says so only in a FailedGroupDocument or StaleGroupDocument
// event: that event is its answer. An offline member is Pending (the
// document is retained: it applies it when back), unless --wait-offline.
func collectGroupAnswers(ctx context.Context, c *client, cfg *globalConfig, group string, gen uint64, members []*nodeRow, send func(context.Context) error) ([]*memberResult, error) {
	id := apiv1.GroupDocumentRequestID(group, gen)
	topic := apiv1.Scheme{Prefix: cfg.Prefix}.GroupDesired(group)
	results := map[string]*memberResult{}
	replyOf, stateOf, eventsOf := map[string]string{}, map[string]string{}, map[string]string{}
	var filters []string
	for _, m := range members {
		s := apiv1.Scheme{Prefix: cfg.Prefix, Node: m.Node}
		results[m.Node] = &memberResult{Node: m.Node}
		if m.State != nil && m.State.State == apiv1.StateOffline {
			since := m.State.TS
			results[m.Node].Offline = &since
		}
		replyOf[s.Reply(id)], stateOf[s.State()], eventsOf[s.Events()] = m.Node, m.Node, m.Node
		filters = append(filters, s.Reply(id), s.State(), s.Events())
	}
	subCtx, stop := context.WithCancel(ctx)
	defer stop()
	inbox := make(chan message, 64)
	if err := c.subscribe(subCtx, inbox, filters...); err != nil {
		return nil, err
	}
	defer c.mqtt.Unsubscribe(filters...)
	if err := send(ctx); err != nil {
		return nil, err
	}
	for waitingForAnswers(results, cfg.WaitOffline) {
		select {
		case m := <-inbox:
			if n, ok := stateOf[m.Topic]; ok {
				results[n].stateSeen(m.Payload)
				continue
			}
			if n, ok := eventsOf[m.Topic]; ok {
				var ev v1.Event
				r := results[n]
				if r.Final != nil || len(m.Payload) > 64<<10 || json.Unmarshal(m.Payload, &ev) != nil {
					continue
				}
				if ev.Reason != apiv1.ReasonFailedGroupDocument && ev.Reason != apiv1.ReasonStaleGroupDocument {
					continue
				}
				if !strings.Contains(ev.Message, topic) && !strings.Contains(ev.Message, "group "+group+": ") {
					continue // about another group's document
				}
				final := apiv1.Reply{Phase: apiv1.Failed, Message: ev.Reason + ": " + ev.Message, TS: ev.LastTimestamp.Time}
				r.Phase, r.Message, r.TS, r.Final, r.Offline = final.Phase, final.Message, final.TS, &final, nil
				continue
			}
			n, ok := replyOf[m.Topic]
			if !ok {
				continue
			}
			rep, err := apiv1.DecodeReply(m.Payload)
			if err != nil || (rep.RequestID != "" && rep.RequestID != id) {
				continue
			}
			r := results[n]
			if r.Final != nil {
				continue
			}
			r.answered(rep)
		case <-ctx.Done():
			if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return nil, ctx.Err()
			}
			failUnanswered(results, "no answer", func(last string) string {
				return fmt.Sprintf("no final answer to generation %d (request %s) within --timeout %v (last: %s); see its events", gen, id, cfg.Timeout, last)
			})
			return groupResults(results), nil
		}
	}
	return groupResults(results), nil
}

// groupResults are the rows in name order; an offline member is Pending.
func groupResults(m map[string]*memberResult) []*memberResult {
	out := sortedResults(m)
	for _, r := range out {
		if r.Phase == phasePending {
			r.Message = "offline since " + r.Offline.UTC().Format(time.RFC3339) + ": the document is retained; the node applies it when it is back"
		}
	}
	return out
}

// Phases of a member in group status.
const (
	groupApplied = "Applied"
	groupBehind  = "Behind"
	groupAhead   = "Ahead"
)

// groupMemberStatus is one member's row of group status.
type groupMemberStatus struct {
	Node         string     `json:"node"`
	State        string     `json:"state"`
	Applied      uint64     `json:"appliedGeneration,omitempty"`
	Phase        string     `json:"phase"`
	Message      string     `json:"message,omitempty"`
	OfflineSince *time.Time `json:"offlineSince,omitempty"`
}

// groupStatus is what group status prints.
type groupStatus struct {
	Group      string              `json:"group"`
	Generation uint64              `json:"generation,omitempty"` // retained; 0: none
	Signed     bool                `json:"signed"`
	KeyID      string              `json:"keyId,omitempty"`
	Objects    int                 `json:"objects"`
	Members    []groupMemberStatus `json:"members"`
}

func runGroupStatus(ctx context.Context, cfg *globalConfig, args []string, e env) error {
	fs := newFlagSet("group", cfg)
	cfg.registerOutput(fs, "json or yaml")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	group, err := groupArg("status", pos)
	if err != nil {
		return err
	}
	if err := cfg.checkOutput("json", "yaml"); err != nil {
		return err
	}
	if err := cfg.resolveFleet(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	rows, err := readFleetTopics(ctx, cfg, false)
	if err != nil {
		return err
	}
	c, err := dial(ctx, cfg)
	if err != nil {
		return err
	}
	defer c.close()
	retained, err := readGroupDocument(ctx, c, cfg, group)
	if err != nil && !errors.Is(err, errNoGroupDocument) {
		return err
	}
	st := groupStatus{Group: group, Members: []groupMemberStatus{}}
	if retained != nil {
		st.Generation, st.Signed, st.KeyID = retained.Doc.Generation, retained.Signed, retained.KeyID
		var list struct {
			Items []json.RawMessage `json:"items"`
		}
		_ = json.Unmarshal(retained.Doc.Objects, &list)
		st.Objects = len(list.Items)
	}
	for _, r := range rows {
		if inGroup(r, group) {
			st.Members = append(st.Members, memberStatus(r, group, st.Generation))
		}
	}
	if retained == nil && len(st.Members) == 0 {
		return fmt.Errorf("unknown group %q: no node under prefix %s names it in its retained state, and no document is retained on %s", group, cfg.Prefix, apiv1.Scheme{Prefix: cfg.Prefix}.GroupDesired(group))
	}
	if cfg.Output == "json" || cfg.Output == "yaml" {
		if err := printObjects(e.stdout, cfg.Output, st); err != nil {
			return err
		}
	} else if err := printGroupStatus(e.stdout, st, e.now); err != nil {
		return err
	}
	return groupStatusOutcome(st, e)
}

// memberStatus is where member r stands against the retained generation
// gen (0: none retained). The offline state does not name the
// generations applied: an offline member is Pending.
func memberStatus(r *nodeRow, group string, gen uint64) groupMemberStatus {
	m := groupMemberStatus{Node: r.Node, State: r.State.State, Applied: r.State.GroupGenerations[group]}
	applied := "none"
	if m.Applied > 0 {
		applied = "generation " + strconv.FormatUint(m.Applied, 10)
	}
	switch {
	case r.State.State == apiv1.StateOffline:
		since := r.State.TS
		m.OfflineSince = &since
		m.Phase, m.Message = phasePending, "offline since "+since.UTC().Format(time.RFC3339)+": it applies the retained document when it is back"
	case gen == 0:
		m.Phase, m.Message = "-", "no document retained; it applied "+applied
	case m.Applied == gen:
		m.Phase = groupApplied
	case m.Applied > gen:
		m.Phase, m.Message = groupAhead, fmt.Sprintf("it applied generation %d, newer than the retained %d (an older document was published since, which it refuses: StaleGroupDocument)", m.Applied, gen)
	default:
		m.Phase, m.Message = groupBehind, fmt.Sprintf("it applied %s, not the retained %d: applying it now, or refused it (see its events FailedGroupDocument, and its reply %s)", applied, gen, apiv1.GroupDocumentRequestID(group, gen))
	}
	return m
}

func printGroupStatus(w io.Writer, st groupStatus, now func() time.Time) error {
	if st.Generation == 0 {
		fmt.Fprintf(w, "group %s: no document retained\n", st.Group)
	} else {
		signed := "unsigned"
		if st.Signed {
			signed = "signed by key " + printable(st.KeyID) + " (not checked here; the members check it)"
		}
		fmt.Fprintf(w, "group %s: generation %d retained, %d object(s), %s\n", st.Group, st.Generation, st.Objects, signed)
	}
	tw := tabwriter.NewWriter(w, 0, 8, 3, ' ', 0)
	fmt.Fprintln(tw, "NODE\tSTATE\tAPPLIED\tPHASE\tMESSAGE\tAGE")
	for _, m := range st.Members {
		applied, age := "-", "-"
		if m.Applied > 0 {
			applied = strconv.FormatUint(m.Applied, 10)
		}
		if m.OfflineSince != nil {
			age = duration.HumanDuration(now().Sub(*m.OfflineSince))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", printable(m.Node), printable(m.State), applied, m.Phase, printable(oneLine(m.Message)), age)
	}
	return tw.Flush()
}

// groupStatusOutcome: 0 when every member applied the retained
// generation, 3 when the others are offline, 1 when an online member did
// not (or nothing is retained).
func groupStatusOutcome(st groupStatus, e env) error {
	if st.Generation == 0 {
		fmt.Fprintf(e.stderr, "group %s: no document retained\n", st.Group)
		return errReported
	}
	pending := 0
	for _, m := range st.Members {
		switch m.Phase {
		case groupApplied:
		case phasePending:
			pending++
		default:
			return errReported
		}
	}
	if pending > 0 {
		return groupPending{pending: pending, total: len(st.Members), group: st.Group}
	}
	return nil
}

// groupPending: every online member applied the retained generation, some
// are offline (exit 3).
type groupPending struct {
	pending, total int
	group          string
}

func (p groupPending) Error() string {
	return fmt.Sprintf("pending: %d of %d member(s) of group %s offline; each applies the retained document when it is back", p.pending, p.total, p.group)
}
