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
}
