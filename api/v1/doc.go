// Package apiv1 is mqlet's wire contract, version 1: the MQTT topic scheme,
// the reply envelope and its phases, the retained node state, and the
// request and result payloads of every command verb. The agent and
// mqletctl both speak through these types, so they cannot drift apart; the
// contract tables of README.md and docs/design.md are checked against them.
//
// The package imports only the standard library and k8s.io/api: it is the
// lowest layer, and everything else may import it.
package apiv1
