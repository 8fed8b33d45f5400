package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	apiv1 "github.com/mqlet/mqlet/api/v1"
	"github.com/mqlet/mqlet/internal/testutil/mosquitto"
)

// replyPayloads returns every reply payload recorded for request id of node.
func (c *Client) replyPayloads(node, id string) [][]byte {
	var out [][]byte
	for _, m := range c.Messages() {
		if m.Topic == prefix+"/"+node+"/reply/"+id {
			out = append(out, m.Payload)
		}
	}
	return out
}

// waitAssembled waits for the final reply to id and returns the result
// joined from its parts.
func (c *Client) waitAssembled(node, id string, timeout time.Duration) []byte {
	c.t.Helper()
	final := c.WaitReply(node, id, apiv1.Succeeded, timeout)
	result, _, err := apiv1.Assemble(c.replyPayloads(node, id))
	if err != nil {
		c.t.Fatalf("assembling the reply to %s (%s): %v", id, final.Message, err)
	}
	return result
}

func fileSize(t *testing.T, path string) int64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}

// A two-byte get no longer answers with every stored byte: with ten
// ConfigMaps of ~900 KiB, each reply message stays within
// requests.maxReplyBytes, a listing carries no ConfigMap data, each
// ConfigMap is still read whole by name (in parts), and ten gets leave
// state.db's size bounded by the record bound, not by the results.
func TestGetAmplificationIsBounded(t *testing.T) {
	b := mosquitto.Start(t)
	const node = "gw-amplify"
	const maxReply = 256 << 10
	op := Connect(t, b.URL())
	op.Subscribe(prefix+"/"+node+"/reply/#", prefix+"/"+node+"/state")
	stateDir := t.TempDir()
	StartAgent(t, AgentOpts{Node: node, Broker: b.URL(), StateDir: stateDir,
		Config: fmt.Sprintf("requests:\n  maxReplyBytes: %d\n  maxRecordBytes: 8388608\n", maxReply)})
	op.WaitState(0, node, "online", 10*time.Second)

	value := strings.Repeat("0123456789abcdef", 900<<10/16) // 921600 bytes
	for i := 0; i < 10; i++ {
		op.Command(node, "apply", fmt.Sprintf("big-%d", i),
			fmt.Appendf(nil, `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"big-%d"},"data":{"v":%q}}`, i, value))
		op.WaitReply(node, fmt.Sprintf("big-%d", i), apiv1.Accepted, 30*time.Second)
	}
	db := filepath.Join(stateDir, "state.db")
	before := fileSize(t, db)

	for i := 0; i < 10; i++ {
		op.Command(node, "get", fmt.Sprintf("list-%d", i), []byte(`{}`))
	}
	for i := 0; i < 10; i++ {
		id := fmt.Sprintf("list-%d", i)
		var res struct {
			ConfigMaps []struct {
				Metadata struct {
					Name string `json:"name"`
				} `json:"metadata"`
				Data map[string]string `json:"data"`
			} `json:"configMaps"`
		}
		if err := json.Unmarshal(op.waitAssembled(node, id, 30*time.Second), &res); err != nil {
			t.Fatalf("listing %s: %v", id, err)
		}
		if len(res.ConfigMaps) != 10 {
			t.Fatalf("listing %s: %d configmaps, want 10", id, len(res.ConfigMaps))
		}
		for _, cm := range res.ConfigMaps {
			if cm.Data["v"] != "<omitted: 921600 bytes>" {
				t.Fatalf("listing %s shows %s's data (%d bytes), want its size only", id, cm.Metadata.Name, len(cm.Data["v"]))
			}
		}
	}
	afterList := fileSize(t, db)

	// Every ConfigMap is still reachable, whole, by name.
	for i := 0; i < 10; i++ {
		id := fmt.Sprintf("one-%d", i)
		op.Command(node, "get", id, fmt.Appendf(nil, `{"kind":"ConfigMap","namespace":"default","name":"big-%d"}`, i))
		var res struct {
			ConfigMaps []struct {
				Data map[string]string `json:"data"`
			} `json:"configMaps"`
		}
		if err := json.Unmarshal(op.waitAssembled(node, id, 60*time.Second), &res); err != nil {
			t.Fatalf("get %s: %v", id, err)
		}
		if len(res.ConfigMaps) != 1 || res.ConfigMaps[0].Data["v"] != value {
			t.Fatalf("get %s: the data did not come back whole", id)
		}
		if n := len(op.replyPayloads(node, id)); n < 4 {
			t.Fatalf("get %s: %d messages, want a ~900 KiB result in parts", id, n)
		}
	}
	afterByName := fileSize(t, db)

	for _, m := range op.Messages() {
		if strings.Contains(m.Topic, "/reply/") && len(m.Payload) > maxReply {
			t.Errorf("reply on %s is %d bytes, above requests.maxReplyBytes %d", m.Topic, len(m.Payload), maxReply)
		}
	}
	t.Logf("state.db: %.1f MiB with the ConfigMaps stored, %.1f MiB after ten {} gets, %.1f MiB after ten gets by name",
		float64(before)/(1<<20), float64(afterList)/(1<<20), float64(afterByName)/(1<<20))
	// The records are stubs for large replies and bounded to 8 MiB in all;
	// bbolt may keep freed pages, so allow the bound itself, not more.
	if grew := afterByName - before; grew > 8<<20 {
		t.Fatalf("state.db grew by %.1f MiB over twenty gets, more than the 8 MiB record bound", float64(grew)/(1<<20))
	}
	// A redelivered get is answered from its (stub) record, not re-run.
	mark := op.Mark()
	op.Command(node, "get", "one-0", fmt.Appendf(nil, `{"kind":"ConfigMap","namespace":"default","name":"big-0"}`))
	again := op.WaitFor(mark, 10*time.Second, "the repeated answer to one-0", func(m Msg) bool { return strings.HasSuffix(m.Topic, "/reply/one-0") })
	if !strings.Contains(string(again.Payload), "send the request again with a new request id") || len(again.Payload) > 4096 {
		t.Fatalf("redelivered get answered with %d bytes: %.300s", len(again.Payload), again.Payload)
	}
}

// A burst of 2,000 applies with a small backlog: every command is answered
// at once, accepted or "overloaded" (at least one overloaded, since the
// backlog is far smaller than the burst), none is lost or left unanswered;
// an overloaded command is not recorded, so sent again it runs; in the end
// all 2,000 ConfigMaps are stored.
func TestBurstEveryCommandAnswered(t *testing.T) {
	port := freeLoopbackPort(t)
	// Raised queue limits: the broker must not drop the burst or its
	// replies, or the test would measure the broker.
	runMosquitto(t, fmt.Sprintf("listener %d 127.0.0.1\nallow_anonymous true\nset_tcp_nodelay true\nmax_queued_messages 100000\nmax_inflight_messages 0\n", port), port)
	url := fmt.Sprintf("tcp://127.0.0.1:%d", port)
	const node = "gw-burst"
	const n = 2000
	op := Connect(t, url)
	op.Subscribe(prefix+"/"+node+"/reply/#", prefix+"/"+node+"/state")
	a := StartAgent(t, AgentOpts{Node: node, Broker: url, Config: "requests:\n  maxBacklog: 1\n"})
	op.WaitState(0, node, "online", 10*time.Second)

	payload := func(i int) []byte {
		return fmt.Appendf(nil, `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"burst-%d"},"data":{"i":"%d"}}`, i, i)
	}
	send := func(ids []int) {
		toks := make([]paho.Token, 0, len(ids))
		for _, i := range ids {
			toks = append(toks, op.c.Publish(fmt.Sprintf("%s/%s/cmd/apply/b-%d", prefix, node, i), 1, false, payload(i)))
		}
		for _, tok := range toks {
			if !tok.WaitTimeout(60*time.Second) || tok.Error() != nil {
				t.Fatalf("publishing the burst: %v", tok.Error())
			}
		}
	}
	// firstAnswers waits until every id sent since mark has an answer and
	// returns the ids refused as overloaded.
	firstAnswers := func(mark int, ids []int) (overloaded []int) {
		t.Helper()
		want := map[string]int{}
		for _, i := range ids {
			want[fmt.Sprintf("b-%d", i)] = i
		}
		seen := map[string]bool{}
		var unexpected string
		Eventually(t, 120*time.Second, fmt.Sprintf("an answer to each of %d commands", len(ids)), func() bool {
			msgs := op.Messages()
			for _, m := range msgs[min(mark, len(msgs)):] {
				var r apiv1.Reply
				if !strings.Contains(m.Topic, "/reply/b-") || json.Unmarshal(m.Payload, &r) != nil {
					continue
				}
				i, ok := want[r.RequestID]
				if !ok || seen[r.RequestID] {
					continue
				}
				seen[r.RequestID] = true
				switch {
				case r.Phase == apiv1.Accepted:
				case r.Phase == apiv1.Failed && strings.HasPrefix(r.Message, "overloaded: ") && strings.HasSuffix(r.Message, " commands waiting; retry later"):
					overloaded = append(overloaded, i)
				default:
					unexpected = fmt.Sprintf("%s answered %s first: %s", r.RequestID, r.Phase, r.Message)
					return true
				}
			}
			mark = len(msgs)
			return len(seen) == len(want)
		})
		if unexpected != "" {
			t.Fatal(unexpected)
		}
		return overloaded
	}

	all := make([]int, n)
	for i := range all {
		all[i] = i
	}
	mark := op.Mark()
	start := time.Now()
	// The agent is stopped while the burst is published, so it meets the
	// burst at once (what the broker already sent it) instead of draining
	// it as it arrives, and its backlog is one command: an agent that keeps
	// up with the publisher has only a few commands waiting at any time,
	// and a larger backlog was seen never to fill in a loaded CI run.
	if err := syscall.Kill(a.pid(), syscall.SIGSTOP); err != nil {
		t.Fatalf("stopping mqlet for the burst: %v", err)
	}
	send(all)
	if err := syscall.Kill(a.pid(), syscall.SIGCONT); err != nil {
		t.Fatalf("continuing mqlet: %v", err)
	}
	refused := firstAnswers(mark, all)
	t.Logf("burst of %d: every command answered within %v; %d overloaded", n, time.Since(start).Round(time.Millisecond), len(refused))
	if len(refused) == 0 {
		t.Fatalf("no command of a %d burst was refused with a backlog of 1", n)
	}
	if len(refused) == n {
		t.Fatal("every command was refused")
	}
	// Refused commands are not recorded: sent again (a few at a time, as a
	// client backing off would), they run.
	for round := 0; len(refused) > 0; round++ {
		if round == 100 {
			t.Fatalf("%d commands still refused after 100 rounds", len(refused))
		}
		var next []int
		for len(refused) > 0 {
			k := min(10, len(refused))
			mark := op.Mark()
			send(refused[:k])
			next = append(next, firstAnswers(mark, refused[:k])...)
			refused = refused[k:]
		}
		refused = next
	}
	if !a.Running() {
		t.Fatal("mqlet died in the burst")
	}
	// None lost: all 2,000 are stored (the listing comes in parts).
	op.Command(node, "get", "count", []byte(`{"kind":"ConfigMap"}`))
	var res struct {
		ConfigMaps []json.RawMessage `json:"configMaps"`
	}
	if err := json.Unmarshal(op.waitAssembled(node, "count", 30*time.Second), &res); err != nil {
		t.Fatal(err)
	}
	if len(res.ConfigMaps) != n {
		t.Fatalf("%d configmaps stored, want %d", len(res.ConfigMaps), n)
	}
}
