// Package outbox is mqlet's persisted store-and-forward queue for everything
// it publishes.
package outbox

// Message is one MQTT publication.
type Message struct {
	Topic    string `json:"t"`
	Payload  []byte `json:"p"`
	QoS      byte   `json:"q"`
	Retained bool   `json:"r"`
	// Coalesce keeps only the latest value per topic while offline
	// (always true for retained messages).
	Coalesce bool `json:"c,omitempty"`
	// Once, when set, names the message: a later Put of a message with the
	// same Once is a no-op, even after the first was sent, so a writer that
	// cannot know whether its Put landed before a crash can simply put
	// again. The newest 65,536 names are remembered.
	Once string `json:"o,omitempty"`
	// Final marks a command's final reply (phase succeeded or failed) and
	// the parts of its result: when the outbox must drop, it drops these
	// last, after telemetry, events, statuses and in-progress replies.
	Final bool `json:"f,omitempty"`
}
