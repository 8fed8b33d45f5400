package chaos

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	v1 "k8s.io/api/core/v1"

	apiv1 "github.com/mqlet/mqlet/api/v1"
)

const prefix = "mqlet/v1"

// replyMsg is one reply as received.
type replyMsg struct {
	reply apiv1.Reply
	raw   []byte
	at    time.Time
}

// statusMsg is one message on a pod's retained status topic; pod is nil
// for the empty payload that clears it.
type statusMsg struct {
	pod      *v1.Pod
	at       time.Time
	retained bool
}

// recorder is the operator's MQTT connection. Its session is persistent
// (clean session off, a fixed client id), so what the agent publishes
// while the broker restarts is queued for it and nothing is missed.
type recorder struct {
	c        paho.Client
	node, ns string

	mu       sync.Mutex
	replies  map[string][]replyMsg  // by request id, in arrival order
	statuses map[string][]statusMsg // by pod name, in arrival order
	events   []v1.Event             // warnings of the node, in arrival order
	onlines  int                    // "online" state messages seen
	changed  chan struct{}
	bad      []string // messages that did not decode
}

func connectRecorder(broker, node, ns string) (*recorder, error) {
	r := &recorder{node: node, ns: ns, replies: map[string][]replyMsg{}, statuses: map[string][]statusMsg{}, changed: make(chan struct{})}
	opts := paho.NewClientOptions().AddBroker(broker).SetClientID("chaos-" + node).
		SetCleanSession(false).SetAutoReconnect(true).SetConnectRetry(true).
		SetMaxReconnectInterval(500 * time.Millisecond).SetOrderMatters(true)
	opts.SetDefaultPublishHandler(r.record)
	r.c = paho.NewClient(opts)
	if tok := r.c.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		return nil, fmt.Errorf("connecting to %s: %v", broker, tok.Error())
	}
	base := prefix + "/" + node + "/"
	for _, f := range []string{base + "reply/#", base + "pods/#", base + "events", base + "state"} {
		if tok := r.c.Subscribe(f, 1, r.record); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
			return nil, fmt.Errorf("subscribing to %s: %v", f, tok.Error())
		}
	}
	return r, nil
}

func (r *recorder) close() { r.c.Disconnect(200) }

func (r *recorder) record(_ paho.Client, m paho.Message) {
	now := time.Now()
	base := prefix + "/" + r.node + "/"
	topic, payload := m.Topic(), m.Payload()
	r.mu.Lock()
	defer r.mu.Unlock()
	defer func() { close(r.changed); r.changed = make(chan struct{}) }()
	switch {
	case strings.HasPrefix(topic, base+"reply/"):
		rep, err := apiv1.DecodeReply(payload)
		if err != nil {
			r.bad = append(r.bad, fmt.Sprintf("%s: %v", topic, err))
			return
		}
		id := strings.TrimPrefix(topic, base+"reply/")
		r.replies[id] = append(r.replies[id], replyMsg{reply: rep, raw: append([]byte(nil), payload...), at: now})
	case strings.HasPrefix(topic, base+"pods/"+r.ns+"/"):
		name := strings.TrimPrefix(topic, base+"pods/"+r.ns+"/")
		msg := statusMsg{at: now, retained: m.Retained()}
		if len(payload) > 0 {
			var p v1.Pod
			if err := json.Unmarshal(payload, &p); err != nil {
				r.bad = append(r.bad, fmt.Sprintf("%s: %v", topic, err))
				return
			}
			msg.pod = &p
		}
		r.statuses[name] = append(r.statuses[name], msg)
	case topic == base+"state":
		var st apiv1.NodeState
		if json.Unmarshal(payload, &st) == nil && st.State == "online" {
			r.onlines++
		}
	case topic == base+"events":
		var e v1.Event
		if err := json.Unmarshal(payload, &e); err != nil {
			r.bad = append(r.bad, fmt.Sprintf("%s: %v", topic, err))
			return
		}
		r.events = append(r.events, e)
	}
}

// publish sends a command at QoS 1.
func (r *recorder) publish(verb, id string, payload []byte) error {
	tok := r.c.Publish(prefix+"/"+r.node+"/cmd/"+verb+"/"+id, 1, false, payload)
	if !tok.WaitTimeout(30*time.Second) || tok.Error() != nil {
		return fmt.Errorf("publishing %s %s: %v", verb, id, tok.Error())
	}
	return nil
}

// repliesOf returns the replies of id so far.
func (r *recorder) repliesOf(id string) []replyMsg {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]replyMsg(nil), r.replies[id]...)
}

// lastStatus returns the last message on pod name's topic (ok false: none).
func (r *recorder) lastStatus(name string) (statusMsg, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	list := r.statuses[name]
	if len(list) == 0 {
		return statusMsg{}, false
	}
	return list[len(list)-1], true
}

// statusesFrom returns the messages of pod name from index from on.
func (r *recorder) statusesFrom(name string, from int) []statusMsg {
	r.mu.Lock()
	defer r.mu.Unlock()
	if from >= len(r.statuses[name]) {
		return nil
	}
	return append([]statusMsg(nil), r.statuses[name][from:]...)
}

// eventsFrom returns the events from index from on.
func (r *recorder) eventsFrom(from int) []v1.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	if from >= len(r.events) {
		return nil
	}
	return append([]v1.Event(nil), r.events[from:]...)
}

// waitFinal waits up to timeout for the final reply of id and returns
// every payload received for it.
func (r *recorder) waitFinal(id string, timeout time.Duration) ([][]byte, bool) {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		r.mu.Lock()
		var payloads [][]byte
		final := false
		for _, m := range r.replies[id] {
			payloads = append(payloads, m.raw)
			final = final || m.reply.Final()
		}
		changed := r.changed
		r.mu.Unlock()
		if final {
			return payloads, true
		}
		select {
		case <-changed:
		case <-deadline.C:
			return nil, false
		}
	}
}

// waitOnline waits until the agent has said "online" (once its session
// exists at the broker, commands sent while it is down wait for it).
func (r *recorder) waitOnline(timeout time.Duration) bool { return r.waitOnlines(1, timeout) }

// onlineCount is how many "online" state messages came so far.
func (r *recorder) onlineCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.onlines
}

// waitOnlines waits until n "online" state messages came.
func (r *recorder) waitOnlines(n int, timeout time.Duration) bool {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		r.mu.Lock()
		got, changed := r.onlines, r.changed
		r.mu.Unlock()
		if got >= n {
			return true
		}
		select {
		case <-changed:
		case <-deadline.C:
			return false
		}
	}
}
