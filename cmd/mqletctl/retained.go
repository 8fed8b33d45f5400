package main

import (
	"context"
	"errors"
	"time"
)

// barrierGrace is how long collectRetained still listens after its
// barrier came back: a broker that keeps one client's messages in order
// (mosquitto) has sent every retained message before it; a cluster that
// may not (NATS) gets this much longer.
const barrierGrace = 100 * time.Millisecond

// barrierTopic is this client's own topic under the prefix: "_" starts no
// node name, so no node reads or writes it. The shipped ACL lets every
// client read and write the one named by its client id (%c).
func (c *client) barrierTopic(prefix string) string {
	return prefix + "/_mqletctl/" + c.id
}

// collectRetained subscribes to filters and hands each message to each
// until the retained messages are in. The end is a barrier, not a quiet
// time: after the subscription it publishes to its own topic, and the
// broker queues that behind the retained messages it owes this client.
// A quiet time failed under load: a stalled process woke to a fired
// timer and messages already received, and stopped without them. When no
// barrier comes back (an ACL without the barrier rule) it waits wait in
// full.
func (c *client) collectRetained(ctx context.Context, prefix string, wait time.Duration, filters []string, each func(message)) error {
	inbox := make(chan message, 256)
	subCtx, stop := context.WithCancel(ctx)
	defer stop()
	barrier := c.barrierTopic(prefix)
	topics := append([]string{barrier}, filters...)
	if err := c.subscribe(subCtx, inbox, topics...); err != nil {
		return err
	}
	defer c.mqtt.Unsubscribe(topics...)
	token := randomToken(6)
	// Not waited for: the retained messages may fill the inbox first, and
	// with ordered delivery the acknowledgement queues behind them. A
	// barrier that fails only makes the read wait its whole wait.
	c.mqtt.Publish(barrier, 1, false, []byte(token))
	total := time.NewTimer(wait)
	defer total.Stop()
	var grace <-chan time.Time
	for {
		select {
		case m := <-inbox:
			if m.Topic == barrier {
				if string(m.Payload) == token && grace == nil {
					grace = time.After(barrierGrace)
				}
				continue
			}
			each(m)
		case <-grace:
			drain(inbox, barrier, each)
			return nil
		case <-total.C:
			drain(inbox, barrier, each)
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// drain hands on what already arrived, so a timer that fired while the
// process was stalled does not drop received messages.
func drain(inbox <-chan message, barrier string, each func(message)) {
	for {
		select {
		case m := <-inbox:
			if m.Topic != barrier {
				each(m)
			}
		default:
			return
		}
	}
}

// errNothingRetained: no retained message on the topic.
var errNothingRetained = errors.New("nothing retained")

// readRetainedOne returns the message retained on topic, or
// errNothingRetained.
func (c *client) readRetainedOne(ctx context.Context, prefix string, wait time.Duration, topic string) ([]byte, error) {
	var last []byte
	err := c.collectRetained(ctx, prefix, wait, []string{topic}, func(m message) {
		if m.Topic == topic {
			last = m.Payload // an empty one clears it
		}
	})
	if err != nil {
		return nil, err
	}
	if len(last) == 0 {
		return nil, errNothingRetained
	}
	return last, nil
}
