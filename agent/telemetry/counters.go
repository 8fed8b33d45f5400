package telemetry

import (
	"github.com/mqlet/mqlet/cri"
	"github.com/mqlet/mqlet/metrics"
	"github.com/mqlet/mqlet/mqtt/outbox"
	"github.com/mqlet/mqlet/mqtt/session"
)

// OutboxStats is the outbox's view of its queue.
type OutboxStats interface {
	Stats() outbox.Stats
}

// SessionStats is the MQTT session's view of its traffic.
type SessionStats interface {
	Stats() session.Stats
}

// GaugeCounters names the counters below (and the agent's) that are levels,
// not running totals, for metrics.Options.GaugeMetrics.
func GaugeCounters() []string {
	names := []string{"mqtt_connected", "pod_queue_depth", "pending_commands"}
	return append(names, metrics.DefaultGaugeMetrics...) // outbox_depth, outbox_bytes, queue_depth
}

// Counters merges the agent's counters (may be nil) with the outbox's and
// the session's (either may be nil) into one CounterSource.
func Counters(agent CounterSource, box OutboxStats, sess SessionStats) CounterSource {
	return func() map[string]uint64 {
		out := map[string]uint64{}
		if agent != nil {
			for k, v := range agent() {
				out[k] = v
			}
		}
		if box != nil {
			s := box.Stats()
			out["outbox_depth"] = uint64(max(s.Depth, 0))
			out["outbox_bytes"] = uint64(max(s.Bytes, 0))
			out["outbox_dropped"] = s.Dropped
			out["outbox_dropped_final_replies"] = s.DroppedFinal
			out["outbox_sent"] = s.Sent
		}
		if sess != nil {
			s := sess.Stats()
			out["mqtt_messages_in"] = s.MessagesIn
			out["mqtt_messages_out"] = s.MessagesOut
			out["mqtt_reconnects"] = s.Reconnects
			out["mqtt_connect_failures"] = s.ConnectFailures
			out["mqtt_failovers"] = s.Failovers
			var connected uint64
			if s.Connected {
				connected = 1
			}
			out["mqtt_connected"] = connected
		}
		return out
	}
}

// CRICallStats is the runtime manager's count of CRI calls by method.
type CRICallStats interface {
	CallStats() map[string]cri.CallStat
}

// CRICounters publishes src's counts as cri_calls and cri_call_errors, one
// of each per method, labelled method=<name> (see metrics.LabelledName).
func CRICounters(src CRICallStats) CounterSource {
	return func() map[string]uint64 {
		stats := src.CallStats()
		out := make(map[string]uint64, 2*len(stats))
		for method, st := range stats {
			labels := map[string]string{"method": method}
			out[metrics.LabelledName("cri_calls", labels)] = st.Calls
			out[metrics.LabelledName("cri_call_errors", labels)] = st.Errors
		}
		return out
	}
}

// Merge returns one CounterSource with the counters of all sources (nil
// ones skipped); a later source wins a name two share.
func Merge(sources ...CounterSource) CounterSource {
	return func() map[string]uint64 {
		out := map[string]uint64{}
		for _, src := range sources {
			if src == nil {
				continue
			}
			for k, v := range src() {
				out[k] = v
			}
		}
		return out
	}
}
