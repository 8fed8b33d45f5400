// Package chaos is a fault-injection run of the real mqlet binary: a stream
// of commands from a model of the desired state, the agent SIGKILLed at
// random moments (commands in flight, pod starts, deletes, start-up
// adoption) and restarted, containerd paused, the broker restarted, and
// after every quiet period the invariants of docs/design.md checked against
// CRI, the retained topics and get. Everything is in its tests
// (chaos_test.go); see docs/testing.md and `make chaos`.
package chaos
