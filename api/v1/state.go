package apiv1

import "time"

// Values of NodeState.State.
const (
	StateOnline  = "online"
	StateOffline = "offline"
)

// NodeState is the retained payload of <prefix>/<node>/state: "online" on
// every connect (with a Seq that grows on each), "offline" as the MQTT will
// and on a clean stop.
type NodeState struct {
	State     string    `json:"state"`
	BootID    string    `json:"bootId"`
	Seq       uint64    `json:"seq,omitempty"`
	Version   string    `json:"version"`
	StartedAt time.Time `json:"startedAt"`
	TS        time.Time `json:"ts"`
	// SealingKey is the node's public key for sealed Secrets, an age X25519
	// recipient ("age1..."); mqletctl seals every Secret it sends to it
	// (package sealing, docs/secrets.md).
	SealingKey string `json:"sealingKey,omitempty"`
	// Groups are the groups the node is in (docs/fleet.md).
	Groups []string `json:"groups,omitempty"`
	// GroupGenerations are, by group, the generation of the group's
	// document (GroupDocument) the node last applied; a group whose
	// document it has not applied is absent.
	GroupGenerations map[string]uint64 `json:"groupGenerations,omitempty"`
}
