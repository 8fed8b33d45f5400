package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	statsv1alpha1 "k8s.io/kubelet/pkg/apis/stats/v1alpha1"

	apiv1 "github.com/mqlet/mqlet/api/v1"
	"github.com/mqlet/mqlet/internal/testutil/mosquitto"
)

// holdProxy forwards TCP connections to a broker; hold stops what clients
// send from reaching the broker (kept, in order, until release) while the
// broker's messages still reach them: an MQTT link whose uplink stalls.
type holdProxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	held   bool
	freed  chan struct{} // closed by release
	conns  []net.Conn
	wg     sync.WaitGroup
}

func startHoldProxy(t *testing.T, target string) *holdProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &holdProxy{ln: ln, target: target, freed: make(chan struct{})}
	close(p.freed)
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(func() {
		_ = ln.Close()
		p.release()
		p.mu.Lock()
		for _, c := range p.conns {
			_ = c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

func (p *holdProxy) URL() string { return "tcp://" + p.ln.Addr().String() }

func (p *holdProxy) hold() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.held {
		p.held, p.freed = true, make(chan struct{})
	}
}

func (p *holdProxy) release() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.held {
		p.held = false
		close(p.freed)
	}
}

func (p *holdProxy) gate() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.freed
}

func (p *holdProxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		broker, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = client.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, client, broker)
		p.mu.Unlock()
		p.wg.Add(2)
		go func() { // uplink, held on request
			defer p.wg.Done()
			defer broker.Close()
			buf := make([]byte, 32<<10)
			for {
				n, err := client.Read(buf)
				if n > 0 {
					<-p.gate()
					if _, werr := broker.Write(buf[:n]); werr != nil {
						return
					}
				}
				if err != nil {
					return
				}
			}
		}()
		go func() { // downlink
			defer p.wg.Done()
			defer client.Close()
			_, _ = io.Copy(client, broker)
		}()
	}
}

var droppedEventRe = regexp.MustCompile(`dropped (\d+) queued messages \((\d+) of them final replies\)`)

// Issue 18: under a flood of failing applies with large replies that the
// outbox cannot hold (its uplink stalled), every final reply it drops is
// counted (outbox_dropped_final_replies in the metrics) and reported in an
// OutboxDropped Warning node event per burst, not one per message: once
// the link is back, every command has its final reply or is counted as
// dropped.
func TestOutboxDropsAreCountedAndReportedUnderAFlood(t *testing.T) {
	_, endpoint := ConnectCRI(t)
	broker := mosquitto.Start(t)
	proxy := startHoldProxy(t, broker.Addr())
	node := "e2e-outbox-drops-" + strconv.FormatInt(time.Now().UnixNano()%1e9, 36)
	mq := Connect(t, broker.URL())
	mq.Subscribe(prefix + "/" + node + "/#")
	mark := mq.Mark()
	// The smallest outbox; replies up to 16 KiB, so four fill it. A long
	// keepalive keeps the stalled connection (no reconnect, no redelivery).
	agent := StartAgent(t, AgentOpts{Node: node, Broker: proxy.URL(), CRI: endpoint,
		Config: "mqtt:\n  outboxMaxBytes: 65536\n  keepAlive: 5m\nrequests:\n  maxReplyBytes: 16384\nlogs:\n  maxChunkBytes: 8192\nexec:\n  maxOutputBytes: 4096\ntelemetry:\n  metricsInterval: 1s\n"})
	mq.WaitState(mark, node, "online", 30*time.Second)

	// A List of pods with invalid names: each one an error in the reply.
	var items []string
	for i := range 250 {
		items = append(items, fmt.Sprintf(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"Not_A_Valid_Name_%03d_%s"},"spec":{"containers":[{"name":"c","image":"busybox"}]}}`, i, strings.Repeat("X", 200)))
	}
	bad := []byte(`{"apiVersion":"v1","kind":"List","items":[` + strings.Join(items, ",") + `]}`)

	proxy.hold()
	const flood = 30
	ids := make([]string, flood)
	for i := range ids {
		ids[i] = fmt.Sprintf("flood-%02d", i)
		mq.Command(node, "apply", ids[i], bad)
	}
	// The agent logs its first drop at once (the metrics and events wait
	// for the link).
	Eventually(t, 60*time.Second, "the outbox dropping replies it cannot hold", func() bool {
		return strings.Contains(agent.Logs(), "outbox full")
	})
	proxy.release()

	// Every command has its final reply, or is counted as dropped.
	var (
		answered     map[string]bool
		counters     map[string]float64
		droppedFinal int
	)
	defer func() {
		if t.Failed() {
			t.Logf("answered %d: %v; counters %v", len(answered), answered, counters)
		}
	}()
	Eventually(t, 90*time.Second, "every command answered or counted as a dropped final reply", func() bool {
		answered = map[string]bool{}
		for _, id := range ids {
			for _, r := range mq.Replies(node, id) {
				if r.Final() {
					if r.Phase != apiv1.Failed {
						t.Fatalf("%s: %s, want failed", id, r.Phase)
					}
					answered[id] = true
				}
			}
		}
		counters = latestCounters(t, mq, node)
		droppedFinal = int(counters["outbox_dropped_final_replies"])
		return len(answered)+droppedFinal == flood
	})
	if droppedFinal == 0 || len(answered) == 0 {
		t.Fatalf("%d answered, %d final replies dropped: the flood should have overflowed the outbox, and the newest replies stay", len(answered), droppedFinal)
	}
	if counters["outbox_dropped"] < float64(droppedFinal) {
		t.Fatalf("outbox_dropped %v < outbox_dropped_final_replies %d", counters["outbox_dropped"], droppedFinal)
	}

	// One Warning event per burst with the count, not one per message.
	var reports []v1.Event
	reported := 0
	Eventually(t, 60*time.Second, "an OutboxDropped event counting the dropped final replies", func() bool {
		reports, reported = nil, 0
		for _, m := range mq.Messages() {
			var ev v1.Event
			if m.Topic != prefix+"/"+node+"/events" || json.Unmarshal(m.Payload, &ev) != nil || ev.Reason != "OutboxDropped" {
				continue
			}
			reports = append(reports, ev)
			if sm := droppedEventRe.FindStringSubmatch(ev.Message); sm != nil && ev.Type == v1.EventTypeWarning {
				n, _ := strconv.Atoi(sm[2])
				reported += n
			}
		}
		return reported >= droppedFinal
	})
	if len(reports) > 3 {
		t.Fatalf("%d OutboxDropped events for %d dropped final replies: want one per burst", len(reports), droppedFinal)
	}
	t.Logf("%d of %d final replies dropped (%v messages in all), reported in %d event(s): %q", droppedFinal, flood, counters["outbox_dropped"], len(reports), reports[0].Message)
}

// latestCounters is mqlet's own counters from the newest metrics message.
func latestCounters(t *testing.T, mq *Client, node string) map[string]float64 {
	t.Helper()
	msgs := mq.Messages()
	for i := len(msgs) - 1; i >= 0; i-- {
		if msgs[i].Topic != prefix+"/"+node+"/metrics" {
			continue
		}
		var s statsv1alpha1.Summary
		if err := json.Unmarshal(msgs[i].Payload, &s); err != nil {
			t.Fatalf("metrics: %v", err)
		}
		out := map[string]float64{}
		for _, sc := range s.Node.SystemContainers {
			if sc.Name != "mqlet" {
				continue
			}
			for _, u := range sc.UserDefinedMetrics {
				out[u.Name] = u.Value
			}
		}
		return out
	}
	return nil
}
