package apiv1

import v1 "k8s.io/api/core/v1"

// KindEvent is the kind of get that reads the node's event history.
const KindEvent = "Event"

// EventList is the result of get {"kind":"Event"}: the kept events (the
// newest events.history), oldest first, filtered by involvedObject and
// namespace when given.
type EventList struct {
	Events []*v1.Event `json:"events"`
}
