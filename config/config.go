// Package config loads mqlet's configuration: defaults, then one YAML file,
// then MQLET_* environment variables, then command-line flags.
package config

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"

	apiv1 "github.com/mqlet/mqlet/api/v1"
	"github.com/mqlet/mqlet/mqtt/session"
)

// Duration is a time.Duration written as a Go duration string ("30s", "2m").
type Duration struct{ time.Duration }

// UnmarshalJSON accepts "30s" style strings and, for convenience, integer seconds.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		v, err := time.ParseDuration(s)
		if err != nil {
			return fmt.Errorf("invalid duration %q: %w", s, err)
		}
		d.Duration = v
		return nil
	}
	var secs int64
	if err := json.Unmarshal(b, &secs); err != nil {
		return fmt.Errorf("invalid duration %s: want a string such as \"30s\"", string(b))
	}
	d.Duration = time.Duration(secs) * time.Second
	return nil
}

// MarshalJSON writes the duration as a Go duration string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(d.String()) }

// Config is the whole of mqlet's configuration. configs/mqlet.yaml documents
// every field with its default.
type Config struct {
	Node string `json:"node"`
	// NodeLabels are published on the node beside the kubelet's well-known
	// kubernetes.io/hostname, /os and /arch; nodeSelector and node affinity
	// are matched against them at pod admission.
	NodeLabels map[string]string `json:"nodeLabels"`
	// Groups the node is in: it takes the commands of each group's topics
	// and applies each group's desired state (docs/fleet.md).
	Groups    []string `json:"groups"`
	StateDir  string   `json:"stateDir"`
	LogLevel  string   `json:"logLevel"`
	LogFormat string   `json:"logFormat"`
	// GoMaxProcs caps the CPUs that run mqlet's Go code at once (0: Go's
	// own default); the GOMAXPROCS environment variable, when set, wins.
	GoMaxProcs int `json:"goMaxProcs"`
	// GoMemLimit is the Go runtime's soft memory limit in bytes (0: none);
	// the GOMEMLIMIT environment variable, when set, wins.
	GoMemLimit int64 `json:"goMemLimit"`
	// GoGC is the garbage collector's target percentage (GOGC; 0: Go's
	// default of 100); the GOGC environment variable, when set, wins.
	GoGC int `json:"goGC"`

	MQTT           MQTT           `json:"mqtt"`
	EmbeddedBroker EmbeddedBroker `json:"embeddedBroker"`
	Runtime        Runtime        `json:"runtime"`
	Pods           Pods           `json:"pods"`
	GC             GC             `json:"gc"`
	Admission      Admission      `json:"admission"`
	Telemetry      Telemetry      `json:"telemetry"`
	Requests       Requests       `json:"requests"`
	Security       Security       `json:"security"`
	Images         Images         `json:"images"`
	Logs           Logs           `json:"logs"`
	Exec           Exec           `json:"exec"`
	Events         Events         `json:"events"`
	Eviction       Eviction       `json:"eviction"`
}

// MQTT is the broker session.
type MQTT struct {
	Broker             string   `json:"broker"`
	Brokers            []string `json:"brokers"`
	TopicPrefix        string   `json:"topicPrefix"`
	Username           string   `json:"username"`
	PasswordFile       string   `json:"passwordFile"`
	Password           string   `json:"-"` // only from MQLET_MQTT_PASSWORD or PasswordFile
	CAFile             string   `json:"caFile"`
	CertFile           string   `json:"certFile"`
	KeyFile            string   `json:"keyFile"`
	InsecureSkipVerify bool     `json:"insecureSkipVerify"`
	KeepAlive          Duration `json:"keepAlive"`
	PingTimeout        Duration `json:"pingTimeout"`
	ReconnectMin       Duration `json:"reconnectMin"`
	ReconnectMax       Duration `json:"reconnectMax"`
	MaxInflight        int      `json:"maxInflight"`
	OutboxMaxBytes     int64    `json:"outboxMaxBytes"`
	MaxPayloadBytes    int      `json:"maxPayloadBytes"`
}

// MaxBrokers bounds mqtt.brokers.
const MaxBrokers = 16

// BrokerList is the brokers the session tries in turn: mqtt.brokers, or
// mqtt.broker as its one-element case.
func (m MQTT) BrokerList() []string {
	if len(m.Brokers) > 0 {
		return m.Brokers
	}
	return []string{m.Broker}
}

// EmbeddedBroker runs an MQTT broker inside mqlet.
type EmbeddedBroker struct {
	Enabled        bool   `json:"enabled"`
	Listen         string `json:"listen"`
	CertFile       string `json:"certFile"`
	KeyFile        string `json:"keyFile"`
	PasswordFile   string `json:"passwordFile"`
	AllowAnonymous bool   `json:"allowAnonymous"`
}

// Runtime is the CRI connection.
type Runtime struct {
	CRIEndpoint    string   `json:"criEndpoint"`
	PodLogDir      string   `json:"podLogDir"`
	CgroupRoot     string   `json:"cgroupRoot"`
	RequestTimeout Duration `json:"requestTimeout"`
	PLEGPeriod     Duration `json:"plegPeriod"`
	// ExitEvents makes the PLEG relist at each task exit the runtime
	// publishes (containerd's events service), not only every PLEGPeriod.
	ExitEvents bool `json:"exitEvents"`
	// PLEGPeriodWithEvents is the relist period while those events are
	// received (never shorter than PLEGPeriod); 0 keeps PLEGPeriod.
	PLEGPeriodWithEvents Duration `json:"plegPeriodWithEvents"`
	// ContainerLogMaxBytes rotates a container's log file beyond it (0:
	// never); ContainerLogMaxFiles are kept per container, the live one
	// included; checked every LogRotationPeriod.
	ContainerLogMaxBytes int64    `json:"containerLogMaxBytes"`
	ContainerLogMaxFiles int      `json:"containerLogMaxFiles"`
	LogRotationPeriod    Duration `json:"logRotationPeriod"`
	// Classes are the RuntimeClasses pods may name in runtimeClassName
	// (runtime_classes.go).
	Classes []RuntimeClass `json:"classes"`
}

// Pods is how pods are worked on.
type Pods struct {
	Workers           int      `json:"workers"`
	BackoffBase       Duration `json:"backoffBase"`
	BackoffMax        Duration `json:"backoffMax"`
	BackoffResetAfter Duration `json:"backoffResetAfter"`
	ApplyDeadline     Duration `json:"applyDeadline"`
	// Resync is how often every known pod is synced again without a cause
	// (jittered up to half of it), catching drift the lifecycle events
	// missed; 0 turns it off.
	Resync  Duration `json:"resync"`
	MaxPods int      `json:"maxPods"`
	// PidsLimit caps the processes of each pod (pids.max of its cgroup); 0: none.
	PidsLimit int64 `json:"pidsLimit"`
}

// GC is garbage collection of dead containers, images and pod directories.
type GC struct {
	Interval            Duration `json:"interval"`
	MaxDeadPerContainer int      `json:"maxDeadPerContainer"`
	MinDeadAge          Duration `json:"minDeadAge"`
	ImageGCHighPercent  int      `json:"imageGCHighPercent"`
	// ImageGCLowPercent is where image GC stops removing, below the high mark.
	ImageGCLowPercent int `json:"imageGCLowPercent"`
}

// Admission is the node's admission policy: pods are checked against a Pod
// Security Standards profile (privileged, baseline or restricted), chosen
// node-wide and overridable per namespace; the allow* lists waive single
// findings for the named fields only.
type Admission struct {
	Profile             string            `json:"profile"`
	Namespaces          map[string]string `json:"namespaces"`
	AllowPrivileged     bool              `json:"allowPrivileged"`
	AllowHostNetwork    bool              `json:"allowHostNetwork"`
	AllowHostPID        bool              `json:"allowHostPID"`
	AllowHostIPC        bool              `json:"allowHostIPC"`
	AllowedHostPaths    []string          `json:"allowedHostPaths"`
	AllowedCapabilities []string          `json:"allowedCapabilities"`
	// AllowedHostPorts are ports ("8080") or inclusive ranges ("30000-32767").
	AllowedHostPorts []string `json:"allowedHostPorts"`
}

// Telemetry is what is published periodically.
type Telemetry struct {
	MetricsInterval    Duration `json:"metricsInterval"`
	NodeStatusInterval Duration `json:"nodeStatusInterval"`
	PodStatusResync    Duration `json:"podStatusResync"`
	MemoryAvailable    string   `json:"memoryAvailable"`
	DiskAvailablePct   int      `json:"diskAvailablePercent"`
	PIDAvailablePct    int      `json:"pidAvailablePercent"`
}

// Requests bounds the record of handled request ids, replies and the
// commands waiting to be persisted.
type Requests struct {
	MaxRecords int      `json:"maxRecords"`
	TTL        Duration `json:"ttl"`
	// MaxRecordBytes bounds the bytes the records take.
	MaxRecordBytes int64 `json:"maxRecordBytes"`
	// MaxReplyBytes bounds one reply message; larger results go in parts.
	MaxReplyBytes int `json:"maxReplyBytes"`
	// MaxBacklog and MaxBacklogBytes bound the commands waiting to be
	// persisted; beyond them a command is answered "overloaded" at once.
	MaxBacklog      int `json:"maxBacklog"`
	MaxBacklogBytes int `json:"maxBacklogBytes"`
	// MaxStreams bounds the logs, exec and restart requests running at once.
	MaxStreams int `json:"maxStreams"`
	// MaxFollows bounds the followed logs among them (below MaxStreams, so
	// one-shot logs, exec and restart always find a slot);
	// MaxFollowsPerRequester bounds those of one signing key, and those of
	// unsigned commands together.
	MaxFollows             int `json:"maxFollows"`
	MaxFollowsPerRequester int `json:"maxFollowsPerRequester"`
}

// Default returns the configuration used when nothing overrides it.
// minGoMemLimit is the smallest goMemLimit taken: below what an idle agent
// holds, the garbage collector would run all the time.
const minGoMemLimit = 16 << 20

// Keep it in step with configs/mqlet.yaml.
func Default() Config {
	return Config{
		Node:       defaultNode(),
		StateDir:   "/var/lib/mqlet",
		LogLevel:   "info",
		LogFormat:  "auto",
		GoMaxProcs: 1,
		GoGC:       50,
		GoMemLimit: 48 << 20,
		MQTT: MQTT{
			Broker:          "tcp://127.0.0.1:1883",
			Brokers:         []string{},
			TopicPrefix:     "mqlet/v1",
			KeepAlive:       Duration{30 * time.Second},
			PingTimeout:     Duration{10 * time.Second},
			ReconnectMin:    Duration{time.Second},
			ReconnectMax:    Duration{2 * time.Minute},
			MaxInflight:     16,
			OutboxMaxBytes:  16 << 20,
			MaxPayloadBytes: 1 << 20,
		},
		EmbeddedBroker: EmbeddedBroker{Listen: "127.0.0.1:1883"},
		Runtime: Runtime{
			CRIEndpoint:          "unix:///run/containerd/containerd.sock",
			PodLogDir:            "/var/log/pods",
			CgroupRoot:           "/mqlet",
			RequestTimeout:       Duration{2 * time.Minute},
			PLEGPeriod:           Duration{time.Second},
			ExitEvents:           true,
			PLEGPeriodWithEvents: Duration{10 * time.Second},
			// The kubelet's defaults.
			ContainerLogMaxBytes: 10 << 20,
			ContainerLogMaxFiles: 5,
			LogRotationPeriod:    Duration{10 * time.Second},
			Classes:              []RuntimeClass{},
		},
		Pods: Pods{
			Workers:           4,
			BackoffBase:       Duration{10 * time.Second},
			BackoffMax:        Duration{300 * time.Second},
			BackoffResetAfter: Duration{10 * time.Minute},
			ApplyDeadline:     Duration{5 * time.Minute},
			Resync:            Duration{time.Minute},
			MaxPods:           110,
			PidsLimit:         4096,
		},
		GC: GC{
			Interval:            Duration{time.Minute},
			MaxDeadPerContainer: 1,
			MinDeadAge:          Duration{time.Minute},
			ImageGCHighPercent:  85,
			ImageGCLowPercent:   80,
		},
		Telemetry: Telemetry{
			MetricsInterval:    Duration{30 * time.Second},
			NodeStatusInterval: Duration{time.Minute},
			PodStatusResync:    Duration{5 * time.Minute},
			MemoryAvailable:    "100Mi",
			DiskAvailablePct:   10,
			PIDAvailablePct:    5,
		},
		NodeLabels: map[string]string{},
		Groups:     []string{},
		Admission: Admission{Profile: "baseline", Namespaces: map[string]string{},
			AllowedHostPaths: []string{}, AllowedCapabilities: []string{}, AllowedHostPorts: []string{}},
		Requests: Requests{MaxRecords: 1000, TTL: Duration{24 * time.Hour}, MaxRecordBytes: 8 << 20, MaxReplyBytes: 256 << 10, MaxBacklog: 5000, MaxBacklogBytes: 32 << 20, MaxStreams: 8, MaxFollows: 6, MaxFollowsPerRequester: 4},
		Security: defaultSecurity(),
		Images:   defaultImages(),
		Logs:     defaultLogs(),
		Exec:     defaultExec(),
		Events:   Events{History: 500},
		Eviction: defaultEviction(),
	}
}

// FieldError names the configuration field that is wrong and why.
type FieldError struct {
	Field  string
	Reason string
}

func (e *FieldError) Error() string { return "invalid config " + e.Field + ": " + e.Reason }

// Validate checks the configuration and returns every problem found.
func (c *Config) Validate() error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, &FieldError{Field: field, Reason: fmt.Sprintf(format, args...)})
	}
	// The same checks as the topic scheme and the session run later, so
	// whatever passes here also starts (exit 2 here, not 1 there).
	if c.Node == "" {
		bad("node", "must not be empty")
	} else if strings.ContainsAny(c.Node, "/+#$") || c.Node != strings.TrimSpace(c.Node) {
		bad("node", "%q must not contain '/', '+', '#', '$' or spaces", c.Node)
	} else if err := apiv1.ValidateNodeName(c.Node); err != nil {
		bad("node", "%v", err)
	}
	validateNodeLabels(c.NodeLabels, bad)
	if err := ValidateGroups(c.Groups); err != nil {
		bad("groups", "%v", err)
	}
	if c.StateDir == "" {
		bad("stateDir", "must not be empty")
	}
	switch c.LogLevel {
	case "trace", "debug", "info", "warn", "error":
	default:
		bad("logLevel", "%q is not one of trace, debug, info, warn, error", c.LogLevel)
	}
	if c.GoMaxProcs < 0 {
		bad("goMaxProcs", "must not be negative (0: Go's default), got %d", c.GoMaxProcs)
	}
	if c.GoGC != 0 && (c.GoGC < 10 || c.GoGC > 1000) {
		bad("goGC", "must be 0 (Go's default) or between 10 and 1000, got %d", c.GoGC)
	}
	if c.GoMemLimit != 0 && c.GoMemLimit < minGoMemLimit {
		bad("goMemLimit", "must be 0 (no limit) or at least %d bytes (16 MiB), got %d", minGoMemLimit, c.GoMemLimit)
	}
	switch c.LogFormat {
	case "auto", "json", "console":
	default:
		bad("logFormat", "%q is not one of auto, json, console", c.LogFormat)
	}
	if len(c.MQTT.Brokers) == 0 {
		if err := session.ValidateBrokerURL(c.MQTT.Broker); err != nil {
			bad("mqtt.broker", "%v", err)
		}
	} else {
		if c.MQTT.Broker != c.MQTT.Brokers[0] && c.MQTT.Broker != Default().MQTT.Broker {
			bad("mqtt.broker", "%q is not the first of mqtt.brokers (%q): give the list alone (mqtt.broker is its one-element case)", c.MQTT.Broker, c.MQTT.Brokers[0])
		}
		if len(c.MQTT.Brokers) > MaxBrokers {
			bad("mqtt.brokers", "%d brokers, at most %d", len(c.MQTT.Brokers), MaxBrokers)
		}
		seen := map[string]int{}
		for i, b := range c.MQTT.Brokers {
			field := fmt.Sprintf("mqtt.brokers[%d]", i)
			if err := session.ValidateBrokerURL(b); err != nil {
				bad(field, "%v", err)
				continue
			}
			id := session.BrokerID(b)
			if j, dup := seen[id]; dup {
				bad(field, "repeats mqtt.brokers[%d]", j)
			}
			seen[id] = i
		}
	}
	if err := apiv1.ValidatePrefix(c.MQTT.TopicPrefix); err != nil {
		bad("mqtt.topicPrefix", "%v", err)
	} else if strings.HasSuffix(c.MQTT.TopicPrefix, "/") {
		bad("mqtt.topicPrefix", "%q must not end with '/'", c.MQTT.TopicPrefix)
	}
	if (c.MQTT.CertFile == "") != (c.MQTT.KeyFile == "") {
		bad("mqtt.certFile", "certFile and keyFile must be given together")
	}
	positive := func(field string, d Duration) {
		if d.Duration <= 0 {
			bad(field, "must be a positive duration, got %s", d.Duration)
		}
	}
	positive("mqtt.keepAlive", c.MQTT.KeepAlive)
	positive("mqtt.pingTimeout", c.MQTT.PingTimeout)
	positive("mqtt.reconnectMin", c.MQTT.ReconnectMin)
	positive("mqtt.reconnectMax", c.MQTT.ReconnectMax)
	if c.MQTT.ReconnectMax.Duration < c.MQTT.ReconnectMin.Duration {
		bad("mqtt.reconnectMax", "must not be below reconnectMin")
	}
	if c.MQTT.MaxInflight < 1 {
		bad("mqtt.maxInflight", "must be at least 1")
	}
	if c.MQTT.OutboxMaxBytes < 64<<10 {
		bad("mqtt.outboxMaxBytes", "must be at least 65536")
	}
	if c.MQTT.MaxPayloadBytes < 1024 || c.MQTT.MaxPayloadBytes > 256<<20 {
		bad("mqtt.maxPayloadBytes", "must be between 1024 and 268435456")
	}
	if c.EmbeddedBroker.Enabled && c.EmbeddedBroker.Listen == "" {
		bad("embeddedBroker.listen", "must be set when the embedded broker is enabled")
	}
	if (c.EmbeddedBroker.CertFile == "") != (c.EmbeddedBroker.KeyFile == "") {
		bad("embeddedBroker.certFile", "certFile and keyFile must be given together")
	}
	if u, err := url.Parse(c.Runtime.CRIEndpoint); err != nil || (u.Scheme != "unix" && u.Scheme != "tcp" && u.Scheme != "npipe") {
		bad("runtime.criEndpoint", "%q is not an endpoint like unix:///run/containerd/containerd.sock", c.Runtime.CRIEndpoint)
	}
	if !strings.HasPrefix(c.Runtime.CgroupRoot, "/") {
		bad("runtime.cgroupRoot", "%q must be an absolute cgroup path", c.Runtime.CgroupRoot)
	}
	positive("runtime.requestTimeout", c.Runtime.RequestTimeout)
	positive("runtime.plegPeriod", c.Runtime.PLEGPeriod)
	if c.Pods.Workers < 1 || c.Pods.Workers > 64 {
		bad("pods.workers", "must be between 1 and 64, got %d", c.Pods.Workers)
	}
	positive("pods.backoffBase", c.Pods.BackoffBase)
	positive("pods.backoffMax", c.Pods.BackoffMax)
	if c.Pods.BackoffMax.Duration < c.Pods.BackoffBase.Duration {
		bad("pods.backoffMax", "must not be below backoffBase")
	}
	positive("pods.backoffResetAfter", c.Pods.BackoffResetAfter)
	positive("pods.applyDeadline", c.Pods.ApplyDeadline)
	if c.Runtime.PLEGPeriodWithEvents.Duration < 0 {
		bad("runtime.plegPeriodWithEvents", "must not be negative (0: plegPeriod), got %s", c.Runtime.PLEGPeriodWithEvents.Duration)
	}
	if c.Pods.Resync.Duration < 0 {
		bad("pods.resync", "must not be negative (0: off), got %s", c.Pods.Resync.Duration)
	}
	if c.Runtime.ContainerLogMaxBytes < 0 {
		bad("runtime.containerLogMaxBytes", "must not be negative (0: never rotate), got %d", c.Runtime.ContainerLogMaxBytes)
	}
	if c.Runtime.ContainerLogMaxFiles < 2 {
		bad("runtime.containerLogMaxFiles", "must be at least 2 (the live file and one rotated), got %d", c.Runtime.ContainerLogMaxFiles)
	}
	if c.Runtime.LogRotationPeriod.Duration <= 0 {
		bad("runtime.logRotationPeriod", "must be positive, got %s", c.Runtime.LogRotationPeriod.Duration)
	}
	validateRuntimeClasses(c.Runtime.Classes, bad)
	validateEviction(c, bad)
	if c.Pods.PidsLimit < 0 {
		bad("pods.pidsLimit", "must not be negative (0: no limit), got %d", c.Pods.PidsLimit)
	}
	if c.Pods.MaxPods < 1 {
		bad("pods.maxPods", "must be at least 1")
	}
	positive("gc.interval", c.GC.Interval)
	if c.GC.MaxDeadPerContainer < 0 {
		bad("gc.maxDeadPerContainer", "must not be negative")
	}
	if c.GC.ImageGCHighPercent < 0 || c.GC.ImageGCHighPercent > 100 {
		bad("gc.imageGCHighPercent", "must be 0 (off) to 100")
	}
	if c.GC.ImageGCLowPercent < 0 || c.GC.ImageGCLowPercent > 100 {
		bad("gc.imageGCLowPercent", "must be 0 to 100")
	} else if c.GC.ImageGCHighPercent > 0 && c.GC.ImageGCLowPercent >= c.GC.ImageGCHighPercent {
		bad("gc.imageGCLowPercent", "must be below gc.imageGCHighPercent (%d)", c.GC.ImageGCHighPercent)
	}
	if c.Telemetry.MetricsInterval.Duration < 0 {
		bad("telemetry.metricsInterval", "must not be negative (0 turns metrics off)")
	}
	positive("telemetry.nodeStatusInterval", c.Telemetry.NodeStatusInterval)
	positive("telemetry.podStatusResync", c.Telemetry.PodStatusResync)
	validateAdmission(&c.Admission, bad)
	if c.Requests.MaxRecords < 1 {
		bad("requests.maxRecords", "must be at least 1")
	}
	positive("requests.ttl", c.Requests.TTL)
	if c.Requests.MaxRecordBytes < 64<<10 {
		bad("requests.maxRecordBytes", "must be at least 65536")
	}
	if c.Requests.MaxReplyBytes < 4096 || int64(c.Requests.MaxReplyBytes) > c.MQTT.OutboxMaxBytes {
		bad("requests.maxReplyBytes", "must be between 4096 and mqtt.outboxMaxBytes (%d)", c.MQTT.OutboxMaxBytes)
	}
	if c.Requests.MaxBacklog < 1 {
		bad("requests.maxBacklog", "must be at least 1")
	}
	if c.Requests.MaxBacklogBytes < c.MQTT.MaxPayloadBytes {
		bad("requests.maxBacklogBytes", "must be at least mqtt.maxPayloadBytes (%d)", c.MQTT.MaxPayloadBytes)
	}
	c.Security.validate(bad)
	c.Images.validate(bad)
	c.validateVerbs(bad)
	return errors.Join(errs...)
}

// wellKnownNodeLabels are set by mqlet itself, from the node's name and the
// host, as the kubelet sets them.
var wellKnownNodeLabels = []string{"kubernetes.io/hostname", "kubernetes.io/os", "kubernetes.io/arch"}

// ValidateNodeLabels checks labels as the config file's nodeLabels are
// checked (the config verb changes them live).
func ValidateNodeLabels(labels map[string]string) error {
	var problems []string
	validateNodeLabels(labels, func(field, format string, args ...any) {
		problems = append(problems, field+": "+fmt.Sprintf(format, args...))
	})
	sort.Strings(problems)
	if len(problems) > 0 {
		return errors.New(strings.Join(problems, "; "))
	}
	return nil
}

func validateNodeLabels(labels map[string]string, bad func(field, format string, args ...any)) {
	for k, v := range labels {
		f := "nodeLabels[" + k + "]"
		if errs := validation.IsQualifiedName(k); len(errs) > 0 {
			bad(f, "%q is not a valid label key: %s", k, strings.Join(errs, "; "))
		}
		if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
			bad(f, "%q is not a valid label value: %s", v, strings.Join(errs, "; "))
		}
		for _, w := range wellKnownNodeLabels {
			if k == w {
				bad(f, "is set by mqlet itself (from the node name and the host)")
			}
		}
		if strings.HasPrefix(k, apiv1.GroupLabel("")) {
			bad(f, "is set by mqlet itself from the node's groups (use groups)")
		}
	}
}

func validateAdmission(a *Admission, bad func(field, format string, args ...any)) {
	validProfile := func(p string) bool { return p == "privileged" || p == "baseline" || p == "restricted" }
	if !validProfile(a.Profile) {
		bad("admission.profile", "%q is not one of privileged, baseline, restricted", a.Profile)
	}
	for ns, p := range a.Namespaces {
		if msgs := validation.IsDNS1123Label(ns); len(msgs) > 0 {
			bad("admission.namespaces", "%q is not a namespace name: %s", ns, strings.Join(msgs, "; "))
		}
		if !validProfile(p) {
			bad("admission.namespaces."+ns, "%q is not one of privileged, baseline, restricted", p)
		}
	}
	for i, p := range a.AllowedHostPaths {
		if !strings.HasPrefix(p, "/") {
			bad(fmt.Sprintf("admission.allowedHostPaths[%d]", i), "%q must be an absolute path", p)
		}
	}
	for i, r := range a.AllowedHostPorts {
		if _, _, err := ParsePortRange(r); err != nil {
			bad(fmt.Sprintf("admission.allowedHostPorts[%d]", i), "%v", err)
		}
	}
}

// ParsePortRange reads a host port ("8080") or an inclusive range
// ("30000-32767") of ports from 1 to 65535.
func ParsePortRange(s string) (first, last int32, err error) {
	lo, hi, isRange := strings.Cut(s, "-")
	if first, err = parsePort(lo); err != nil {
		return 0, 0, err
	}
	last = first
	if isRange {
		if last, err = parsePort(hi); err != nil {
			return 0, 0, err
		}
	}
	if last < first {
		return 0, 0, fmt.Errorf("%q: range ends below its start", s)
	}
	return first, last, nil
}

func parsePort(s string) (int32, error) {
	n, err := strconv.ParseInt(s, 10, 32)
	if err != nil || n < 1 || n > 65535 {
		return 0, fmt.Errorf("%q is not a port from 1 to 65535", s)
	}
	return int32(n), nil
}

func defaultNode() string {
	host, err := os.Hostname()
	if err != nil {
		return ""
	}
	return strings.ToLower(host)
}

// MaxGroups bounds how many groups a node may be in (each is two
// subscriptions and a source of desired state).
const MaxGroups = 32

// ValidateGroups checks a node's group list: valid names, none twice, at
// most MaxGroups.
func ValidateGroups(groups []string) error {
	if len(groups) > MaxGroups {
		return fmt.Errorf("%d groups, at most %d", len(groups), MaxGroups)
	}
	seen := map[string]bool{}
	for i, g := range groups {
		if err := apiv1.ValidateGroupName(g); err != nil {
			return fmt.Errorf("[%d]: %w", i, err)
		}
		if seen[g] {
			return fmt.Errorf("[%d]: group %q is given twice", i, g)
		}
		seen[g] = true
	}
	return nil
}
