package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"
)

type report struct {
	StartedAt   time.Time        `json:"startedAt"`
	Host        hostInfo         `json:"host"`
	Settings    map[string]any   `json:"settings"`
	Footprint   *footprintResult `json:"footprint,omitempty"`
	RSS         *rssResult       `json:"rss,omitempty"`
	Intake      *intakeResult    `json:"intake,omitempty"`
	Burst       *burstResult     `json:"burst,omitempty"`
	PodStart    *podStartResult  `json:"podStart,omitempty"`
	Idle        *idleResult      `json:"idle,omitempty"`
	Delete      *deleteResult    `json:"delete,omitempty"`
	Exit        *exitResult      `json:"exitToStatus,omitempty"`
	Errors      []string         `json:"errors,omitempty"`
	FinishedAt  time.Time        `json:"finishedAt"`
	mqletBinary string
}

type hostInfo struct {
	CPUs       int    `json:"cpus"`
	Kernel     string `json:"kernel"`
	Mqlet      string `json:"mqletVersion"`
	Containerd string `json:"runtime"`
}

func newReport(opts options, e *env) *report {
	r := &report{StartedAt: time.Now(), mqletBinary: opts.mqlet}
	r.Host.CPUs = runtime.NumCPU()
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		r.Host.Kernel = strings.TrimSpace(string(b))
	}
	if out, err := exec.Command(opts.mqlet, "--version").Output(); err == nil {
		r.Host.Mqlet = strings.TrimSpace(string(out))
	}
	ctx, cancel := context.WithTimeout(quietCtx(context.Background()), 5*time.Second)
	defer cancel()
	if v, err := e.cri.Version(ctx, "v1"); err == nil {
		r.Host.Containerd = v.RuntimeName + " " + v.RuntimeVersion
	}
	r.Settings = map[string]any{
		"steps": opts.steps, "idleWindow": opts.duration.String(), "intakeCommands": opts.intakeN,
		"starts": opts.starts, "singleRepeats": opts.singleRepeats, "burstPods": opts.burst, "exitPods": opts.exitPods,
		"mqletConfig":      "defaults (metrics 30s, node status 1m, PLEG 1s, 4 workers) except runtime.podLogDir",
		"broker":           "mosquitto on loopback, QoS 1",
		"brokerTcpNoDelay": opts.brokerNoDelay,
		"mqletWorkers":     opts.workers,
	}
	return r
}

// fail records a failed step; a nil err records nothing.
func (r *report) fail(step string, err error) {
	if err != nil {
		r.Errors = append(r.Errors, step+": "+err.Error())
	}
}

func (r *report) write(path string) error {
	r.FinishedAt = time.Now()
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("encode report: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("make report dir: %w", err)
	}
	if err := os.WriteFile(path, append(data, '\n'), 0o644); err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	return nil
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

func lat(l latencies) string {
	if l.N == 0 {
		return "-"
	}
	return fmt.Sprintf("p50 %7.1f ms  p99 %7.1f ms  (min %.1f, max %.1f, n=%d)", l.P50Ms, l.P99Ms, l.MinMs, l.MaxMs, l.N)
}

func (r *report) print(w io.Writer) {
	p := func(format string, a ...any) { fmt.Fprintf(w, format+"\n", a...) }
	p("mqlet benchmark — %s", r.StartedAt.Format(time.RFC3339))
	p("host: %d CPUs, kernel %s; %s; runtime %s", r.Host.CPUs, r.Host.Kernel, r.Host.Mqlet, r.Host.Containerd)
	if w, _ := r.Settings["mqletWorkers"].(int); w > 0 {
		p("mqlet pods.workers: %d (sync slots)", w)
	}
	if f := r.Footprint; f != nil {
		p("\n1. Footprint")
		shipped := "stripped"
		if f.BinaryHasSymbols {
			shipped = "with symbols"
		}
		p("   binary:             %s as built (%s); %s unstripped, %s stripped", mib(f.BinaryBytes), shipped, mib(f.UnstrippedBytes), mib(f.StrippedBytes))
		p("   idle RSS, no pods:  %s (%s after online)", mib(f.IdleRSSBytes), f.IdleRSSAfter)
		p("   start → online:     median %.1f ms over %d starts (min %.1f, max %.1f)",
			f.StartToOnline.P50Ms, f.Starts, f.StartToOnline.MinMs, f.StartToOnline.MaxMs)
	}
	if rs := r.RSS; rs != nil {
		p("\n1b. Memory at rest by pods (sleeping busybox pods, %.0f s after the last started)", rs.SettleSeconds)
		for _, s := range rs.Samples {
			p("   %3d pods: RSS %s (anonymous %s, the binary's pages %s)", s.Pods, mib(s.RSSBytes), mib(s.AnonBytes), mib(s.FileBytes))
		}
	}
	if in := r.Intake; in != nil {
		p("\n2. Command intake (ConfigMap apply, QoS 1, publish → succeeded reply)")
		for _, v := range []struct {
			name string
			v    intakeVariant
		}{{"pipelined", in.Pipelined}, {"sequential", in.Sequential}} {
			p("   %-10s %4d cmds in %7.0f ms = %7.1f applies/s; %s", v.name, v.v.Commands, v.v.WallMs, v.v.CommandsPerSecond, lat(v.v.Latency))
		}
		if nd := in.NoDelay; nd != nil {
			p("   the same through a mosquitto with set_tcp_nodelay true (its default is false):")
			for _, v := range []struct {
				name string
				v    intakeVariant
			}{{"pipelined", nd.Pipelined}, {"sequential", nd.Sequential}} {
				p("   %-10s %4d cmds in %7.0f ms = %7.1f applies/s; %s", v.name, v.v.Commands, v.v.WallMs, v.v.CommandsPerSecond, lat(v.v.Latency))
			}
		}
	}
	if b := r.Burst; b != nil {
		p("\n2b. Burst (applies published without waiting, QoS 1, publish → accepted reply)")
		for _, v := range []struct {
			name string
			v    burstVariant
		}{{"configmaps", b.ConfigMaps}, {"pods", b.Pods}} {
			p("   %-10s %4d cmds published in %6.0f ms: %d accepted (%d within 5 s), %d overloaded", v.name, v.v.Commands, v.v.PublishMs, v.v.Accepted, v.v.Within5s, v.v.Overloaded)
			p("              accepted     %s", lat(v.v.Latency))
			p("              first answer %s", lat(v.v.AnswerAll))
			p("              mqlet CPU    %.0f ms", v.v.AgentCPUMs)
		}
	}
	if ps := r.PodStart; ps != nil {
		p("\n3. Pod start (apply → running)")
		p("   1 pod (x%d):  status Running  %s", ps.Single.Running.N, lat(ps.Single.Running))
		p("                 reply succeeded %s", lat(ps.Single.Reply))
		p("                 raw CRI         %s", lat(ps.Single.Raw))
		p("                 mqlet/raw       p50 x%.2f  p99 x%.2f", ps.Single.RatioP50, ps.Single.RatioP99)
		if ps.Burst.Pods > 0 {
			p("   %d pods (one List): status Running per pod %s", ps.Burst.Pods, lat(ps.Burst.Running))
			p("                 reply succeeded (all running) %.1f ms", ps.Burst.Reply.MaxMs)
			p("                 raw CRI per pod (sequential) %s; all %d: %.1f ms", lat(ps.Burst.Raw), ps.Burst.Pods, ps.Burst.RawWallMs)
			p("                 mqlet/raw       p50 x%.2f  p99 x%.2f  (mqlet: from the one apply; raw: each pod's own calls)", ps.Burst.RatioP50, ps.Burst.RatioP99)
			p("                 all %d running: mqlet %.1f ms / raw sequential %.1f ms = x%.2f", ps.Burst.Pods, ps.Burst.Running.MaxMs, ps.Burst.RawWallMs, ps.Burst.RatioAllPods)
			p("                 raw CRI per pod (%d at once)  %s; all %d: %.1f ms", ps.Burst.Pods, lat(ps.Burst.RawParallel), ps.Burst.Pods, ps.Burst.RawParallelWallMs)
			p("                 all %d running: mqlet %.1f ms / raw parallel %.1f ms = x%.2f (target <= x1.10)", ps.Burst.Pods, ps.Burst.Running.MaxMs, ps.Burst.RawParallelWallMs, ps.Burst.RatioAllPodsParallel)
			if ps.Burst.RawConfinedWallMs > 0 {
				p("                 raw CRI per pod (%d at once, confined as mqlet: seccomp RuntimeDefault, masked /proc) %s; all %d: %.1f ms", ps.Burst.Pods, lat(ps.Burst.RawConfined), ps.Burst.Pods, ps.Burst.RawConfinedWallMs)
				p("                 all %d running: mqlet %.1f ms / raw parallel confined %.1f ms = x%.2f", ps.Burst.Pods, ps.Burst.Running.MaxMs, ps.Burst.RawConfinedWallMs, ps.Burst.RatioAllPodsConfined)
			}
		}
	}
	if id := r.Idle; id != nil {
		probes := ""
		if id.Probed {
			probes = ", each with an exec liveness and an httpGet readiness probe every 10 s"
		}
		p("\n4. Idle with %d pods for %.0f s (default telemetry settings%s)", id.Pods, id.WindowSeconds, probes)
		p("   RSS:  %s at start, %s at end, %s max", mib(id.RSSStartBytes), mib(id.RSSEndBytes), mib(id.RSSMaxBytes))
		p("   CPU:  %.2f %% of one core", id.CPUPercentCore)
		p("   MQTT: %d messages, %d payload bytes → %.1f msgs/min, %.0f payload B/min (%.0f B/min with topics)",
			id.Messages, id.PayloadBytes, id.MessagesPerMin, id.BytesPerMin, id.WireBytesPerMin)
		var kinds []string
		for k, n := range id.ByKind {
			kinds = append(kinds, fmt.Sprintf("%s=%d", k, n))
		}
		p("         by kind: %s", strings.Join(slices.Sorted(slices.Values(kinds)), " "))
	}
	if d := r.Delete; d != nil {
		p("\n4b. Delete of %d running pods (one delete each, pipelined) → CRI lists none of their sandboxes ready", d.Pods)
		p("   mqlet %.1f ms / raw CRI StopPodSandbox x%d at once %.1f ms = x%.2f", d.NoneReadyMs, d.Pods, d.RawStopMs, d.Ratio)
	}
	if ex := r.Exit; ex != nil {
		p("\n5. Container exit → status Succeeded at a subscriber (%d pods, restartPolicy Never)", ex.Pods)
		p("   from CRI finishedAt (ns):          %s  (target p50 <= 550 ms)", lat(ex.Delay))
		p("   from published finishedAt (1 s):   %s", lat(ex.DelayFromStatus))
	}
	if len(r.Errors) > 0 {
		p("\nFAILED steps:")
		for _, e := range r.Errors {
			p("   %s", e)
		}
	}
}
