package main

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/mqlet/mqlet/agent/streams"
	"github.com/mqlet/mqlet/config"
	"github.com/mqlet/mqlet/internal/redact"
)

func writeConfig(t *testing.T, body string) string {
	t.Helper()
	file := filepath.Join(t.TempDir(), "mqlet.yaml")
	if err := os.WriteFile(file, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return file
}

// A bad configuration stops mqlet before it starts anything: exit 2, and
// the message names what is wrong (the key, or the file that does not parse).
func TestBadConfigExitsTwoNamingThePath(t *testing.T) {
	for _, tt := range []struct {
		name, body, want string
	}{
		{"low mark above high", "node: n1\ngc:\n  imageGCHighPercent: 70\n  imageGCLowPercent: 75\n", "gc.imageGCLowPercent"},
		{"low mark out of range", "node: n1\ngc:\n  imageGCLowPercent: 101\n", "gc.imageGCLowPercent"},
		{"request timeout", "node: n1\nruntime:\n  requestTimeout: 0s\n", "runtime.requestTimeout"},
		{"unknown key", "node: n1\ngc:\n  imageGCLowPrecent: 3\n", "imageGCLowPrecent"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			file := writeConfig(t, tt.body)
			var out, errb bytes.Buffer
			if code := run([]string{"--config", file}, &out, &errb); code != 2 {
				t.Fatalf("exit %d, want 2; stderr: %s", code, errb.String())
			}
			if !strings.Contains(errb.String(), tt.want) {
				t.Fatalf("stderr %q does not name %s", errb.String(), tt.want)
			}
		})
	}
	var out, errb bytes.Buffer
	if code := run([]string{"--config", filepath.Join(t.TempDir(), "missing.yaml")}, &out, &errb); code != 2 || !strings.Contains(errb.String(), "missing.yaml") {
		t.Fatalf("missing file: exit %d, stderr %q; want 2 naming the file", code, errb.String())
	}
	if code := run([]string{"--no-such-flag"}, &out, &errb); code != 2 {
		t.Fatalf("bad flag: exit %d, want 2", code)
	}
}

// Every policy the agent and the runtime follow comes from the
// configuration: values unlike the defaults all arrive.
func TestWiringTakesEveryPolicyFromConfig(t *testing.T) {
	dir := t.TempDir()
	file := writeConfig(t, `node: n1
stateDir: `+dir+`
mqtt: {topicPrefix: site/a, maxPayloadBytes: 4096, keepAlive: 7s, pingTimeout: 3s, reconnectMin: 2s, reconnectMax: 9s, maxInflight: 5, username: u}
runtime: {criEndpoint: "unix:///tmp/x.sock", podLogDir: /tmp/logs, cgroupRoot: /edge, requestTimeout: 17s, plegPeriod: 3s, exitEvents: false, plegPeriodWithEvents: 29s, containerLogMaxBytes: 1234, containerLogMaxFiles: 3, logRotationPeriod: 11s}
pods: {workers: 3, backoffBase: 2s, backoffMax: 40s, backoffResetAfter: 7m, applyDeadline: 3m, maxPods: 12, pidsLimit: 99}
gc: {interval: 13s, maxDeadPerContainer: 4, minDeadAge: 14s, imageGCHighPercent: 60, imageGCLowPercent: 42}
telemetry: {metricsInterval: 19s, nodeStatusInterval: 21s, podStatusResync: 23s, memoryAvailable: 50Mi, diskAvailablePercent: 7, pidAvailablePercent: 8}
requests: {maxReplyBytes: 70000, maxBacklog: 33, maxBacklogBytes: 900000, maxStreams: 7, maxFollows: 5, maxFollowsPerRequester: 2}
logs: {maxChunkBytes: 16384, unreadTimeout: 41s}
exec: {maxOutputBytes: 8192, idleTimeout: 17m, maxSessionsPerRequester: 3}
images: {pullParallelism: 3, pullTimeout: 4m, pullBackoffBase: 6s, pullBackoffMax: 60s, preloadDir: /tmp/preload, preloadInterval: 31s}
security: {requireSealedSecrets: true}
`)
	var errb bytes.Buffer
	flags, err := config.ParseFlags("mqlet", []string{"--config", file}, &errb)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(flags, noEnv)
	if err != nil {
		t.Fatal(err)
	}
	state := &nodeState{}
	defer state.close()
	opts, err := agentOptions(cfg, state)
	if err != nil {
		t.Fatal(err)
	}

	// Every field is set: a new option left unwired shows here. HostIPs
	// comes from the machine; the marks, the crash report, the events history and the live
	// settings from the opened state; LogLevel is the running logger's.
	v := reflect.ValueOf(opts)
	for i := 0; i < v.NumField(); i++ {
		name := v.Type().Field(i).Name
		switch name {
		case "HostIPs", "CommandMarks", "SyncMarks", "Crash", "EventLog", "Live", "LogLevel":
			continue
		}
		if v.Field(i).IsZero() {
			t.Errorf("agent.Options.%s is not wired from the configuration", name)
		}
	}
	s := time.Second
	for _, c := range []struct {
		what      string
		got, want any
	}{
		{"topic prefix", opts.Topics.Prefix, "site/a"},
		{"node", opts.Topics.Node, "n1"},
		{"max payload", opts.MaxPayloadBytes, 4096},
		{"workers", opts.Workers, 3},
		{"restart base", opts.Restart.Base, 2 * s},
		{"restart max", opts.Restart.Max, 40 * s},
		{"restart reset", opts.Restart.ResetAfter, 7 * time.Minute},
		{"apply deadline", opts.ApplyDeadline, 3 * time.Minute},
		{"pleg period", opts.PLEGPeriod, 3 * s},
		{"gc interval", opts.GCInterval, 13 * s},
		{"gc min age", opts.GCPolicy.MinAge, 14 * s},
		{"gc dead per container", opts.GCPolicy.MaxPerPodContainer, 4},
		{"image gc high", opts.GCPolicy.ImageGCHighThresholdPercent, 60},
		{"image gc low", opts.GCPolicy.ImageGCLowThresholdPercent, 42},
		{"status resync", opts.PodStatusResync, 23 * s},
		{"max pods", opts.MaxPods, 12},
		{"log max bytes", opts.LogRotation.MaxBytes, int64(1234)},
		{"log max files", opts.LogRotation.MaxFiles, 3},
		{"log rotation period", opts.LogRotationPeriod, 11 * s},
		{"max reply bytes", opts.MaxReplyBytes, 70000},
		{"max backlog", opts.MaxBacklog, 33},
		{"max backlog bytes", opts.MaxBacklogBytes, 900000},
		{"streams", opts.Streams, streams.Limits{Max: 7, MaxFollows: 5, MaxFollowsPerRequester: 2, MaxInteractivePerRequester: 3, Unread: 41 * s}},
		{"exec idle timeout", opts.Exec.IdleTimeout, 17 * 60 * s},
		{"mqtt keepalive", opts.Session.KeepAlive, 7 * s},
		{"mqtt ping timeout", opts.Session.PingTimeout, 3 * s},
		{"mqtt reconnect min", opts.Session.ReconnectMin, 2 * s},
		{"mqtt reconnect max", opts.Session.ReconnectMax, 9 * s},
		{"mqtt inflight", opts.Session.MaxInflight, 5},
		{"mqtt user", opts.Session.Username, "u"},
		{"metrics interval", opts.Telemetry.MetricsInterval, 19 * s},
		{"node status interval", opts.Telemetry.NodeStatusInterval, 21 * s},
		{"memory threshold", opts.Telemetry.MemoryAvailable, "50Mi"},
		{"disk threshold", opts.Telemetry.DiskAvailablePct, 7},
		{"pid threshold", opts.Telemetry.PIDAvailablePct, 8},
		{"telemetry max pods", opts.Telemetry.MaxPods, 12},
		{"preload dir", opts.Preload.Dir, "/tmp/preload"},
		{"preload interval", opts.Preload.Interval, 31 * s},
	} {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v (from the configuration)", c.what, c.got, c.want)
		}
	}

	rc := criConfig(cfg, &redact.Live{})
	for _, c := range []struct {
		what      string
		got, want any
	}{
		{"cri endpoint", rc.Endpoint, "unix:///tmp/x.sock"},
		{"pod log dir", rc.PodLogDir, "/tmp/logs"},
		{"pod dir", rc.PodDir, filepath.Join(dir, "pods")},
		{"cgroup root", rc.CgroupRoot, "/edge"},
		{"pids limit", rc.PodPidsLimit, int64(99)},
		{"request timeout", rc.RequestTimeout, 17 * s},
		{"exit events", rc.ExitEvents, false},
		{"pleg period with events", rc.EventedRelistPeriod, 29 * s},
		{"pull parallelism", rc.PullParallelism, 3},
		{"pull timeout", rc.PullTimeout, 4 * time.Minute},
		{"pull backoff base", rc.PullBackoffBase, 6 * s},
		{"pull backoff max", rc.PullBackoffMax, 60 * s},
	} {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v (from the configuration)", c.what, c.got, c.want)
		}
	}
	if rc.ScrubPod == nil {
		t.Error("the runtime gets no scrubber")
	}
}

// goMaxProcs follows the configuration unless it asks for Go's default or
// the environment already set GOMAXPROCS.
func TestGoMaxProcsFromConfig(t *testing.T) {
	noEnv := func(string) string { return "" }
	env := func(k string) string {
		if k == "GOMAXPROCS" {
			return "2"
		}
		return ""
	}
	for _, c := range []struct {
		configured int
		getenv     func(string) string
		want       int
		set        bool
	}{
		{1, noEnv, 1, true},
		{3, noEnv, 3, true},
		{0, noEnv, 0, false},
		{1, env, 0, false},
	} {
		got, set := goMaxProcs(c.configured, c.getenv)
		if got != c.want || set != c.set {
			t.Errorf("goMaxProcs(%d) = %d, %v; want %d, %v", c.configured, got, set, c.want, c.set)
		}
	}
}

// goGC follows the configuration unless it asks for Go's default or the
// environment already set GOGC.
func TestGoGCFromConfig(t *testing.T) {
	noEnv := func(string) string { return "" }
	env := func(k string) string {
		if k == "GOGC" {
			return "200"
		}
		return ""
	}
	for _, c := range []struct {
		configured int
		getenv     func(string) string
		want       int
		set        bool
	}{
		{50, noEnv, 50, true},
		{0, noEnv, 0, false},
		{50, env, 0, false},
	} {
		got, set := goGC(c.configured, c.getenv)
		if got != c.want || set != c.set {
			t.Errorf("goGC(%d) = %d, %v; want %d, %v", c.configured, got, set, c.want, c.set)
		}
	}
}

// goMemLimit follows the configuration unless it asks for no limit or the
// environment already set GOMEMLIMIT.
func TestGoMemLimitFromConfig(t *testing.T) {
	noEnv := func(string) string { return "" }
	env := func(k string) string {
		if k == "GOMEMLIMIT" {
			return "100MiB"
		}
		return ""
	}
	for _, c := range []struct {
		configured int64
		getenv     func(string) string
		want       int64
		set        bool
	}{
		{48 << 20, noEnv, 48 << 20, true},
		{0, noEnv, 0, false},
		{48 << 20, env, 0, false},
	} {
		got, set := goMemLimit(c.configured, c.getenv)
		if got != c.want || set != c.set {
			t.Errorf("goMemLimit(%d) = %d, %v; want %d, %v", c.configured, got, set, c.want, c.set)
		}
	}
}
