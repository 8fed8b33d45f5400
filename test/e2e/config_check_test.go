package e2e

import (
	"strings"
	"testing"
	"time"
)

// What --check-config refuses, a start refuses the same way (exit 2 with
// the YAML path), and what it passes is not refused later with exit 1.
func TestConfigCheckAgreesWithStart(t *testing.T) {
	for _, tc := range []struct {
		name, config, want string
	}{
		{"tls scheme", "mqtt:\n  broker: tls://127.0.0.1:1\n", "mqtt.broker"},
		{"mqtts scheme", "mqtt:\n  broker: mqtts://127.0.0.1:1\n", "mqtt.broker"},
		{"mqtt scheme", "mqtt:\n  broker: mqtt://127.0.0.1:1\n", "mqtt.broker"},
		{"empty prefix level", "mqtt:\n  topicPrefix: a//b\n", "mqtt.topicPrefix"},
		{"misspelt key", "mqtt:\n  brokr: tcp://127.0.0.1:1\n", "mqtt.brokr: unknown field"},
		{"key in the wrong case", "mqtt:\n  Broker: tcp://127.0.0.1:1\n", "mqtt.Broker: unknown field"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := StartAgent(t, AgentOpts{Node: "gw-check", Config: tc.config})
			if code := a.ExitCode(20 * time.Second); code != 2 {
				t.Errorf("start: exit %d, want 2\n%s", code, a.Logs())
			}
			if !strings.Contains(a.Logs(), tc.want) {
				t.Errorf("start does not name %q:\n%s", tc.want, a.Logs())
			}
			c := StartAgent(t, AgentOpts{Node: "gw-check", Config: tc.config, Args: []string{"--check-config"}})
			if code := c.ExitCode(20 * time.Second); code != 2 {
				t.Errorf("--check-config: exit %d, want 2\n%s", code, c.Logs())
			}
			if !strings.Contains(c.Logs(), tc.want) {
				t.Errorf("--check-config does not name %q:\n%s", tc.want, c.Logs())
			}
		})
	}
}
