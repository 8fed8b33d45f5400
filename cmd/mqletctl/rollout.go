package main

// mqletctl rollout: manifests rolled out to a group or the nodes of a
// selector in waves, with abort criteria and rollback. The rollout's whole
// state is the retained document <prefix>/rollouts/<id> (apiv1.Rollout);
// this process runs it (internal/rollout decides, this file talks MQTT),
// and any other mqletctl can resume, watch or abort it from the document.

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/duration"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	apiv1 "github.com/mqlet/mqlet/api/v1"
	"github.com/mqlet/mqlet/internal/rollout"
	"github.com/mqlet/mqlet/signing"
)

const (
	// defaultRolloutTimeout is how long start and resume run a rollout
	// when --timeout is not given (the global 60 s is for one reply).
	defaultRolloutTimeout = 30 * time.Minute
	defaultNodeTimeout    = 5 * time.Minute
	// leaseRenew is how often a runner republishes the document while
	// nothing changes; leaseFresh is how long a resume takes a runner to
	// be alive since its last renewal.
	leaseRenew = 5 * time.Second
	leaseFresh = 15 * time.Second
	// maxRolloutManifest bounds the manifests of a rollout (one command).
	maxRolloutManifest = 512 << 10
	// sendRetry is how long a node whose previous state could not be read
	// waits before it is tried again.
	sendRetry = 5 * time.Second
)

func runRollout(ctx context.Context, cfg *globalConfig, args []string, e env) error {
	if len(args) == 0 {
		return usageError{errors.New("rollout: want start, status, resume or abort")}
	}
	if isHelpFlag(args[0]) || (len(args) > 1 && isHelpFlag(args[1])) {
		// One help for the subcommands: start's flags and those of the
		// others.
		err := runRolloutStart(ctx, cfg, []string{"--help"}, e)
		var h helpRequest
		if errors.As(err, &h) {
			h.fs.Bool("force", false, "resume: take the rollout over from a runner that renewed its lease lately")
			h.fs.String("reason", "", "abort: why (kept in the document)")
		}
		return err
	}
	switch args[0] {
	case "start":
		return runRolloutStart(ctx, cfg, args[1:], e)
	case "resume", "status", "abort":
		return runRolloutByID(ctx, cfg, args[0], args[1:], e)
	case "list":
		return runRolloutList(ctx, cfg, args[1:], e)
	}
	return usageError{fmt.Errorf("rollout: unknown subcommand %q (start, list, status, resume, abort)", args[0])}
}

// runRolloutList prints every rollout document retained under the prefix.
func runRolloutList(ctx context.Context, cfg *globalConfig, args []string, e env) error {
	fs := newFlagSet("rollout", cfg)
	registerFleet(fs, cfg)
	cfg.registerOutput(fs, "json or yaml")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 || cfg.fleet.active() {
		return usageError{errors.New("rollout list takes no arguments")}
	}
	if err := cfg.checkOutput("json", "yaml"); err != nil {
		return err
	}
	if err := cfg.resolveFleet(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	c, err := dial(ctx, cfg)
	if err != nil {
		return err
	}
	defer c.close()
	docs := map[string]*apiv1.Rollout{}
	err = c.collectRetained(ctx, cfg.Prefix, cfg.RetainedWait, []string{apiv1.RolloutTopic(cfg.Prefix, "+")}, func(m message) {
		id := strings.TrimPrefix(m.Topic, apiv1.RolloutTopic(cfg.Prefix, ""))
		if len(m.Payload) == 0 {
			delete(docs, id)
		} else if doc, err := decodeRollout(m.Payload, id); err == nil {
			docs[id] = doc
		} else {
			fmt.Fprintf(e.stderr, "skipping %s: %v\n", printable(m.Topic), err)
		}
	})
	if err != nil {
		return err
	}
	ids := make([]string, 0, len(docs))
	for id := range docs {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	if cfg.Output == "json" || cfg.Output == "yaml" {
		list := make([]*apiv1.Rollout, 0, len(ids))
		for _, id := range ids {
			list = append(list, docs[id])
		}
		return printObjects(e.stdout, cfg.Output, map[string]any{"prefix": cfg.Prefix, "rollouts": list})
	}
	if len(ids) == 0 {
		fmt.Fprintf(e.stderr, "No rollouts under prefix %s\n", cfg.Prefix)
		return nil
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 8, 3, ' ', 0)
	fmt.Fprintln(tw, "ID\tTARGET\tPHASE\tTARGETED\tSUCCEEDED\tFAILED\tPENDING\tAGE")
	for _, id := range ids {
		d := docs[id]
		target := "group/" + d.Target.Group
		if d.Target.Group == "" {
			target = "-L " + d.Target.Selector
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%d\t%s\n", printable(id), printable(target), d.Phase, d.Totals.Targeted, d.Totals.Succeeded, d.Totals.Failed, d.Totals.Pending, duration.HumanDuration(e.now().Sub(d.CreatedAt)))
	}
	return tw.Flush()
}

// countOrPercent parses "N" or "N%".
func countOrPercent(flagName, s string) (count, pct int, err error) {
	if s == "" {
		return 0, 0, nil
	}
	num, isPct := strings.CutSuffix(s, "%")
	v, err := strconv.Atoi(num)
	if err != nil || v < 0 {
		return 0, 0, usageError{fmt.Errorf("%s %q: want a count or a percentage (N or N%%)", flagName, s)}
	}
	if isPct {
		if v == 0 || v > 100 {
			return 0, 0, usageError{fmt.Errorf("%s %q: a percentage is 1%% to 100%%", flagName, s)}
		}
		return 0, v, nil
	}
	return v, 0, nil
}

func runRolloutStart(ctx context.Context, cfg *globalConfig, args []string, e env) error {
	fs := newFlagSet("rollout", cfg)
	var files fileList
	fs.Var(&files, "f", "manifest `FILE` or directory (Pods and ConfigMaps; - for stdin; repeatable)")
	fs.Var(&files, "filename", "same as -f")
	fleet := registerFleet(fs, cfg)
	id := fs.String("id", "", "rollout id (default: generated); its document is <prefix>/rollouts/<id>")
	batch := fs.String("batch", "", "nodes in the first wave: a count, or a percentage of the nodes (25%)")
	growth := fs.Float64("growth", 1, "each wave this many times the size of the one before (2: exponential)")
	maxFail := fs.String("max-failures", "0", "abort when more nodes failed: a count, or a percentage of the finished nodes (10%)")
	minExec := fs.Int("min-executed", 0, "the failure criterion applies once this many nodes finished")
	nodeTimeout := fs.Duration("node-timeout", defaultNodeTimeout, "a node not Ready this long after it accepted has failed (time offline not counted)")
	rollback := fs.Bool("rollback", false, "on abort, re-apply to the nodes already changed what they ran before (abort: roll back now)")
	detach := fs.Bool("detach", false, "publish the rollout and return (rollout resume ID runs it)")
	cfg.registerOutput(fs, "json or yaml (the final document)")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usageError{fmt.Errorf("rollout start: unexpected arguments %q", pos)}
	}
	if err := cfg.checkOutput("json", "yaml"); err != nil {
		return err
	}
	if len(files) == 0 {
		return usageError{errors.New("rollout start: -f FILE is required")}
	}
	if !fleet.active() {
		return usageError{errors.New("rollout start: --group G or -L SELECTOR names the nodes")}
	}
	if err := fleet.check(cfg, "rollout start"); err != nil {
		return err
	}
	s := apiv1.RolloutStrategy{Growth: *growth, MinExecuted: *minExec, Rollback: *rollback, NodeTimeoutSeconds: int64((*nodeTimeout + time.Second - 1) / time.Second)}
	if s.Batch, s.BatchPercent, err = countOrPercent("--batch", *batch); err != nil {
		return err
	}
	if s.MaxFailures, s.MaxFailurePercent, err = countOrPercent("--max-failures", *maxFail); err != nil {
		return err
	}
	if err := rollout.ValidateStrategy(s); err != nil {
		return usageError{fmt.Errorf("rollout start: %w", err)}
	}
	if *id == "" {
		*id = "r-" + e.now().UTC().Format("20060102-150405") + "-" + randomToken(4)
	}
	if err := apiv1.ValidateRolloutID(*id); err != nil {
		return usageError{err}
	}
	manifest, err := readManifests(files, e.stdin)
	if err != nil {
		return err
	}
	if len(manifest) > maxRolloutManifest {
		return fmt.Errorf("rollout start: the manifests are %d bytes, over the %d a rollout carries", len(manifest), maxRolloutManifest)
	}
	objects, err := manifestObjects(manifest)
	if err != nil {
		return err
	}
	if !cfg.explicit["timeout"] {
		cfg.Timeout = defaultRolloutTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	members, err := fleet.members(ctx, cfg)
	if err != nil {
		return err
	}
	names := make([]string, 0, len(members))
	for _, m := range members {
		names = append(names, m.Node)
	}
	target := apiv1.RolloutTarget{Group: fleet.group.value, Selector: fleet.selector.value}
	doc, err := rollout.New(*id, target, s, string(manifest), objects, names, e.now())
	if err != nil {
		return err
	}
	c, err := dial(ctx, cfg)
	if err != nil {
		return err
	}
	defer c.close()
	if old, err := readRolloutOn(ctx, c, cfg, *id); err == nil && old != nil {
		return fmt.Errorf("rollout %s exists (%s); choose another --id, or `rollout resume %s`", *id, old.Phase, *id)
	} else if err != nil && !errors.Is(err, errNoRollout) {
		return err
	}
	r := newRunner(cfg, c, doc, e)
	if *detach {
		if err := r.publish(ctx); err != nil {
			return err
		}
		fmt.Fprintf(e.stdout, "rollout %s published (%d nodes, %d waves); run it with `mqletctl rollout resume %s`\n", *id, len(doc.Nodes), len(rollout.WaveSizes(len(doc.Nodes), s)), *id)
		return nil
	}
	fmt.Fprintf(e.stderr, "rollout %s: %d node(s) in %d wave(s), document %s\n", *id, len(doc.Nodes), len(rollout.WaveSizes(len(doc.Nodes), s)), apiv1.RolloutTopic(cfg.Prefix, *id))
	return r.run(ctx)
}

func runRolloutByID(ctx context.Context, cfg *globalConfig, verb string, args []string, e env) error {
	fs := newFlagSet("rollout", cfg)
	force := fs.Bool("force", false, "resume: take the rollout over from a runner that renewed its lease lately")
	rollback := fs.Bool("rollback", false, "abort: also roll the changed nodes back")
	reason := fs.String("reason", "", "abort: why (kept in the document)")
	var trust fileList
	fs.Var(&trust, "trust-key", "public `KEY` (base64, as keys show prints it) whose signature of the document is trusted besides --sign-key's own (repeatable)")
	cfg.registerOutput(fs, "json or yaml (the document)")
	registerFleet(fs, cfg) // refused below, not unknown
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usageError{fmt.Errorf("rollout %s: want one rollout ID", verb)}
	}
	if cfg.fleet.active() {
		return usageError{fmt.Errorf("rollout %s: --group and -L are for rollout start (the document names the nodes)", verb)}
	}
	if err := apiv1.ValidateRolloutID(pos[0]); err != nil {
		return usageError{err}
	}
	if err := cfg.checkOutput("json", "yaml"); err != nil {
		return err
	}
	if err := cfg.resolveFleet(); err != nil {
		return err
	}
	if verb != "status" && !cfg.explicit["timeout"] {
		cfg.Timeout = defaultRolloutTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	c, err := dial(ctx, cfg)
	if err != nil {
		return err
	}
	defer c.close()
	doc, err := readRolloutOn(ctx, c, cfg, pos[0])
	if errors.Is(err, errNoRollout) {
		fmt.Fprintf(e.stderr, "Error: no rollout %q under prefix %s (nothing retained on %s)\n", pos[0], cfg.Prefix, apiv1.RolloutTopic(cfg.Prefix, pos[0]))
		return errReported
	}
	if err != nil {
		return err
	}
	signedBy, verr := verifyRollout(doc, cfg.signKey, trust)
	if cfg.signKey != nil && verb != "status" && verr != nil {
		// It would sign and send what the document says.
		return fmt.Errorf("rollout %s: %w; with --sign-key, resume and abort send only what a trusted key signed (--trust-key KEY)", doc.ID, verr)
	}
	if verb == "status" {
		switch {
		case verr == nil:
			fmt.Fprintf(e.stderr, "document signed by %s (verified)\n", signedBy)
		case doc.Signature != nil:
			fmt.Fprintf(e.stderr, "document signed by %s (not verified: %v)\n", printable(bounded(doc.Signature.KeyID)), verr)
		}
	}
	r := newRunner(cfg, c, doc, e)
	switch verb {
	case "status":
		if err := r.print(); err != nil {
			return err
		}
		return rolloutOutcome(doc)
	case "abort":
		if doc.Phase != apiv1.RolloutRunning && !(*rollback && doc.Phase == apiv1.RolloutAborted && !doc.Strategy.Rollback) {
			fmt.Fprintf(e.stderr, "rollout %s already ended (%s): nothing to abort\n", doc.ID, doc.Phase)
			return r.print()
		}
		why := "aborted by an operator"
		if *reason != "" {
			why += ": " + *reason
		}
		req, _ := json.Marshal(apiv1.RolloutAbort{Reason: why, Rollback: *rollback, At: e.now().UTC()}) // plain values always encode
		if err := wait(ctx, c.mqtt.Publish(apiv1.RolloutAbortTopic(cfg.Prefix, doc.ID), 1, true, req)); err != nil {
			return fmt.Errorf("asking for the abort of rollout %s: %w", doc.ID, err)
		}
		if leaseIsFresh(doc, e.now()) {
			// The runner sees the request and stops; follow it to the end.
			return r.follow(ctx)
		}
		if doc.Phase == apiv1.RolloutAborted {
			r.doc.Strategy.Rollback = true
			for i := range r.doc.Nodes {
				if n := &r.doc.Nodes[i]; n.Changed && n.Phase != apiv1.NodeRolledBack && n.Phase != apiv1.NodeRollbackFailed {
					n.Phase, n.RequestID, n.Answer = apiv1.NodeRollingBack, "", ""
				}
			}
		}
		rollout.Abort(r.doc, why, *rollback, e.now())
		return r.run(ctx)
	}
	// resume
	if rollout.Done(doc) {
		fmt.Fprintf(e.stderr, "rollout %s already ended (%s)\n", doc.ID, doc.Phase)
		if err := r.print(); err != nil {
			return err
		}
		return rolloutOutcome(doc)
	}
	if leaseIsFresh(doc, e.now()) && !*force {
		return fmt.Errorf("rollout %s is run by %s (renewed %s ago); wait %v after its last renewal, or --force to take it over", doc.ID, doc.Runner.ID, duration.HumanDuration(e.now().Sub(doc.Runner.RenewedAt)), leaseFresh)
	}
	return r.run(ctx)
}

func leaseIsFresh(doc *apiv1.Rollout, now time.Time) bool {
	return doc.Runner.ID != "" && now.Sub(doc.Runner.RenewedAt) < leaseFresh
}

// rolloutOutcome is the exit of a rollout: 0 when every node succeeded,
// 3 while it runs (waiting for offline nodes), else 1.
func rolloutOutcome(doc *apiv1.Rollout) error {
	switch {
	case doc.Phase == apiv1.RolloutSucceeded && doc.Totals.Failed == 0:
		return nil
	case doc.Phase == apiv1.RolloutRunning:
		return rolloutWaiting{doc: doc}
	}
	return errReported
}

// rolloutWaiting: the rollout still runs (offline nodes pending); exit 3.
type rolloutWaiting struct{ doc *apiv1.Rollout }

func (w rolloutWaiting) Error() string {
	return fmt.Sprintf("queued: rollout %s still runs: %d node(s) pending, %d of them offline; `mqletctl rollout resume %s` carries it on", w.doc.ID, w.doc.Totals.Pending, w.doc.Totals.Offline, w.doc.ID)
}

// errNoRollout: nothing retained on the rollout's topic.
var errNoRollout = errors.New("no such rollout")

// readRolloutOn reads the retained document of rollout id.
func readRolloutOn(ctx context.Context, c *client, cfg *globalConfig, id string) (*apiv1.Rollout, error) {
	payload, err := c.readRetainedOne(ctx, cfg.Prefix, cfg.RetainedWait, apiv1.RolloutTopic(cfg.Prefix, id))
	if errors.Is(err, errNothingRetained) {
		return nil, errNoRollout
	} else if err != nil {
		return nil, err
	}
	return decodeRollout(payload, id)
}

func decodeRollout(payload []byte, id string) (*apiv1.Rollout, error) {
	if len(payload) > apiv1.MaxRolloutDocBytes {
		return nil, fmt.Errorf("rollout %s: document of %d bytes, over %d", id, len(payload), apiv1.MaxRolloutDocBytes)
	}
	var doc apiv1.Rollout
	if err := json.Unmarshal(payload, &doc); err != nil {
		return nil, fmt.Errorf("rollout %s: undecodable document: %w", id, err)
	}
	if doc.ID != id {
		return nil, fmt.Errorf("rollout %s: the document names rollout %q", id, bounded(doc.ID))
	}
	if err := doc.Validate(); err != nil {
		return nil, err
	}
	return &doc, nil
}

func bounded(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}

// manifestObjects names the objects of a rollout's manifests. Secrets are
// refused: they are sealed to each node's key, and what a node held
// before cannot be read back to roll it back.
func manifestObjects(manifest []byte) ([]apiv1.ObjectRef, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(manifest), 4096)
	var out []apiv1.ObjectRef
	seen := map[apiv1.ObjectRef]bool{}
	var add func(doc map[string]any) error
	add = func(doc map[string]any) error {
		kind, _ := doc["kind"].(string)
		if kind == "List" {
			items, _ := doc["items"].([]any)
			for _, it := range items {
				m, ok := it.(map[string]any)
				if !ok {
					return errors.New("rollout: a List item is not an object")
				}
				if err := add(m); err != nil {
					return err
				}
			}
			return nil
		}
		meta, _ := doc["metadata"].(map[string]any)
		name, _ := meta["name"].(string)
		ns, _ := meta["namespace"].(string)
		if ns == "" {
			ns = "default"
		}
		switch kind {
		case apiv1.KindPod, apiv1.KindConfigMap:
		case apiv1.KindSecret:
			return fmt.Errorf("rollout: Secret %s/%s: a rollout carries Pods and ConfigMaps only (a Secret is sealed to each node's key, and what a node held before cannot be read back for a rollback); apply Secrets with `apply --group` first", ns, name)
		default:
			return fmt.Errorf("rollout: kind %q: a rollout carries Pods and ConfigMaps", bounded(kind))
		}
		if name == "" {
			return fmt.Errorf("rollout: a %s without metadata.name", kind)
		}
		ref := apiv1.ObjectRef{Kind: kind, Namespace: ns, Name: name}
		if seen[ref] {
			return fmt.Errorf("rollout: %s %s/%s twice", kind, ns, name)
		}
		seen[ref] = true
		out = append(out, ref)
		return nil
	}
	for {
		var doc map[string]any
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("rollout: reading the manifests: %w", err)
		}
		if doc == nil {
			continue
		}
		if err := add(doc); err != nil {
			return nil, err
		}
	}
	if len(out) == 0 {
		return nil, errors.New("rollout: the manifests hold no object")
	}
	return out, nil
}

// runner runs one rollout on one connection: it follows the nodes'
// retained states and pod statuses, sends what internal/rollout asks for
// (each command in a goroutine of its own that reports back as events)
// and republishes the document on every change.
type runner struct {
	cfg      *globalConfig
	c        *client
	doc      *apiv1.Rollout
	e        env
	id       string
	events   chan any
	inFlight map[string]inFlight
	retryAt  map[string]time.Time
	pods     map[string]map[string]rollout.PodView // node -> ns/name
	dirty    bool
	lastPub  time.Time
	// waveGap is, per wave from the second, the time from the last node
	// of the wave before finishing to this wave's first command: the
	// rollout's own overhead between waves (printed at the end).
	waveGap map[int]time.Duration
	quit    chan struct{}
}

func newRunner(cfg *globalConfig, c *client, doc *apiv1.Rollout, e env) *runner {
	return &runner{cfg: cfg, c: c, doc: doc, e: e, id: newClientID(), events: make(chan any, 64),
		inFlight: map[string]inFlight{}, retryAt: map[string]time.Time{}, pods: map[string]map[string]rollout.PodView{}, waveGap: map[int]time.Duration{}, quit: make(chan struct{})}
}

// inFlight is a command goroutine under way for a node.
type inFlight struct {
	kind   rollout.ActionKind
	cancel context.CancelFunc
}

// Events the command goroutines report.
type (
	evPrevious struct {
		node, digest, manifest string
		absent                 []apiv1.ObjectRef
		done                   chan error
	}
	// evSent asks whether a command may go (the loop answers on ok, and
	// records it when it may: the node was not cancelled or rolled back
	// meanwhile).
	evSent struct {
		node, id string
		rollback bool
		ok       chan bool
	}
	evAccepted struct {
		node, id string
		pods     []apiv1.RolloutPod
	}
	evAnswered struct {
		node, id, msg string
		ok            bool
	}
	evDone struct {
		node string
		err  error
	}
)

// publish writes the document, retained, and waits for the broker.
func (r *runner) publish(ctx context.Context) error {
	now := r.e.now().UTC()
	r.doc.Rev++
	r.doc.UpdatedAt = now
	r.doc.Runner = apiv1.RolloutRunner{ID: r.id, RenewedAt: now}
	r.doc.Totals = rollout.Totals(r.doc)
	if err := signRollout(r.doc, r.cfg.signKey); err != nil {
		return err
	}
	b, err := json.Marshal(r.doc)
	if err != nil {
		return fmt.Errorf("encoding rollout %s: %w", r.doc.ID, err)
	}
	if len(b) > apiv1.MaxRolloutDocBytes {
		return fmt.Errorf("rollout %s: the document is %d bytes, over the %d a reader takes (too many nodes or previous manifests for one rollout: split it by selector)", r.doc.ID, len(b), apiv1.MaxRolloutDocBytes)
	}
	if err := wait(ctx, r.c.mqtt.Publish(apiv1.RolloutTopic(r.cfg.Prefix, r.doc.ID), 1, true, b)); err != nil {
		return fmt.Errorf("publishing rollout %s: %w", r.doc.ID, err)
	}
	r.dirty, r.lastPub = false, time.Now()
	return nil
}

// run runs the rollout until nothing is left to wait for, or ctx ends.
func (r *runner) run(ctx context.Context) error {
	subCtx, stop := context.WithCancel(ctx)
	defer stop()
	defer func() {
		close(r.quit)
		for _, f := range r.inFlight {
			f.cancel()
		}
	}()
	inbox := make(chan message, 256)
	docTopic := apiv1.RolloutTopic(r.cfg.Prefix, r.doc.ID)
	abortTopic := apiv1.RolloutAbortTopic(r.cfg.Prefix, r.doc.ID)
	filters := []string{abortTopic}
	for _, n := range r.doc.Nodes {
		s := apiv1.Scheme{Prefix: r.cfg.Prefix, Node: n.Node}
		filters = append(filters, s.State())
		for _, o := range r.doc.Objects {
			if o.Kind == apiv1.KindPod {
				filters = append(filters, s.Pod(o.Namespace, o.Name))
			}
		}
	}
	// Our own publications come back too; another runner's mean it was
	// taken over.
	if err := r.publish(ctx); err != nil {
		return err
	}
	for i := 0; i < len(filters); i += 100 {
		if err := r.c.subscribe(subCtx, inbox, filters[i:min(i+100, len(filters))]...); err != nil {
			return err
		}
	}
	if err := r.c.subscribe(subCtx, inbox, docTopic); err != nil {
		return err
	}
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	started := time.Now()
	for {
		if err := r.step(ctx); err != nil {
			return err
		}
		if rollout.Done(r.doc) {
			if err := r.publish(ctx); err != nil {
				return err
			}
			// The abort request did its work.
			_ = wait(ctx, r.c.mqtt.Publish(abortTopic, 1, true, []byte{}))
			fmt.Fprintf(r.e.stderr, "rollout %s: %s in %v\n", r.doc.ID, r.doc.Phase, time.Since(started).Round(time.Millisecond))
			waves := make([]int, 0, len(r.waveGap))
			for w := range r.waveGap {
				waves = append(waves, w)
			}
			sort.Ints(waves)
			for _, w := range waves {
				fmt.Fprintf(r.e.stderr, "rollout %s: wave %d sent %v after wave %d finished\n", r.doc.ID, w, r.waveGap[w].Round(time.Millisecond), w-1)
			}
			if err := r.print(); err != nil {
				return err
			}
			return rolloutOutcome(r.doc)
		}
		select {
		case m := <-inbox:
			if m.Topic == docTopic {
				if other, err := decodeRollout(m.Payload, r.doc.ID); err == nil && other.Runner.ID != r.id && other.Runner.ID != "" {
					return fmt.Errorf("rollout %s was taken over by %s; this process stops", r.doc.ID, other.Runner.ID)
				}
				continue
			}
			r.handleMessage(m, abortTopic)
		case ev := <-r.events:
			r.handleEvent(ctx, ev)
		case <-tick.C:
		case <-ctx.Done():
			// Leave the document as it is: resume carries it on.
			pubCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_ = r.publish(pubCtx)
			cancel()
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				if err := r.print(); err != nil {
					return err
				}
				if r.doc.Totals.Pending > 0 && r.doc.Totals.Pending == r.doc.Totals.Offline {
					return rolloutWaiting{doc: r.doc}
				}
				return fmt.Errorf("rollout %s: --timeout %v passed (%d node(s) pending); `mqletctl rollout resume %s` carries it on", r.doc.ID, r.cfg.Timeout, r.doc.Totals.Pending, r.doc.ID)
			}
			return ctx.Err()
		}
	}
}

// step asks internal/rollout what to do and starts it; it republishes the
// document when it changed (at most every 200 ms) or its lease is due.
func (r *runner) step(ctx context.Context) error {
	now := r.e.now()
	before := r.fingerprint()
	actions := rollout.Step(r.doc, now, func(n string) bool {
		_, busy := r.inFlight[n]
		return busy || time.Now().Before(r.retryAt[n])
	})
	// A rollback supersedes a node's apply under way; an abort stops one
	// not sent yet (it is Cancelled).
	for _, n := range r.doc.Nodes {
		if f, ok := r.inFlight[n.Node]; ok && f.kind == rollout.Send && (n.Phase == apiv1.NodeRollingBack || n.Phase == apiv1.NodeCancelled) {
			f.cancel()
		}
	}
	if r.fingerprint() != before {
		r.dirty = true
	}
	for _, a := range actions {
		cctx, cancel := context.WithCancel(ctx)
		r.inFlight[a.Node] = inFlight{kind: a.Kind, cancel: cancel}
		n := r.node(a.Node)
		switch a.Kind {
		case rollout.Send:
			go r.send(cctx, *n)
		case rollout.Rollback:
			go r.rollback(cctx, *n, r.doc.Previous[n.Previous])
		}
	}
	if r.dirty && time.Since(r.lastPub) > 200*time.Millisecond || time.Since(r.lastPub) > leaseRenew {
		return r.publish(ctx)
	}
	return nil
}

// fingerprint tells whether the document changed (its bookkeeping fields
// aside).
func (r *runner) fingerprint() string {
	d := *r.doc
	d.Rev, d.UpdatedAt, d.Runner, d.Signature = 0, time.Time{}, apiv1.RolloutRunner{}, nil
	b, _ := json.Marshal(d) // marshals a document it decoded or built
	return string(b)
}

func (r *runner) node(name string) *apiv1.RolloutNode {
	for i := range r.doc.Nodes {
		if r.doc.Nodes[i].Node == name {
			return &r.doc.Nodes[i]
		}
	}
	return nil
}

func (r *runner) handleMessage(m message, abortTopic string) {
	now := r.e.now()
	if m.Topic == abortTopic {
		var req apiv1.RolloutAbort
		if len(m.Payload) == 0 || len(m.Payload) > 4096 || json.Unmarshal(m.Payload, &req) != nil {
			return
		}
		reason := req.Reason
		if reason == "" {
			reason = "aborted by an operator"
		}
		rollout.Abort(r.doc, bounded(reason), req.Rollback, now)
		r.dirty = true
		return
	}
	node, rest, ok := fleetTopic(r.cfg.Prefix, m.Topic)
	if !ok || r.node(node) == nil {
		return
	}
	s := apiv1.Scheme{Prefix: r.cfg.Prefix, Node: node}
	if rest == "state" {
		var st apiv1.NodeState
		if len(m.Payload) == 0 || json.Unmarshal(m.Payload, &st) != nil {
			return
		}
		rollout.Online(r.doc, node, st.State == apiv1.StateOnline, st.TS, now)
		r.dirty = true
		return
	}
	ns, name, ok := s.ParsePod(m.Topic)
	if !ok {
		return
	}
	if r.pods[node] == nil {
		r.pods[node] = map[string]rollout.PodView{}
	}
	key := ns + "/" + name
	if len(m.Payload) == 0 {
		delete(r.pods[node], key)
	} else {
		var pod v1.Pod
		if json.Unmarshal(m.Payload, &pod) != nil {
			return
		}
		ready := false
		for _, c := range pod.Status.Conditions {
			if c.Type == v1.PodReady && c.Status == v1.ConditionTrue {
				ready = true
			}
		}
		r.pods[node][key] = rollout.PodView{UID: string(pod.UID), ObservedGeneration: pod.Status.ObservedGeneration, Ready: ready}
	}
	r.podsReady(node, now)
}

func (r *runner) podsReady(node string, now time.Time) {
	rollout.PodsReady(r.doc, node, func(ns, name string) (rollout.PodView, bool) {
		v, ok := r.pods[node][ns+"/"+name]
		return v, ok
	}, now)
	r.dirty = true
}

func (r *runner) handleEvent(ctx context.Context, ev any) {
	now := r.e.now()
	r.dirty = true
	switch ev := ev.(type) {
	case evPrevious:
		rollout.Previous(r.doc, ev.node, ev.digest, ev.manifest, ev.absent)
		// Kept on the broker before the node changes.
		ev.done <- r.publish(ctx)
	case evSent:
		n := r.node(ev.node)
		if n != nil && n.Phase == apiv1.NodePending && n.Wave > 1 {
			if _, seen := r.waveGap[n.Wave]; !seen {
				var last time.Time
				for _, o := range r.doc.Nodes {
					if o.Wave == n.Wave-1 && o.FinishedAt != nil && o.FinishedAt.After(last) {
						last = *o.FinishedAt
					}
				}
				if !last.IsZero() {
					r.waveGap[n.Wave] = now.Sub(last)
				}
			}
		}
		may := n != nil && (ev.rollback == (n.Phase == apiv1.NodeRollingBack)) &&
			(ev.rollback || n.Phase == apiv1.NodePending || n.Phase == apiv1.NodeSent || n.Phase == apiv1.NodeApplied)
		if may {
			rollout.Sent(r.doc, ev.node, ev.id, now)
		}
		ev.ok <- may
	case evAccepted:
		rollout.Accepted(r.doc, ev.node, ev.id, ev.pods, now)
		r.podsReady(ev.node, now)
	case evAnswered:
		rollout.Answered(r.doc, ev.node, ev.id, ev.ok, ev.msg, now)
		r.podsReady(ev.node, now)
	case evDone:
		delete(r.inFlight, ev.node)
		if ev.err != nil && !errors.Is(ev.err, context.Canceled) { // cancelled: superseded by its rollback
			if ctx.Err() == nil {
				fmt.Fprintf(r.e.stderr, "rollout %s: node %s: %v (tried again in %v)\n", r.doc.ID, ev.node, ev.err, sendRetry)
			}
			r.retryAt[ev.node] = time.Now().Add(sendRetry)
		}
	}
}

// emit hands an event to the loop, unless ctx ended or the loop did.
func (r *runner) emit(ctx context.Context, ev any) bool {
	select {
	case r.events <- ev:
		return true
	case <-ctx.Done():
		return false
	case <-r.quit:
		return false
	}
}

// send reads what the node holds of the manifest's objects (once: kept in
// the document before the node changes), then applies the manifests and
// reports its answers.
func (r *runner) send(ctx context.Context, n apiv1.RolloutNode) {
	var err error
	defer func() { r.emit(context.Background(), evDone{node: n.Node, err: err}) }()
	if !n.PreviousKnown {
		var ev evPrevious
		if ev, err = r.readPrevious(ctx, n.Node); err != nil {
			err = fmt.Errorf("reading what it holds before the rollout: %w", err)
			return
		}
		ev.done = make(chan error, 1)
		if !r.emit(ctx, ev) {
			return
		}
		select {
		case err = <-ev.done:
			if err != nil {
				return
			}
		case <-ctx.Done():
			return
		}
	}
	err = r.command(ctx, n.Node, apiv1.VerbApply, []byte(r.doc.Manifest))
}

// rollback re-applies what the node held before and deletes what it did
// not hold.
func (r *runner) rollback(ctx context.Context, n apiv1.RolloutNode, prev string) {
	var err error
	defer func() { r.emit(context.Background(), evDone{node: n.Node, err: err}) }()
	id := newRequestID()
	sent := evSent{node: n.Node, id: id, rollback: true, ok: make(chan bool, 1)}
	if !r.emit(ctx, sent) {
		return
	}
	if !<-sent.ok {
		return
	}
	msgs := []string{}
	if prev != "" {
		final, e := r.request(ctx, n.Node, apiv1.VerbApply, []byte(prev), nil)
		if err = e; err != nil {
			return
		}
		if final.Phase != apiv1.Succeeded {
			r.emit(ctx, evAnswered{node: n.Node, id: id, msg: "re-applying what it ran before: " + final.Message})
			return
		}
		msgs = append(msgs, "previous manifests re-applied")
	}
	if len(n.Absent) > 0 {
		var docs []string
		for _, o := range n.Absent {
			docs = append(docs, fmt.Sprintf("apiVersion: v1\nkind: %s\nmetadata:\n  name: %s\n  namespace: %s\n", o.Kind, o.Name, o.Namespace))
		}
		final, e := r.request(ctx, n.Node, apiv1.VerbDelete, []byte(strings.Join(docs, "---\n")), nil)
		if err = e; err != nil {
			return
		}
		if final.Phase != apiv1.Succeeded {
			r.emit(ctx, evAnswered{node: n.Node, id: id, msg: "deleting what it did not hold before: " + final.Message})
			return
		}
		msgs = append(msgs, fmt.Sprintf("%d object(s) it did not hold deleted", len(n.Absent)))
	}
	r.emit(ctx, evAnswered{node: n.Node, id: id, ok: true, msg: strings.Join(msgs, "; ")})
}

// command sends the rollout's apply to node and reports accepted and the
// final answer as events.
func (r *runner) command(ctx context.Context, node, verb string, payload []byte) error {
	id := newRequestID()
	sent := evSent{node: node, id: id, ok: make(chan bool, 1)}
	if !r.emit(ctx, sent) {
		return ctx.Err()
	}
	if !<-sent.ok {
		return nil // cancelled or rolled back meanwhile: nothing sent
	}
	final, err := r.request(ctx, node, verb, payload, func(rep apiv1.Reply) {
		if rep.Phase != apiv1.Accepted {
			return
		}
		var changes []apiv1.ChangeResult
		_ = json.Unmarshal(rep.RawResult(), &changes) // an agent without a result: no uids
		r.emit(ctx, evAccepted{node: node, id: id, pods: r.podsOf(changes)})
	})
	if err != nil {
		return err
	}
	msg := final.Message
	for _, e := range final.Errors {
		if !strings.Contains(msg, e) {
			msg += "; " + e
		}
	}
	r.emit(ctx, evAnswered{node: node, id: id, ok: final.Phase == apiv1.Succeeded, msg: oneLine(msg)})
	return nil
}

// podsOf lists the manifest's pods with the uid and generation the node
// stored them under.
func (r *runner) podsOf(changes []apiv1.ChangeResult) []apiv1.RolloutPod {
	var out []apiv1.RolloutPod
	for _, o := range r.doc.Objects {
		if o.Kind != apiv1.KindPod {
			continue
		}
		p := apiv1.RolloutPod{Namespace: o.Namespace, Name: o.Name}
		for _, c := range changes {
			if c.Kind == apiv1.KindPod && c.Key == o.Namespace+"/"+o.Name {
				p.UID, p.Generation = c.UID, c.Generation
			}
		}
		out = append(out, p)
	}
	return out
}

// request sends one command to node on the shared connection and waits
// for its final reply (however long: the node may be offline, and the
// rollout's timeouts decide), handing each reply to onReply.
func (r *runner) request(ctx context.Context, node, verb string, payload []byte, onReply func(apiv1.Reply)) (apiv1.Reply, error) {
	s := apiv1.Scheme{Prefix: r.cfg.Prefix, Node: node}
	id := newRequestID()
	sealed, err := r.cfg.sealAs(node, verb, id, payload)
	if err != nil {
		return apiv1.Reply{}, err
	}
	inbox := make(chan message, 16)
	subCtx, stop := context.WithCancel(ctx)
	defer stop()
	if err := r.c.subscribe(subCtx, inbox, s.Reply(id)); err != nil {
		return apiv1.Reply{}, err
	}
	defer r.c.mqtt.Unsubscribe(s.Reply(id))
	if err := r.c.publish(ctx, s.Command(verb, id), sealed); err != nil {
		return apiv1.Reply{}, err
	}
	var all []apiv1.Reply
	kept := 0
	for {
		select {
		case m := <-inbox:
			rep, err := apiv1.DecodeReply(m.Payload)
			if err != nil || (rep.RequestID != "" && rep.RequestID != id) {
				continue
			}
			if kept += len(m.Payload); kept > maxMemberReplyBytes {
				return apiv1.Reply{}, fmt.Errorf("replies to request %s over %d bytes", id, maxMemberReplyBytes)
			}
			all = append(all, rep)
			if onReply != nil {
				onReply(rep)
			}
			if rep.Final() {
				if verb == apiv1.VerbGet && rep.Phase == apiv1.Succeeded {
					raw := make([][]byte, 0, len(all))
					for _, a := range all {
						b, _ := json.Marshal(a) // re-encodes what was decoded
						raw = append(raw, b)
					}
					res, _, err := apiv1.Assemble(raw)
					if err != nil {
						return rep, err
					}
					rep.Result = json.RawMessage(res)
				}
				return rep, nil
			}
		case <-ctx.Done():
			return apiv1.Reply{}, ctx.Err()
		}
	}
}

// readPrevious asks node for each object of the manifests and returns
// what it holds as manifests to re-apply (digest and text) and what it
// does not hold.
func (r *runner) readPrevious(ctx context.Context, node string) (evPrevious, error) {
	ev := evPrevious{node: node}
	var docs []string
	for _, o := range r.doc.Objects {
		payload, _ := json.Marshal(apiv1.GetRequest{Kind: o.Kind, Namespace: o.Namespace, Name: o.Name}) // strings always encode
		final, err := r.request(ctx, node, apiv1.VerbGet, payload, nil)
		if err != nil {
			return ev, err
		}
		if final.Phase != apiv1.Succeeded {
			if strings.Contains(strings.ToLower(final.Message), "not found") {
				ev.absent = append(ev.absent, o)
				continue
			}
			return ev, fmt.Errorf("get %s %s/%s: %s", o.Kind, o.Namespace, o.Name, final.Message)
		}
		var res apiv1.GetResult
		if err := json.Unmarshal(final.RawResult(), &res); err != nil {
			return ev, fmt.Errorf("get %s %s/%s: undecodable result: %w", o.Kind, o.Namespace, o.Name, err)
		}
		var obj any
		switch {
		case o.Kind == apiv1.KindPod && len(res.Pods) == 1:
			obj = res.Pods[0]
		case o.Kind == apiv1.KindConfigMap && len(res.ConfigMaps) == 1:
			obj = res.ConfigMaps[0]
		}
		if obj == nil {
			ev.absent = append(ev.absent, o)
			continue
		}
		doc, err := reapplyable(o.Kind, obj)
		if err != nil {
			return ev, fmt.Errorf("%s %s/%s: %w", o.Kind, o.Namespace, o.Name, err)
		}
		docs = append(docs, doc)
	}
	if len(docs) > 0 {
		ev.manifest = strings.Join(docs, "---\n")
		ev.digest = apiv1.SHA256Hex([]byte(ev.manifest))[:16]
	}
	return ev, nil
}

// reapplyable turns an object as get returns it into a manifest that
// applies it again: its kind, name, namespace, labels and annotations (not
// its source, which the rollback's command sets) and its spec or data;
// no status, uid or server-set metadata.
func reapplyable(kind string, obj any) (string, error) {
	b, err := json.Marshal(obj)
	if err != nil {
		return "", err
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		return "", err
	}
	meta, _ := m["metadata"].(map[string]any)
	clean := map[string]any{"name": meta["name"], "namespace": meta["namespace"]}
	if l, ok := meta["labels"]; ok {
		clean["labels"] = l
	}
	if a, ok := meta["annotations"].(map[string]any); ok {
		delete(a, apiv1.AnnotationSource)
		if len(a) > 0 {
			clean["annotations"] = a
		}
	}
	out := map[string]any{"apiVersion": "v1", "kind": kind, "metadata": clean}
	for _, k := range []string{"spec", "data", "binaryData", "immutable"} {
		if v, ok := m[k]; ok {
			out[k] = v
		}
	}
	if spec, ok := out["spec"].(map[string]any); ok {
		delete(spec, "nodeName") // the node sets it
	}
	y, err := yaml.Marshal(out)
	if err != nil {
		return "", err
	}
	return string(y), nil
}

// follow prints the document as it changes until the rollout is done
// (abort of a rollout another process runs).
func (r *runner) follow(ctx context.Context) error {
	topic := apiv1.RolloutTopic(r.cfg.Prefix, r.doc.ID)
	inbox := make(chan message, 16)
	subCtx, stop := context.WithCancel(ctx)
	defer stop()
	if err := r.c.subscribe(subCtx, inbox, topic); err != nil {
		return err
	}
	for !rollout.Done(r.doc) {
		select {
		case m := <-inbox:
			if doc, err := decodeRollout(m.Payload, r.doc.ID); err == nil {
				r.doc = doc
			}
		case <-ctx.Done():
			if err := r.print(); err != nil {
				return err
			}
			return fmt.Errorf("rollout %s: the runner did not finish the abort within --timeout %v", r.doc.ID, r.cfg.Timeout)
		}
	}
	if err := r.print(); err != nil {
		return err
	}
	return rolloutOutcome(r.doc)
}

// print writes the document: as it is with -o json|yaml, else a summary
// and one row per node.
func (r *runner) print() error {
	d, w := r.doc, r.e.stdout
	if r.cfg.Output == "json" || r.cfg.Output == "yaml" {
		return printObjects(w, r.cfg.Output, d)
	}
	target := "group " + d.Target.Group
	if d.Target.Group == "" {
		target = "nodes matching " + d.Target.Selector
	}
	fmt.Fprintf(w, "Rollout %s (%s): %s", printable(d.ID), printable(target), d.Phase)
	if d.Reason != "" {
		fmt.Fprintf(w, ": %s", printable(d.Reason))
	}
	waves := 0
	for _, n := range d.Nodes {
		waves = max(waves, n.Wave)
	}
	t := d.Totals
	fmt.Fprintf(w, "\nWave %d of %d. Targeted %d, applied %d, succeeded %d, failed %d, pending %d", d.Wave, waves, t.Targeted, t.Applied, t.Succeeded, t.Failed, t.Pending)
	if t.Offline > 0 {
		fmt.Fprintf(w, " (%d offline)", t.Offline)
	}
	if t.Cancelled+t.RollingBack+t.RolledBack+t.RollbackFailed > 0 {
		fmt.Fprintf(w, ", cancelled %d, rolling back %d, rolled back %d, rollback failed %d", t.Cancelled, t.RollingBack, t.RolledBack, t.RollbackFailed)
	}
	fmt.Fprintln(w, ".")
	nodes := append([]apiv1.RolloutNode(nil), d.Nodes...)
	sort.SliceStable(nodes, func(i, j int) bool { return nodes[i].Wave < nodes[j].Wave })
	tw := tabwriter.NewWriter(w, 0, 8, 3, ' ', 0)
	fmt.Fprintln(tw, "NODE\tWAVE\tPHASE\tMESSAGE\tAGE")
	now := r.e.now()
	for _, n := range nodes {
		phase, msg := n.Phase, n.Message
		if n.OfflineSince != nil && !finishedPhase(n.Phase) {
			phase = n.Phase + " (offline since " + n.OfflineSince.UTC().Format(time.RFC3339) + ")"
		}
		age := "<unknown>"
		for _, t := range []*time.Time{n.FinishedAt, n.AcceptedAt, n.SentAt} {
			if t != nil {
				age = duration.HumanDuration(now.Sub(*t))
				break
			}
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\n", printable(n.Node), n.Wave, printable(phase), printable(oneLine(msg)), age)
	}
	return tw.Flush()
}

func finishedPhase(p string) bool {
	switch p {
	case apiv1.NodeSucceeded, apiv1.NodeFailed, apiv1.NodeCancelled, apiv1.NodeRolledBack, apiv1.NodeRollbackFailed:
		return true
	}
	return false
}

// rolloutSigned is what a document's signature covers: its JSON with the
// signature left out.
func rolloutSigned(doc *apiv1.Rollout) ([]byte, error) {
	d := *doc
	d.Signature = nil
	b, err := json.Marshal(&d)
	if err != nil {
		return nil, fmt.Errorf("encoding rollout %s: %w", doc.ID, err)
	}
	return b, nil
}

// signRollout signs the document with key (none: it stays unsigned).
func signRollout(doc *apiv1.Rollout, key ed25519.PrivateKey) error {
	doc.Signature = nil
	if key == nil {
		return nil
	}
	b, err := rolloutSigned(doc)
	if err != nil {
		return err
	}
	pub, _ := key.Public().(ed25519.PublicKey) // an ed25519 key's public half
	doc.Signature = &apiv1.RolloutSignature{KeyID: signing.KeyID(pub), Sig: ed25519.Sign(key, b)}
	return nil
}

// verifyRollout checks the document's signature against own's public key
// and the trusted public keys (base64), and returns the key id that
// signed it.
func verifyRollout(doc *apiv1.Rollout, own ed25519.PrivateKey, trusted []string) (string, error) {
	if doc.Signature == nil {
		return "", errors.New("the document is not signed")
	}
	var keys []ed25519.PublicKey
	if own != nil {
		pub, _ := own.Public().(ed25519.PublicKey) // an ed25519 key's public half
		keys = append(keys, pub)
	}
	for _, t := range trusted {
		pub, err := signing.ParsePublicKey(t)
		if err != nil {
			return "", fmt.Errorf("--trust-key: %w", err)
		}
		keys = append(keys, pub)
	}
	b, err := rolloutSigned(doc)
	if err != nil {
		return "", err
	}
	for _, k := range keys {
		id := signing.KeyID(k)
		if id == doc.Signature.KeyID {
			if !ed25519.Verify(k, b, doc.Signature.Sig) {
				return "", fmt.Errorf("the document's signature by key %s does not match its content (changed since it was signed)", id)
			}
			return id, nil
		}
	}
	return "", fmt.Errorf("the document is signed by key %s, not by a key trusted here", bounded(doc.Signature.KeyID))
}
