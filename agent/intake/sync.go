package intake

import apiv1 "github.com/mqlet/mqlet/api/v1"

// handleSync makes a List the whole desired state: whatever it does not
// name is deleted.
func (in *Intake) handleSync(r request) { in.applyObjects(r.id, apiv1.VerbSync, r.payload, true) }
