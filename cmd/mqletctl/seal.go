package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	apiv1 "github.com/mqlet/mqlet/api/v1"
	"github.com/mqlet/mqlet/sealing"
)

// sealSecrets seals every Secret of an apply or sync payload to the node's
// sealing key (package sealing): the keys given as sealTo (comma-separated:
// each node of a group opens them with its own), else the one the node
// publishes in its retained state. A payload without a Secret is sent
// as it is and no key is looked up.
func sealSecrets(ctx context.Context, cfg *globalConfig, payload []byte, sealTo string) ([]byte, error) {
	// The node puts a Secret without a namespace in "default" (commands on
	// the node-wide topic, the only ones mqletctl sends).
	out, _, err := sealing.SealManifest(payload, "default", func() ([]sealing.Recipient, error) {
		keys := strings.Split(sealTo, ",")
		if sealTo == "" {
			key, err := nodeSealingKey(ctx, cfg)
			if err != nil {
				return nil, err
			}
			keys = []string{key}
		}
		rs := make([]sealing.Recipient, 0, len(keys))
		for _, k := range keys {
			r, err := sealing.ParseRecipient(k)
			if err != nil {
				return nil, err
			}
			rs = append(rs, r)
		}
		return rs, nil
	})
	if err != nil {
		return nil, fmt.Errorf("sealing Secrets to node %q: %w (--unsealed sends them in clear)", cfg.Node, err)
	}
	return out, nil
}

// nodeSealingKey reads the sealing key from the node's retained state.
func nodeSealingKey(ctx context.Context, cfg *globalConfig) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	c, err := dial(ctx, cfg)
	if err != nil {
		return "", err
	}
	defer c.close()
	topic := cfg.scheme().State()
	inbox := make(chan message, 4)
	if err := c.subscribe(ctx, inbox, topic); err != nil {
		return "", err
	}
	wait := time.NewTimer(cfg.RetainedWait)
	defer wait.Stop()
	for {
		select {
		case m := <-inbox:
			if len(m.Payload) == 0 {
				continue
			}
			var s apiv1.NodeState
			if err := json.Unmarshal(m.Payload, &s); err != nil {
				return "", fmt.Errorf("decoding %s: %w", topic, err)
			}
			if s.SealingKey == "" {
				return "", errors.New("the node publishes no sealingKey in its state (an mqlet without sealed Secrets)")
			}
			return s.SealingKey, nil
		case <-wait.C:
			return "", fmt.Errorf("no retained state on %s after --retained-wait %v (check --node and --prefix)", topic, cfg.RetainedWait)
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}
}
