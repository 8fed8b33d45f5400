package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"sigs.k8s.io/yaml"

	apiv1 "github.com/mqlet/mqlet/api/v1"
)

func runApply(ctx context.Context, cfg *globalConfig, args []string, e env) error {
	return runManifestVerb(ctx, cfg, "apply", args, e)
}

func runSync(ctx context.Context, cfg *globalConfig, args []string, e env) error {
	return runManifestVerb(ctx, cfg, "sync", args, e)
}

// runManifestVerb runs apply or sync: both send a manifest file as is.
func runManifestVerb(ctx context.Context, cfg *globalConfig, verb string, args []string, e env) error {
	fs := newFlagSet(verb, cfg)
	var files fileList
	fs.Var(&files, "f", "manifest `FILE` or directory (YAML or JSON; - for stdin; repeatable)")
	fs.Var(&files, "filename", "same as -f")
	noWait := fs.Bool("no-wait", false, "return once the agent accepted (stored) the request")
	sealTo := fs.String("seal-to", "", "seal Secrets to these sealing keys (age1..., comma-separated, as nodes' states show them) instead of the one the node's retained state publishes")
	unsealed := fs.Bool("unsealed", false, "send Secrets in clear (readable by every subscriber of the broker)")
	cfg.registerOutput(fs, "json (one reply per line)")
	fleet := registerFleet(fs, cfg)
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usageError{fmt.Errorf("%s: unexpected arguments %q (use -f FILE)", verb, pos)}
	}
	if *unsealed && *sealTo != "" {
		return usageError{fmt.Errorf("%s: --unsealed and --seal-to exclude each other", verb)}
	}
	if len(files) == 0 {
		return usageError{fmt.Errorf("%s: -f FILE (or -f - for stdin) is required", verb)}
	}
	if err := cfg.checkOutput("json"); err != nil {
		return err
	}
	if fleet.active() {
		if *noWait {
			return usageError{fmt.Errorf("%s: --no-wait is for one node (a fleet command waits for every online member)", verb)}
		}
		if err := fleet.check(cfg, verb); err != nil {
			return err
		}
		payload, err := readManifests(files, e.stdin)
		if err != nil {
			return err
		}
		if *unsealed {
			return runFleetVerb(ctx, cfg, fleet, verb, payload, nil, e)
		}
		return runFleetVerb(ctx, cfg, fleet, verb, payload, sealTo, e)
	}
	if err := cfg.resolve(); err != nil {
		return err
	}
	payload, err := readManifests(files, e.stdin)
	if err != nil {
		return err
	}
	if !*unsealed {
		if payload, err = sealSecrets(ctx, cfg, payload, *sealTo); err != nil {
			return err
		}
	}
	return sendAndWait(ctx, cfg, verb, payload, *noWait, e)
}

func runDelete(ctx context.Context, cfg *globalConfig, args []string, e env) error {
	fs := newFlagSet("delete", cfg)
	var files fileList
	fs.Var(&files, "f", "manifest `FILE` or directory naming what to delete (- for stdin; repeatable)")
	fs.Var(&files, "filename", "same as -f")
	ns := namespaceFlag(fs, "namespace of KIND NAME (default: default)")
	grace := fs.Int64("grace-period", -1, "seconds the containers get to stop (only with KIND NAME; -1: the pod's own)")
	noWait := fs.Bool("no-wait", false, "return once the agent accepted the request")
	force := fs.Bool("force", false, "delete node: clear its retained topics even while it is online")
	cfg.registerOutput(fs, "json (one reply per line)")
	fleet := registerFleet(fs, cfg)
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	if len(pos) == 2 && isNodeKind(pos[0]) && len(files) == 0 {
		if fleet.active() {
			return usageError{errors.New("delete node: --group and -L do not apply (it names one node)")}
		}
		return decommission(ctx, cfg, pos[1], *force, e)
	}
	// resolve is the fleet's check with --group or -L.
	resolve := cfg.resolve
	if fleet.active() {
		if *noWait {
			return usageError{errors.New("delete: --no-wait is for one node (a fleet command waits for every online member)")}
		}
		resolve = func() error { return fleet.check(cfg, "delete") }
	}
	if *force {
		return usageError{errNodeFlag}
	}
	if err := cfg.checkOutput("json"); err != nil {
		return err
	}
	var payload []byte
	switch {
	case len(files) > 0 && len(pos) > 0:
		return usageError{errors.New("delete: give either -f FILE or KIND NAME, not both")}
	case len(files) > 0:
		if *grace >= 0 {
			return usageError{errors.New("delete: --grace-period works only with KIND NAME (the agent takes it from the short form)")}
		}
		if err := resolve(); err != nil {
			return err
		}
		if payload, err = readManifests(files, e.stdin); err != nil {
			return err
		}
	case len(pos) == 2:
		kind, ok := canonicalKind(pos[0])
		if !ok {
			return usageError{fmt.Errorf("delete: unknown kind %q (pod, configmap, secret, node)", pos[0])}
		}
		args := map[string]any{"kind": kind, "name": pos[1]}
		if *ns != "" {
			args["namespace"] = *ns
		}
		if *grace >= 0 {
			if kind != "Pod" {
				return usageError{errors.New("delete: --grace-period applies to pods only")}
			}
			args["gracePeriodSeconds"] = *grace
		}
		if err := resolve(); err != nil {
			return err
		}
		payload, _ = json.Marshal(args) // strings and an int64 always encode
	default:
		return usageError{errors.New("delete: want -f FILE or KIND NAME (e.g. `delete pod web -n default`)")}
	}
	if fleet.active() {
		return runFleetVerb(ctx, cfg, fleet, "delete", payload, nil, e)
	}
	return sendAndWait(ctx, cfg, "delete", payload, *noWait, e)
}

// fileList is a repeatable -f.
type fileList []string

func (f *fileList) String() string     { return strings.Join(*f, ",") }
func (f *fileList) Set(v string) error { *f = append(*f, v); return nil }

// readManifests reads every -f: files as they are, a directory's *.yaml,
// *.yml and *.json files in name order (not its subdirectories, as kubectl
// without -R), stdin for "-". They become one multi-document payload, so
// the agent answers for all of them at once.
func readManifests(paths []string, stdin io.Reader) ([]byte, error) {
	var docs [][]byte
	for _, p := range paths {
		files := []string{p}
		if p != "-" {
			if st, err := os.Stat(p); err == nil && st.IsDir() {
				entries, err := os.ReadDir(p)
				if err != nil {
					return nil, fmt.Errorf("reading manifest directory %s: %w", p, err)
				}
				files = files[:0]
				for _, en := range entries {
					ext := strings.ToLower(filepath.Ext(en.Name()))
					if !en.IsDir() && (ext == ".yaml" || ext == ".yml" || ext == ".json") {
						files = append(files, filepath.Join(p, en.Name()))
					}
				}
				if len(files) == 0 {
					return nil, fmt.Errorf("manifest directory %s has no .yaml, .yml or .json file", p)
				}
			}
		}
		for _, f := range files {
			data, err := readManifest(f, stdin)
			if err != nil {
				return nil, err
			}
			docs = append(docs, data)
		}
	}
	if len(docs) == 1 {
		return docs[0], nil
	}
	var b bytes.Buffer
	for i, d := range docs {
		d = bytes.TrimSpace(d)
		// The agent reads a payload that starts with '{' as one JSON value;
		// several documents travel as YAML.
		if len(d) > 0 && (d[0] == '{' || d[0] == '[') {
			y, err := yaml.JSONToYAML(d)
			if err != nil {
				return nil, fmt.Errorf("manifest %d of %d: %w", i+1, len(docs), err)
			}
			d = bytes.TrimSpace(y)
		}
		if i > 0 {
			b.WriteString("\n---\n")
		}
		b.Write(d)
	}
	b.WriteString("\n")
	return b.Bytes(), nil
}

// readManifest reads a manifest file, or stdin for "-".
func readManifest(path string, stdin io.Reader) ([]byte, error) {
	var data []byte
	var err error
	if path == "-" {
		data, err = io.ReadAll(stdin)
	} else {
		data, err = os.ReadFile(path)
	}
	if err != nil {
		return nil, fmt.Errorf("reading manifest %s: %w", path, err)
	}
	if strings.TrimSpace(string(data)) == "" {
		return nil, fmt.Errorf("manifest %s is empty", path)
	}
	return data, nil
}

// sendAndWait publishes one command and prints each reply as it arrives,
// until a final one (or accepted, with noWait). A failed reply prints its
// message and errors and makes the command fail.
func sendAndWait(ctx context.Context, cfg *globalConfig, verb string, payload []byte, noWait bool, e env) error {
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	c, err := dial(ctx, cfg)
	if err != nil {
		return err
	}
	defer c.close()
	var failed bool
	var printErr error
	_, err = c.request(ctx, verb, payload, func(r apiv1.Reply) bool {
		if r.Phase == apiv1.Failed {
			failed = true
		}
		if cfg.Output == "json" {
			printErr = printJSONLine(e.stdout, r)
		} else {
			printReply(e, r)
		}
		return noWait && r.Phase == apiv1.Accepted
	})
	if err != nil {
		return err
	}
	if printErr != nil {
		return fmt.Errorf("printing reply: %w", printErr)
	}
	if failed {
		return errReported
	}
	return nil
}

// printReply writes one reply as text: progress to stdout, a failure with
// its error list to stderr.
func printReply(e env, r apiv1.Reply) {
	w := e.stdout
	if r.Phase == apiv1.Failed {
		w = e.stderr
	}
	line := fmt.Sprintf("%-11s %s", r.Phase, r.Message)
	if r.Message == "" {
		line = r.Phase
	}
	fmt.Fprintf(w, "%s\n", strings.TrimRight(line, " "))
	// The agent's message sums the errors up; one it already says is not
	// printed again.
	for _, msg := range r.Errors {
		if !strings.Contains(r.Message, msg) {
			fmt.Fprintf(w, "  - %s\n", msg)
		}
	}
}

func printJSONLine(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}
