// Package liveconfig holds the settings an operator may change over MQTT
// (the config verb) without a restart: a JSON merge patch of them is
// checked, persisted in the state dir (so it survives a restart) and
// signalled to the loops that read them. Settings that govern security are
// never tunable this way.
package liveconfig

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	apiv1 "github.com/mqlet/mqlet/api/v1"
	"github.com/mqlet/mqlet/config"
	"github.com/mqlet/mqlet/internal/liveperiod"
)

// tunable is one live setting: a duration within bounds, or (levels set)
// one of a few words.
type tunable struct {
	path, alias string
	min, max    time.Duration
	levels      []string // a word setting (logLevel): its allowed values
	duration    func(c *config.Config) *time.Duration
	word        func(c *config.Config) *string
	// names is a list setting (groups), carried as its names joined by
	// commas; a JSON array of strings is taken too.
	names func(c *config.Config) *[]string
	// labels is a label set (nodeLabels), carried as key=value pairs in
	// key order joined by commas; a JSON object of strings is taken too.
	// The value given is the whole set, not merged into the one before.
	labels func(c *config.Config) *map[string]string
}

func durationTunable(path, alias string, lo, hi time.Duration, f func(c *config.Config) *time.Duration) tunable {
	return tunable{path: path, alias: alias, min: lo, max: hi, duration: f}
}

// The bounds keep a remote value from making a loop spin (a PLEG relisting
// every millisecond) or go silent (a heartbeat once a year).
var tunables = []tunable{
	{path: "logLevel", alias: "logLevel", levels: []string{"trace", "debug", "info", "warn", "error"},
		word: func(c *config.Config) *string { return &c.LogLevel }},
	durationTunable("telemetry.metricsInterval", "metricsInterval", time.Second, 24*time.Hour,
		func(c *config.Config) *time.Duration { return &c.Telemetry.MetricsInterval.Duration }),
	durationTunable("telemetry.nodeStatusInterval", "nodeStatusInterval", time.Second, time.Hour,
		func(c *config.Config) *time.Duration { return &c.Telemetry.NodeStatusInterval.Duration }),
	durationTunable("telemetry.podStatusResync", "podStatusResync", 5*time.Second, 24*time.Hour,
		func(c *config.Config) *time.Duration { return &c.Telemetry.PodStatusResync.Duration }),
	durationTunable("runtime.plegPeriod", "plegPeriod", 100*time.Millisecond, time.Minute,
		func(c *config.Config) *time.Duration { return &c.Runtime.PLEGPeriod.Duration }),
	durationTunable("gc.interval", "gcInterval", 10*time.Second, 24*time.Hour,
		func(c *config.Config) *time.Duration { return &c.GC.Interval.Duration }),
	{path: "groups", alias: "groups", names: func(c *config.Config) *[]string { return &c.Groups }},
	{path: "nodeLabels", alias: "nodeLabels", labels: func(c *config.Config) *map[string]string { return &c.NodeLabels }},
}

// check parses v as t's value, returning its canonical form.
func (t tunable) check(v string) (string, error) {
	if t.labels != nil {
		labels, err := parseLabels(v)
		if err != nil {
			return "", err
		}
		if err := config.ValidateNodeLabels(labels); err != nil {
			return "", err
		}
		return joinLabels(labels), nil
	}
	if t.names != nil {
		names := splitNames(v)
		if err := config.ValidateGroups(names); err != nil {
			return "", err
		}
		slices.Sort(names)
		return strings.Join(names, ","), nil
	}
	if t.levels != nil {
		if slices.Contains(t.levels, v) {
			return v, nil
		}
		return "", fmt.Errorf("%q is not one of %s", v, strings.Join(t.levels, ", "))
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < t.min || d > t.max {
		return "", fmt.Errorf("%q is not a duration from %s to %s", v, t.min, t.max)
	}
	return d.String(), nil
}

// apply sets t in c to v (a value check accepted).
func (t tunable) apply(c *config.Config, v string) {
	if t.labels != nil {
		labels, _ := parseLabels(v)
		*t.labels(c) = labels
		return
	}
	if t.names != nil {
		*t.names(c) = splitNames(v)
		return
	}
	if t.word != nil {
		*t.word(c) = v
		return
	}
	d, _ := time.ParseDuration(v)
	*t.duration(c) = d
}

// value is t's value in c, in canonical form.
func (t tunable) value(c *config.Config) string {
	if t.labels != nil {
		return joinLabels(*t.labels(c))
	}
	if t.names != nil {
		names := slices.Clone(*t.names(c))
		slices.Sort(names)
		return strings.Join(names, ",")
	}
	if t.word != nil {
		return *t.word(c)
	}
	return t.duration(c).String()
}

// splitNames reads a list setting's value ("a,b"; "" is none).
func splitNames(v string) []string {
	names := []string{}
	for _, n := range strings.Split(v, ",") {
		if n = strings.TrimSpace(n); n != "" {
			names = append(names, n)
		}
	}
	return names
}

// parseLabels reads a label set's value ("k=v,k2=v2"; "" is none).
func parseLabels(v string) (map[string]string, error) {
	labels := map[string]string{}
	for _, kv := range strings.Split(v, ",") {
		if kv = strings.TrimSpace(kv); kv == "" {
			continue
		}
		k, val, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("%q is not key=value", kv)
		}
		if _, dup := labels[k]; dup {
			return nil, fmt.Errorf("label %q given twice", k)
		}
		labels[k] = val
	}
	return labels, nil
}

// joinLabels is a label set's canonical value: key=value in key order.
func joinLabels(labels map[string]string) string {
	keys := make([]string, 0, len(labels))
	for k := range labels {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for i, k := range keys {
		keys[i] = k + "=" + labels[k]
	}
	return strings.Join(keys, ",")
}

// NodeLabels are the node's live configured labels (nodeLabels).
func (s *Settings) NodeLabels() map[string]string {
	t, _ := lookup("nodeLabels")
	s.mu.Lock()
	defer s.mu.Unlock()
	labels, _ := parseLabels(s.valueLocked(t))
	return labels
}

// Groups is the live list of the node's groups.
func (s *Settings) Groups() []string {
	t, _ := lookup("groups")
	s.mu.Lock()
	defer s.mu.Unlock()
	return splitNames(s.valueLocked(t))
}

// securityPrefixes are the settings that govern security: never tunable
// over MQTT, whatever else becomes tunable.
var securityPrefixes = []string{"admission", "exec", "mqtt", "security", "embeddedBroker", "images", "stateDir", "runtime"}

// FileName is the file in the state dir holding the remote settings.
const FileName = "config-remote.json"

// Settings are the live settings.
type Settings struct {
	base    config.Config     // as loaded from defaults, file, env and flags
	sources map[string]string // where base's settings came from
	file    string

	mu      sync.Mutex
	remote  map[string]string // path → value set over MQTT (canonical form)
	changed chan struct{}     // closed and replaced at each change
	started map[string]string // effective values at start
}

// Open reads the remote settings persisted in stateDir over cfg (the
// loaded configuration, with sources from config.Sources). Entries that
// are no longer tunable or valid are dropped and reported.
func Open(cfg *config.Config, sources map[string]string, stateDir string) (*Settings, []string, error) {
	s := &Settings{base: *cfg, sources: sources, file: filepath.Join(stateDir, FileName),
		remote: map[string]string{}, changed: make(chan struct{}), started: map[string]string{}}
	var dropped []string
	data, err := os.ReadFile(s.file)
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return nil, nil, fmt.Errorf("reading remote settings: %w", err)
	default:
		var saved map[string]string
		if err := json.Unmarshal(data, &saved); err != nil {
			return nil, nil, fmt.Errorf("reading remote settings %s: %w", s.file, err)
		}
		for path, v := range saved {
			t, ok := lookup(path)
			if !ok {
				dropped = append(dropped, path)
				continue
			}
			canon, err := t.check(v)
			if err != nil {
				dropped = append(dropped, path)
				continue
			}
			s.remote[t.path] = canon
		}
	}
	for _, t := range tunables {
		s.started[t.path] = s.valueLocked(t)
	}
	sort.Strings(dropped)
	return s, dropped, nil
}

func lookup(key string) (tunable, bool) {
	for _, t := range tunables {
		if key == t.path || key == t.alias {
			return t, true
		}
	}
	return tunable{}, false
}

// Effective returns cfg with the remote settings applied: what mqlet runs with.
func (s *Settings) Effective() config.Config {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.base
	for _, t := range tunables {
		t.apply(&c, s.valueLocked(t))
	}
	return c
}

// Duration is the live value of a tunable duration (by path or alias); 0
// for an unknown one.
func (s *Settings) Duration(key string) time.Duration {
	t, ok := lookup(key)
	if !ok || t.duration == nil {
		return 0
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	d, _ := time.ParseDuration(s.valueLocked(t))
	return d
}

// LogLevel is the live log level ("info").
func (s *Settings) LogLevel() string {
	t, _ := lookup("logLevel")
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.valueLocked(t)
}

// Period is the live period of a tunable duration, for a loop to follow.
func (s *Settings) Period(key string) liveperiod.Source {
	return liveperiod.Source{Period: func() time.Duration { return s.Duration(key) }, Changes: s.Changes}
}

func (s *Settings) valueLocked(t tunable) string {
	if v, ok := s.remote[t.path]; ok {
		return v
	}
	c := s.base
	return t.value(&c)
}

// Changes returns a channel closed at the next change.
func (s *Settings) Changes() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.changed
}

// Patch applies a JSON merge patch of tunable settings: keys by path
// ("telemetry.metricsInterval"), by name ("metricsInterval") or nested
// objects; null resets a setting to the file's value. Nothing is applied
// unless every key is tunable and every value valid. It returns the paths
// changed.
func (s *Settings) Patch(raw []byte) ([]string, error) {
	var doc map[string]any
	if err := json.Unmarshal(raw, &doc); err != nil || doc == nil {
		return nil, errors.New("config: the payload must be a JSON object of settings (a merge patch)")
	}
	flat := map[string]any{}
	flatten(doc, "", flat)
	if len(flat) == 0 {
		return nil, errors.New("config: no setting given")
	}
	keys := make([]string, 0, len(flat))
	for k := range flat {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	next := map[string]*string{}
	var problems []string
	for _, k := range keys {
		t, ok := lookup(k)
		if !ok {
			problems = append(problems, refusal(k))
			continue
		}
		switch v := flat[k].(type) {
		case nil:
			next[t.path] = nil
		case string:
			canon, err := t.check(v)
			if err != nil {
				problems = append(problems, k+": "+err.Error())
				continue
			}
			if s.started[t.path] == "0s" && t.path == "telemetry.metricsInterval" {
				problems = append(problems, k+": metrics are off in mqlet's config file (0); turning them on takes a restart")
				continue
			}
			next[t.path] = &canon
		case map[string]any:
			if t.labels == nil {
				problems = append(problems, fmt.Sprintf("%s: want a string, or null", k))
				continue
			}
			labels := map[string]string{}
			for lk, lv := range v {
				s, ok := lv.(string)
				if !ok || strings.ContainsAny(lk, ",=") || strings.Contains(s, ",") {
					problems = append(problems, fmt.Sprintf("%s: want an object of label values (strings)", k))
					break
				}
				labels[lk] = s
			}
			if len(labels) != len(v) {
				continue
			}
			canon, err := t.check(joinLabels(labels))
			if err != nil {
				problems = append(problems, k+": "+err.Error())
				continue
			}
			next[t.path] = &canon
		case []any:
			if t.names == nil {
				problems = append(problems, fmt.Sprintf("%s: want a string, or null", k))
				continue
			}
			list := make([]string, 0, len(v))
			for _, e := range v {
				n, ok := e.(string)
				if !ok || strings.Contains(n, ",") {
					problems = append(problems, fmt.Sprintf("%s: want an array of names", k))
					break
				}
				list = append(list, n)
			}
			if len(list) != len(v) {
				continue
			}
			canon, err := t.check(strings.Join(list, ","))
			if err != nil {
				problems = append(problems, k+": "+err.Error())
				continue
			}
			next[t.path] = &canon
		default:
			if t.labels != nil {
				problems = append(problems, fmt.Sprintf("%s: want an object of labels or a \"k=v,k2=v2\" string, or null", k))
			} else if t.names != nil {
				problems = append(problems, fmt.Sprintf("%s: want an array of names or a comma-separated string, or null", k))
			} else if t.levels != nil {
				problems = append(problems, fmt.Sprintf("%s: want one of %s as a string, or null", k, strings.Join(t.levels, ", ")))
			} else {
				problems = append(problems, fmt.Sprintf("%s: want a duration string such as \"30s\", or null", k))
			}
		}
	}
	if len(problems) > 0 {
		return nil, fmt.Errorf("config: nothing changed: %s", strings.Join(problems, "; "))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	remote := make(map[string]string, len(s.remote))
	for k, v := range s.remote {
		remote[k] = v
	}
	var changed []string
	for path, v := range next {
		if v == nil {
			delete(remote, path)
		} else {
			remote[path] = *v
		}
		changed = append(changed, path)
	}
	if err := s.save(remote); err != nil {
		return nil, err
	}
	s.remote = remote
	close(s.changed)
	s.changed = make(chan struct{})
	sort.Strings(changed)
	return changed, nil
}

func refusal(k string) string {
	for _, p := range securityPrefixes {
		if k == p || strings.HasPrefix(k, p+".") {
			return k + ": governs security or the node's identity; not tunable over MQTT (change mqlet's config file)"
		}
	}
	names := make([]string, 0, len(tunables))
	for _, t := range tunables {
		names = append(names, t.alias)
	}
	return fmt.Sprintf("%s: not tunable over MQTT (tunable: %s)", k, strings.Join(names, ", "))
}

func flatten(doc map[string]any, prefix string, out map[string]any) {
	for k, v := range doc {
		p := k
		if prefix != "" {
			p = prefix + "." + k
		}
		if m, ok := v.(map[string]any); ok {
			if t, ok := lookup(p); !ok || t.labels == nil {
				flatten(m, p, out)
				continue
			}
			// A label set is one setting: its keys hold dots.
		}
		out[p] = v
	}
}

// save writes remote atomically (a crash leaves the old file or the new).
func (s *Settings) save(remote map[string]string) error {
	data, err := json.MarshalIndent(remote, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding remote settings: %w", err)
	}
	tmp := s.file + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("saving remote settings: %w", err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("saving remote settings: %w", err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("saving remote settings: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("saving remote settings: %w", err)
	}
	if err := os.Rename(tmp, s.file); err != nil {
		return fmt.Errorf("saving remote settings: %w", err)
	}
	return nil
}

// Hidden is the value the view shows for a setting it does not reveal.
const Hidden = `"<hidden>"`

// hiddenSettings are not revealed by the view (any broker login may read
// it): who the node logs in as, where its credentials and keys lie, which
// host paths a pod may mount and which keys and registries it trusts.
// Every setting whose name ends in "File" is hidden as well.
var hiddenSettings = map[string]bool{
	"mqtt.username":              true,
	"admission.allowedHostPaths": true,
	"security.trustedKeys":       true,
	"images.allowedRegistries":   true,
}

func hidden(path string) bool {
	return hiddenSettings[path] || strings.HasSuffix(path, "File")
}

// View is the effective configuration, each setting with its source;
// hidden settings show Hidden in place of their value.
func (s *Settings) View() (apiv1.ConfigView, error) {
	eff := s.Effective()
	leaves, err := eff.Leaves()
	if err != nil {
		return apiv1.ConfigView{}, fmt.Errorf("listing settings: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	view := apiv1.ConfigView{Settings: make(map[string]apiv1.ConfigValue, len(leaves))}
	for path, v := range leaves {
		src := s.sources[path]
		if src == "" {
			src = apiv1.SourceDefault
		}
		if _, ok := s.remote[path]; ok {
			src = apiv1.SourceRemote
		}
		if hidden(path) {
			v = json.RawMessage(Hidden)
		}
		view.Settings[path] = apiv1.ConfigValue{Value: v, Source: src}
	}
	return view, nil
}

// Every runs fn each period of the tunable key until done closes,
// picking up a new period as soon as it is set.
func (s *Settings) Every(ctx context.Context, key string, fn func()) {
	s.Period(key).Every(ctx, fn)
}
