package e2e

import (
	"encoding/json"
	"fmt"
	apiv1 "github.com/mqlet/mqlet/api/v1"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// probeServer answers the httpGet readiness probes of the cost test: 503
// until flipped, then 200, recording when each pod's probe arrived.
type probeServer struct {
	mu       sync.Mutex
	ok       bool
	arrivals map[string][]time.Time
	firstOK  map[string]time.Time
}

func (s *probeServer) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	pod := strings.TrimPrefix(r.URL.Path, "/r/")
	now := time.Now()
	s.mu.Lock()
	s.arrivals[pod] = append(s.arrivals[pod], now)
	ok := s.ok
	if ok {
		if _, seen := s.firstOK[pod]; !seen {
			s.firstOK[pod] = now
		}
	}
	s.mu.Unlock()
	if !ok {
		rw.WriteHeader(http.StatusServiceUnavailable)
	}
}

// cpuTicks is utime+stime of a process, in clock ticks.
func cpuTicks(t *testing.T, pid int) int64 {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	// Fields after the parenthesised command name; utime and stime are 14 and 15.
	fields := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+2:]))
	u, _ := strconv.ParseInt(fields[11], 10, 64)
	s, _ := strconv.ParseInt(fields[12], 10, 64)
	return u + s
}

// What 20 pods, each with an exec liveness probe and an httpGet readiness
// probe at periodSeconds 10, cost mqlet; how far apart a probe's checks
// are against its period; how long from the first passing readiness check
// to Ready=True at a subscriber. The readiness probes ask this test's
// server (httpGet host 127.0.0.1, allowed by the privileged profile), so
// their arrival times are seen where they land.
func TestProbeCostTwentyPods(t *testing.T) {
	// mqlet's defaults (a 1 s relist, metrics every 30 s, …), as a gateway
	// runs: the cost is the operator's, not the test config's.
	e := startPodEnv(t, func(logDir string) string {
		return fmt.Sprintf("runtime:\n  podLogDir: %s\nadmission:\n  profile: privileged\n", logDir)
	})
	srv := &probeServer{arrivals: map[string][]time.Time{}, firstOK: map[string]time.Time{}}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: srv}
	go func() { _ = hs.Serve(l) }()
	t.Cleanup(func() { _ = hs.Close() })
	port := l.Addr().(*net.TCPAddr).Port

	const n = 20
	items := make([]json.RawMessage, 0, n)
	for i := range n {
		name := fmt.Sprintf("p%02d", i)
		j, err := yaml.YAMLToJSON(e.probePod(name, "Always", "exec sleep 3600", fmt.Sprintf(`    livenessProbe:
      exec:
        command: ["true"]
      periodSeconds: 10
    readinessProbe:
      httpGet:
        host: 127.0.0.1
        port: %d
        path: /r/%s
      periodSeconds: 10
`, port, name)))
		if err != nil {
			t.Fatal(err)
		}
		items = append(items, j)
	}
	list, _ := json.Marshal(map[string]any{"apiVersion": "v1", "kind": "List", "items": items})
	t.Cleanup(func() {
		if !e.agent.Running() {
			return
		}
		id := e.nextID("sync")
		e.mq.Command(e.node, "sync", id, []byte(`{"apiVersion":"v1","kind":"List","items":[]}`))
		e.waitFinal(id, apiv1.Succeeded, 3*time.Minute)
		Eventually(t, 60*time.Second, "every pod gone", func() bool { return e.nsContainers(false) == 0 })
	})
	id := e.nextID("apply")
	e.mq.Command(e.node, "apply", id, list)
	e.mq.WaitReply(e.node, id, apiv1.Accepted, 60*time.Second)
	for i := range n {
		e.waitStatus(fmt.Sprintf("p%02d", i), 5*time.Minute, "running, not ready", func(p *v1.Pod) bool {
			cs, ok := containerStatus(p, "main", false)
			return ok && cs.State.Running != nil && !cs.Ready && podCondition(p, v1.PodReady) == v1.ConditionFalse
		})
	}
	// Every pod has been probed (and refused) at least once.
	Eventually(t, 60*time.Second, "a readiness check of every pod", func() bool {
		srv.mu.Lock()
		defer srv.mu.Unlock()
		return len(srv.arrivals) == n
	})

	srv.mu.Lock()
	srv.ok = true
	srv.mu.Unlock()
	var delays []time.Duration
	for i := range n {
		name := fmt.Sprintf("p%02d", i)
		e.waitStatus(name, 60*time.Second, "Ready", func(p *v1.Pod) bool { return podCondition(p, v1.PodReady) == v1.ConditionTrue })
		// The first message saying Ready, against the check that passed.
		for _, m := range e.mq.Messages() {
			if m.Topic != e.podTopic(name) || len(m.Payload) == 0 {
				continue
			}
			var p v1.Pod
			if json.Unmarshal(m.Payload, &p) == nil && podCondition(&p, v1.PodReady) == v1.ConditionTrue {
				srv.mu.Lock()
				delays = append(delays, m.At.Sub(srv.firstOK[name]))
				srv.mu.Unlock()
				break
			}
		}
	}

	// Steady state: 60 s of probing.
	pid := e.agent.cmd.Process.Pid
	const window = 60 * time.Second
	winStart := time.Now()
	before := cpuTicks(t, pid)
	Eventually(t, 2*window, "the measurement window", func() bool { return time.Since(winStart) >= window })
	used := float64(cpuTicks(t, pid)-before) / 100 // USER_HZ is 100 on Linux
	cpu := used / time.Since(winStart).Seconds() * 100

	var jitter []time.Duration
	srv.mu.Lock()
	for _, at := range srv.arrivals {
		for k := 1; k < len(at); k++ {
			d := at[k].Sub(at[k-1]) - 10*time.Second
			if d < 0 {
				d = -d
			}
			jitter = append(jitter, d)
		}
	}
	srv.mu.Unlock()
	if len(jitter) < n*5 {
		t.Fatalf("only %d probe intervals seen, want at least %d", len(jitter), n*5)
	}
	t.Logf("mqlet CPU with %d pods (exec liveness + httpGet readiness, periodSeconds 10): %.2f%% of one core over %v", n, cpu, window)
	t.Logf("probe interval jitter |interval-10s| over %d intervals: p50 %v, p99 %v, max %v", len(jitter),
		percentile(jitter, 50), percentile(jitter, 99), percentile(jitter, 100))
	t.Logf("first passing readiness check → Ready=True at the subscriber (%d pods): p50 %v, p99 %v", len(delays),
		percentile(delays, 50), percentile(delays, 99))
	// Generous bounds for a shared 2-core machine: the numbers are the point.
	if p99 := percentile(jitter, 99); p99 > 2*time.Second {
		t.Errorf("probe interval jitter p99 %v, want under 2 s", p99)
	}
	if p99 := percentile(delays, 99); p99 > 5*time.Second {
		t.Errorf("readiness → status p99 %v, want under 5 s", p99)
	}
	if cpu > 10 {
		t.Errorf("mqlet used %.1f%% of one core probing 20 pods, want well under 10%%", cpu)
	}
}
