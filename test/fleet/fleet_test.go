// Package fleet runs many hollow mqlet agents in one process against one
// real mosquitto and measures the fleet: the connect storm, the reconnect
// after a broker restart, a command to every node, idle telemetry,
// retained bytes and memory per agent. Each agent is the real agent
// (agent.New: intake, store, outbox, session, telemetry, pod workers) with
// its own MQTT session and its own store directory; its container runtime
// is a CRI manager whose endpoint nothing listens on (no containerd).
//
// TestFleetSmoke runs five agents and is part of make test;
// TestFleetBench runs MQLET_FLEET_N agents (make fleet-bench).
package fleet

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	"github.com/rs/zerolog"

	"github.com/mqlet/mqlet/agent"
	"github.com/mqlet/mqlet/agent/store"
	apiv1 "github.com/mqlet/mqlet/api/v1"
	"github.com/mqlet/mqlet/cri"
	"github.com/mqlet/mqlet/internal/testutil/mosquitto"
	"github.com/mqlet/mqlet/mqtt/outbox"
	"github.com/mqlet/mqlet/mqtt/session"
)

const prefix = "fleet"

// node is one simulated gateway.
type node struct {
	name   string
	topics apiv1.Scheme
	st     *store.Store
	box    *outbox.Outbox
	stop   context.CancelFunc
	done   chan struct{}
	err    error
}

// observer is a plain MQTT client that records, per node, when the node
// last said online and how many final replies each request got.
type observer struct {
	mu       sync.Mutex
	onlineAt map[string]time.Time // node → first online state since mark
	mark     time.Time
	finals   map[string]int // request id → final replies
	replyAt  map[string]time.Time
	msgs     int
	bytes    int
}

func (o *observer) handle(_ paho.Client, m paho.Message) {
	now := time.Now()
	o.mu.Lock()
	defer o.mu.Unlock()
	o.msgs++
	o.bytes += len(m.Topic()) + len(m.Payload())
	parts := strings.Split(m.Topic(), "/")
	if len(parts) < 3 || parts[0] != prefix {
		return
	}
	switch {
	case len(parts) == 3 && parts[2] == "state":
		var s apiv1.NodeState
		if json.Unmarshal(m.Payload(), &s) == nil && s.State == "online" && (!m.Retained() || !s.TS.Before(o.mark)) {
			if _, ok := o.onlineAt[parts[1]]; !ok {
				o.onlineAt[parts[1]] = now
			}
		}
	case len(parts) == 4 && parts[2] == "reply":
		var r apiv1.Reply
		if json.Unmarshal(m.Payload(), &r) == nil && r.Final() {
			o.finals[parts[3]]++
			if _, ok := o.replyAt[parts[3]]; !ok {
				o.replyAt[parts[3]] = now
			}
		}
	}
}

// resetOnline forgets who said online, for the next scenario.
func (o *observer) resetOnline() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.onlineAt = map[string]time.Time{}
	o.mark = time.Now()
}

func (o *observer) traffic() (int, int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.msgs, o.bytes
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, what string, within time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, within)
		}
		<-tick.C
	}
}

func startNode(t *testing.T, root, brokerURL string, i int) *node {
	t.Helper()
	name := fmt.Sprintf("gw%05d", i)
	dir := filepath.Join(root, name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	log := zerolog.Nop()
	st, err := store.OpenWith(filepath.Join(dir, "state.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	box, err := outbox.Open(filepath.Join(dir, "outbox.db"), 1<<20, log)
	if err != nil {
		t.Fatal(err)
	}
	rt := cri.NewManager(cri.Config{Endpoint: "unix://" + filepath.Join(dir, "no-cri.sock"), PodDir: filepath.Join(dir, "pods"), PodLogDir: filepath.Join(dir, "logs")}, log)
	topics := apiv1.Scheme{Prefix: prefix, Node: name}
	opts := agent.Options{
		Topics: topics, Workers: 1, PLEGPeriod: time.Second, GCInterval: time.Hour, PodStatusResync: time.Hour,
		Version: "fleet",
		Session: session.Options{BrokerURL: brokerURL, ClientID: session.ClientID(name), KeepAlive: 30 * time.Second},
	}
	// The shipped defaults (configs/mqlet.yaml).
	opts.Telemetry.NodeStatusInterval = time.Minute
	opts.Telemetry.MetricsInterval = 30 * time.Second
	opts.Telemetry.StateDir = dir
	a, err := agent.New(context.Background(), opts, agent.Deps{Store: st, Outbox: box, Runtime: rt}, log)
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	n := &node{name: name, topics: topics, st: st, box: box, stop: stop, done: make(chan struct{})}
	go func() { defer close(n.done); n.err = a.Run(ctx) }()
	return n
}

func (n *node) close(t *testing.T) {
	n.stop()
	select {
	case <-n.done:
	case <-time.After(60 * time.Second):
		t.Errorf("%s: Run did not return within 60s", n.name)
	}
	if n.err != nil {
		t.Errorf("%s: Run: %v", n.name, n.err)
	}
	_ = n.box.Close()
	_ = n.st.Close()
}

func pct(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := int(p*float64(len(s))+0.999999) - 1
	if i < 0 {
		i = 0
	}
	if i >= len(s) {
		i = len(s) - 1
	}
	return s[i]
}

func spread(d []time.Duration) string {
	return fmt.Sprintf("p50 %v p99 %v max %v", pct(d, 0.5).Round(time.Millisecond), pct(d, 0.99).Round(time.Millisecond), pct(d, 1).Round(time.Millisecond))
}

// procStat reads VmRSS (KiB) and utime+stime (ticks) of a process.
func procStat(pid int) (rssKiB int, ticks int) {
	if data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid)); err == nil {
		for _, l := range strings.Split(string(data), "\n") {
			if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
				rssKiB, _ = strconv.Atoi(f[1])
			}
		}
	}
	if data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil {
		s := string(data)
		if i := strings.LastIndexByte(s, ')'); i > 0 {
			f := strings.Fields(s[i+2:])
			if len(f) > 13 {
				u, _ := strconv.Atoi(f[11])
				k, _ := strconv.Atoi(f[12])
				ticks = u + k
			}
		}
	}
	return rssKiB, ticks
}

// storeRoot is a directory on tmpfs when /dev/shm exists.
func storeRoot(t *testing.T) string {
	t.Helper()
	if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
		d, err := os.MkdirTemp("/dev/shm", "mqlet-fleet-")
		if err == nil {
			t.Cleanup(func() { _ = os.RemoveAll(d) })
			return d
		}
	}
	return t.TempDir()
}

// result is what one run measured.
type result struct {
	lines []string
}

func (r *result) add(format string, args ...any) {
	r.lines = append(r.lines, fmt.Sprintf(format, args...))
}

func runFleet(t *testing.T, n int, idle time.Duration, within time.Duration) *result {
	res := &result{}
	b := mosquitto.Start(t)
	obs := &observer{onlineAt: map[string]time.Time{}, finals: map[string]int{}, replyAt: map[string]time.Time{}}
	client := paho.NewClient(paho.NewClientOptions().AddBroker(b.URL()).SetClientID("fleet-observer").
		SetAutoReconnect(true).SetCleanSession(false).SetOrderMatters(false).SetMaxReconnectInterval(time.Second).
		SetOnConnectHandler(func(c paho.Client) {
			c.Subscribe(prefix+"/+/state", 1, obs.handle)
			c.Subscribe(prefix+"/+/reply/#", 1, obs.handle)
		}))
	if tok := client.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("observer connect: %v", tok.Error())
	}
	defer client.Disconnect(0)
	waitFor(t, "observer subscribed", 10*time.Second, func() bool { return client.IsConnectionOpen() })
	time.Sleep(200 * time.Millisecond) // let the subscriptions settle (not synchronisation of the agents)

	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	rssBefore, _ := procStat(os.Getpid())

	root := storeRoot(t)
	// Cold connect storm: all N at once.
	obs.resetOnline()
	start := time.Now()
	nodes := make([]*node, n)
	var wg sync.WaitGroup
	var mu sync.Mutex
	for i := range nodes {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			nd := startNode(t, root, b.URL(), i)
			mu.Lock()
			nodes[i] = nd
			mu.Unlock()
		}(i)
	}
	wg.Wait()
	defer func() {
		for _, nd := range nodes {
			if nd != nil {
				nd.close(t)
			}
		}
	}()
	onlineTimes := func(since time.Time) []time.Duration {
		obs.mu.Lock()
		defer obs.mu.Unlock()
		var d []time.Duration
		for _, at := range obs.onlineAt {
			d = append(d, at.Sub(since))
		}
		return d
	}
	allOnline := func() bool { obs.mu.Lock(); defer obs.mu.Unlock(); return len(obs.onlineAt) == n }
	waitFor(t, fmt.Sprintf("%d agents online after a cold start", n), within, allOnline)
	res.add("cold connect storm, %d agents: online %s", n, spread(onlineTimes(start)))

	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	rssAfter, _ := procStat(os.Getpid())
	res.add("memory per agent: heap in use %.2f MiB, RSS %.2f MiB",
		float64(int64(after.HeapInuse)-int64(before.HeapInuse))/float64(n)/(1<<20),
		float64(rssAfter-rssBefore)/float64(n)/1024)

	// A command to every node, node by node: each request answered exactly once.
	cmdTimes := func(tag string) {
		sent := map[string]time.Time{}
		for _, nd := range nodes {
			id := tag + "-" + nd.name
			sent[id] = time.Now()
			if tok := client.Publish(nd.topics.Command("get", id), 1, false, []byte(`{"kind":"pods"}`)); !tok.WaitTimeout(30*time.Second) || tok.Error() != nil {
				t.Fatalf("publish %s: %v", id, tok.Error())
			}
		}
		waitFor(t, tag+": every request answered", within, func() bool {
			obs.mu.Lock()
			defer obs.mu.Unlock()
			for id := range sent {
				if obs.finals[id] == 0 {
					return false
				}
			}
			return true
		})
		// Late duplicates would show within a moment.
		time.Sleep(time.Second)
		obs.mu.Lock()
		var d []time.Duration
		for id, at := range sent {
			if c := obs.finals[id]; c != 1 {
				t.Errorf("%s: %d final replies, want exactly 1", id, c)
			}
			d = append(d, obs.replyAt[id].Sub(at))
		}
		obs.mu.Unlock()
		res.add("%s to %d agents (command → final reply): %s", tag, n, spread(d))
	}
	cmdTimes("get")

	// Retained bytes per node: what a fresh subscriber to the fleet gets.
	var retMu sync.Mutex
	retBytes, retMsgs := 0, 0
	rc := paho.NewClient(paho.NewClientOptions().AddBroker(b.URL()).SetClientID("fleet-retained"))
	if tok := rc.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("retained client connect: %v", tok.Error())
	}
	if tok := rc.Subscribe(prefix+"/#", 0, func(_ paho.Client, m paho.Message) {
		if m.Retained() {
			retMu.Lock()
			retBytes += len(m.Topic()) + len(m.Payload())
			retMsgs++
			retMu.Unlock()
		}
	}); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("retained subscribe: %v", tok.Error())
	}
	time.Sleep(2 * time.Second) // retained messages arrive right after the SUBACK
	rc.Disconnect(0)
	retMu.Lock()
	res.add("retained per node: %.1f messages, %.0f bytes", float64(retMsgs)/float64(n), float64(retBytes)/float64(n))
	retMu.Unlock()

	// Idle telemetry at the default intervals, and the broker's cost.
	if idle > 0 {
		rc := paho.NewClient(paho.NewClientOptions().AddBroker(b.URL()).SetClientID("fleet-idle"))
		if tok := rc.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
			t.Fatalf("idle client connect: %v", tok.Error())
		}
		var im sync.Mutex
		msgs, bytes := 0, 0
		rc.Subscribe(prefix+"/#", 0, func(_ paho.Client, m paho.Message) {
			if !m.Retained() {
				im.Lock()
				msgs++
				bytes += len(m.Topic()) + len(m.Payload())
				im.Unlock()
			}
		}).WaitTimeout(10 * time.Second)
		_, t0 := procStat(b.PID())
		time.Sleep(idle)
		rss, t1 := procStat(b.PID())
		rc.Disconnect(0)
		im.Lock()
		secs := idle.Seconds()
		res.add("idle telemetry over %v: %.4f messages/s and %.1f bytes/s per node", idle, float64(msgs)/secs/float64(n), float64(bytes)/secs/float64(n))
		im.Unlock()
		res.add("mosquitto idle: RSS %.1f MiB, CPU %.1f%% of one core", float64(rss)/1024, float64(t1-t0)/100/secs*100)
	}

	// Broker restart: every agent reconnects and says online again.
	rss, _ := procStat(b.PID())
	res.add("mosquitto RSS with %d agents: %.1f MiB", n, float64(rss)/1024)
	_, c0 := procStat(b.PID())
	b.Restart()
	obs.resetOnline()
	restarted := time.Now()
	waitFor(t, fmt.Sprintf("%d agents online after a broker restart", n), within, allOnline)
	res.add("broker restart, %d agents: online again %s (mosquitto CPU ticks before restart %d)", n, spread(onlineTimes(restarted)), c0)
	waitFor(t, "observer reconnected", 30*time.Second, func() bool { return client.IsConnectionOpen() })
	time.Sleep(500 * time.Millisecond)
	cmdTimes("get-after-restart")
	return res
}

// TestFleetSmoke: five real agents on a real mosquitto come online, answer
// a command each exactly once, and come back online after the broker
// restarts.
func TestFleetSmoke(t *testing.T) {
	res := runFleet(t, 5, 0, 60*time.Second)
	for _, l := range res.lines {
		t.Log(l)
	}
}

// TestFleetBench runs MQLET_FLEET_N agents (make fleet-bench); skipped
// unless that is set.
func TestFleetBench(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("MQLET_FLEET_N"))
	if n <= 0 {
		t.Skip("MQLET_FLEET_N not set (make fleet-bench)")
	}
	idle := 65 * time.Second
	res := runFleet(t, n, idle, 5*time.Minute)
	for _, l := range res.lines {
		fmt.Println(l)
	}
}
