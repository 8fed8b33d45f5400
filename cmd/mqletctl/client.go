package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	apiv1 "github.com/mqlet/mqlet/api/v1"
	"github.com/mqlet/mqlet/mqtt/session"
)

// client is one short-lived MQTT connection of the CLI: a clean session
// with a random client id, so nothing is left on the broker afterwards.
type client struct {
	mqtt   paho.Client
	id     string // the MQTT client id
	topics apiv1.Scheme
	broker string // redacted URL, for messages
	// seal wraps a command for its topic: signs it when a key is given.
	seal func(verb, requestID string, payload []byte) ([]byte, error)
	// retainedWait is how long request waits for the node's retained
	// state before saying there is no such node (0: it does not check).
	retainedWait time.Duration
	// waitOffline waits for the reply of a node whose retained state says
	// offline; else request returns errQueued at once.
	waitOffline bool
	// stream marks a request that runs while it is read (a followed log):
	// request says it reads on the request's input topic every
	// apiv1.InputInterval, and cancels it on the agent when ctx is
	// cancelled (Ctrl-C).
	stream bool
}

// cancelBudget bounds the cancel sent for a stream whose reader stops.
const cancelBudget = 3 * time.Second

// message is one inbound publication.
type message struct {
	Topic    string
	Payload  []byte
	Retained bool
}

// dial connects to the broker, bounded by ctx.
func dial(ctx context.Context, cfg *globalConfig) (*client, error) {
	redacted := cfg.Broker
	if u, err := url.Parse(cfg.Broker); err == nil {
		redacted = u.Redacted()
	}
	id := newClientID()
	opts := paho.NewClientOptions().
		AddBroker(cfg.Broker).
		SetClientID(id).
		SetUsername(cfg.Username).
		SetPassword(cfg.password).
		SetCleanSession(true).
		SetAutoReconnect(false).
		SetConnectRetry(false).
		SetOrderMatters(true). // replies are handled in the order they arrive
		SetKeepAlive(30 * time.Second).
		SetConnectTimeout(connectBudget(ctx))
	if cfg.CAFile != "" || cfg.CertFile != "" || cfg.KeyFile != "" {
		tlsCfg, err := session.TLSConfig(cfg.CAFile, cfg.CertFile, cfg.KeyFile, false)
		if err != nil {
			return nil, fmt.Errorf("preparing TLS for %s: %w", redacted, err)
		}
		opts.SetTLSConfig(tlsCfg)
	}
	c := &client{mqtt: paho.NewClient(opts), id: id, topics: cfg.scheme(), broker: redacted, seal: cfg.seal, retainedWait: cfg.RetainedWait, waitOffline: cfg.WaitOffline}
	if err := wait(ctx, c.mqtt.Connect()); err != nil {
		c.mqtt.Disconnect(0)
		if errors.Is(err, context.DeadlineExceeded) {
			return nil, fmt.Errorf("cannot reach broker %s: no answer within the timeout", redacted)
		}
		return nil, fmt.Errorf("cannot reach broker %s: %w", redacted, err)
	}
	return c, nil
}

// connectBudget bounds one connect attempt by the context's deadline.
func connectBudget(ctx context.Context) time.Duration {
	budget := defaultConnectBudget
	if dl, ok := ctx.Deadline(); ok {
		if left := time.Until(dl); left < budget {
			budget = left
		}
	}
	if budget < 100*time.Millisecond {
		budget = 100 * time.Millisecond
	}
	return budget
}

// close disconnects, giving in-flight packets a moment to leave.
func (c *client) close() { c.mqtt.Disconnect(250) }

// wait waits for a paho token or the end of ctx.
func wait(ctx context.Context, tok paho.Token) error {
	select {
	case <-tok.Done():
		return tok.Error()
	case <-ctx.Done():
		return ctx.Err()
	}
}

// subscribe subscribes to filters at QoS 1 and delivers what arrives on
// out until ctx ends. It returns once the broker granted every filter.
func (c *client) subscribe(ctx context.Context, out chan<- message, filters ...string) error {
	want := make(map[string]byte, len(filters))
	for _, f := range filters {
		want[f] = 1
	}
	handler := func(_ paho.Client, m paho.Message) {
		select {
		case out <- message{Topic: m.Topic(), Payload: m.Payload(), Retained: m.Retained()}:
		case <-ctx.Done():
		}
	}
	tok := c.mqtt.SubscribeMultiple(want, handler)
	if err := wait(ctx, tok); err != nil {
		return fmt.Errorf("subscribing to %v on %s: %w", filters, c.broker, err)
	}
	for f, code := range tok.(*paho.SubscribeToken).Result() {
		if code > 2 {
			return fmt.Errorf("broker %s refused the subscription to %s (code 0x%02x); check the ACL for this user", c.broker, f, code)
		}
	}
	return nil
}

// publish sends a QoS 1 message and waits for the broker's acknowledgement.
func (c *client) publish(ctx context.Context, topicName string, payload []byte) error {
	if err := wait(ctx, c.mqtt.Publish(topicName, 1, false, payload)); err != nil {
		return fmt.Errorf("publishing to %s on %s: %w", topicName, c.broker, err)
	}
	return nil
}

// errNoReply is wrapped by request when the deadline passes first.
var errNoReply = errors.New("no final reply")

// request sends one command and hands every reply to onReply until a final
// one arrives, or until onReply returns true (stop early). The reply topic
// is subscribed before the command is published so no reply is missed.
// The node's retained state topic is read too: a node that never published
// one does not exist under this prefix, so after c.retainedWait without it
// (and without a reply) the request fails at once instead of waiting for
// the whole timeout.
func (c *client) request(ctx context.Context, verb string, payload []byte, onReply func(apiv1.Reply) (stop bool)) (requestID string, err error) {
	retainedWait := c.retainedWait
	requestID = newRequestID()
	payload, err = c.seal(verb, requestID, payload)
	if err != nil {
		return requestID, err
	}
	subCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	inbox := make(chan message, 16)
	replyTopic := c.topics.Reply(requestID)
	if err := c.subscribe(subCtx, inbox, replyTopic, c.topics.State()); err != nil {
		return requestID, err
	}
	defer c.mqtt.Unsubscribe(replyTopic, c.topics.State())
	if err := c.publish(ctx, c.topics.Command(verb, requestID), payload); err != nil {
		return requestID, err
	}
	if c.stream {
		hbCtx, hbStop := context.WithCancel(subCtx)
		hbDone := make(chan struct{})
		go func() { defer close(hbDone); c.heartbeat(hbCtx, requestID) }()
		defer func() {
			hbStop()
			<-hbDone
			if ctx.Err() != nil && !errors.Is(ctx.Err(), context.DeadlineExceeded) {
				c.cancelRequest(requestID)
			}
		}()
	}
	var noNode <-chan time.Time
	if retainedWait > 0 {
		t := time.NewTimer(retainedWait)
		defer t.Stop()
		noNode = t.C
	}
	last := ""
	for {
		select {
		case m := <-inbox:
			if m.Topic == c.topics.State() {
				if len(m.Payload) > 0 {
					noNode = nil // the node exists; wait for its reply
				}
				var st apiv1.NodeState
				if !c.waitOffline && last == "" && json.Unmarshal(m.Payload, &st) == nil && st.State == apiv1.StateOffline {
					return requestID, queuedError{node: c.topics.Node, requestID: requestID, since: st.TS}
				}
				continue
			}
			r, err := apiv1.DecodeReply(m.Payload)
			if err != nil {
				return requestID, fmt.Errorf("request %s: undecodable reply on %s: %w", requestID, m.Topic, err)
			}
			if r.RequestID != "" && r.RequestID != requestID {
				continue // not ours; a well-behaved agent never does this
			}
			noNode = nil
			last = r.Phase
			if onReply(r) || r.Final() {
				return requestID, nil
			}
		case <-noNode:
			return requestID, fmt.Errorf("%w: no node named %q under prefix %s on %s (no retained state after --retained-wait %v; check --node, --prefix and --context)", errNoReply, c.topics.Node, c.topics.Prefix, c.broker, retainedWait)
		case <-ctx.Done():
			if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return requestID, fmt.Errorf("request %s: %w", requestID, ctx.Err())
			}
			if last == "" {
				return requestID, fmt.Errorf("%w: timed out waiting for a reply to request %s on %s; the agent on node %q may be offline (see `mqletctl status`)", errNoReply, requestID, replyTopic, c.topics.Node)
			}
			return requestID, fmt.Errorf("%w: timed out waiting for the final reply to request %s (last phase: %s); the agent on node %q is still working on it or went offline", errNoReply, requestID, last, c.topics.Node)
		}
	}
}

// heartbeat says the reader of request id is still there, every
// apiv1.InputInterval until ctx ends (QoS 0: a lost one is followed by the
// next long before the agent's unread bound).
func (c *client) heartbeat(ctx context.Context, id string) {
	t := time.NewTicker(apiv1.InputInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			c.mqtt.Publish(c.topics.Input(id), 0, false, []byte{})
		}
	}
}

// cancelRequest asks the agent to end request id (its reader stopped),
// without waiting for the answer.
func (c *client) cancelRequest(id string) {
	ctx, cancel := context.WithTimeout(context.Background(), cancelBudget)
	defer cancel()
	payload, err := json.Marshal(apiv1.CancelRequest{RequestID: id})
	if err != nil {
		return
	}
	cancelID := newRequestID()
	if payload, err = c.seal(apiv1.VerbCancel, cancelID, payload); err != nil {
		return
	}
	_ = c.publish(ctx, c.topics.Command(apiv1.VerbCancel, cancelID), payload)
}

// queuedError says a command went to a node whose retained state says
// offline: the broker keeps it for the node's session, and the node runs
// it when it connects again (or answers it expired).
type queuedError struct {
	node, requestID string
	since           time.Time
}

func (q queuedError) Error() string {
	since := ""
	if !q.since.IsZero() {
		since = " since " + q.since.UTC().Format(time.RFC3339)
	}
	return fmt.Sprintf("queued: node %s offline%s; request %s waits at the broker and runs when the node is back (--wait-offline waits for its reply)", q.node, since, q.requestID)
}
