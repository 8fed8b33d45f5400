package main

import (
	"crypto/rand"
	"encoding/hex"
)

// randomToken returns n random bytes as hex: only [0-9a-f], safe as an MQTT
// topic level, a client id and a request id.
func randomToken(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // crypto/rand.Read never returns an error
	return hex.EncodeToString(b)
}

// newRequestID names one command; the agent answers on reply/<id>.
func newRequestID() string { return "ctl-" + randomToken(10) }

// newClientID is a fresh MQTT client id, so two operators never kick each
// other off the broker.
func newClientID() string { return "mqletctl-" + randomToken(6) }
