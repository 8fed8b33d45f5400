package intake

// handleSync makes a List the whole desired state: whatever it does not
// name is deleted.
func (in *Intake) handleSync(r request) { in.applyObjects(r.id, r.payload, true) }
