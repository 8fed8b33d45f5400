package intake

import (
	"fmt"
	"strings"

	apiv1 "github.com/mqlet/mqlet/api/v1"
)

// request is one command as a verb's handler gets it: its payload opened
// (signature checked) and within the size limit.
type request struct {
	id      string
	verb    string
	payload []byte
}

// verb is one entry of the verb table.
type verb struct {
	name string
	// handle runs the command; nil: the verb is in the contract but not
	// supported yet by this mqlet, and is answered failed saying so.
	handle func(in *Intake, r request)
	// takesEmpty: every argument is optional, so an empty payload is a
	// command (anything else treats it as clearing a retained message).
	takesEmpty bool
}

// newVerbTable lists every verb of the contract (apiv1.Verbs) with its
// handler. Adding a verb is one line here and its handler in <verb>.go.
func newVerbTable() verbTable {
	return verbTable{
		{name: apiv1.VerbApply, handle: (*Intake).handleApply},
		{name: apiv1.VerbDelete, handle: (*Intake).handleDelete},
		{name: apiv1.VerbSync, handle: (*Intake).handleSync},
		{name: apiv1.VerbGet, handle: (*Intake).handleGet, takesEmpty: true},
		{name: apiv1.VerbRestart, handle: (*Intake).handleRestart},
		{name: apiv1.VerbLogs, handle: (*Intake).handleLogs},
		{name: apiv1.VerbExec, handle: (*Intake).handleExec},
		{name: apiv1.VerbConfig, handle: (*Intake).handleConfig},
		{name: apiv1.VerbCancel, handle: (*Intake).handleCancel},
	}
}

// verbTable is the intake's verbs, in the order error messages list them.
type verbTable []verb

func (t verbTable) lookup(name string) (verb, bool) {
	for _, v := range t {
		if v.name == name {
			return v, true
		}
	}
	return verb{}, false
}

func (t verbTable) takesEmpty(name string) bool {
	v, ok := t.lookup(name)
	return ok && v.takesEmpty
}

// names lists the verbs, all or only the supported ones.
func (t verbTable) names(supportedOnly bool) string {
	var out []string
	for _, v := range t {
		if !supportedOnly || v.handle != nil {
			out = append(out, v.name)
		}
	}
	return strings.Join(out, ", ")
}

// dispatch hands a command to its verb's handler; an unknown verb, or one
// not supported yet, is answered failed naming what is.
func (in *Intake) dispatch(r request) {
	v, ok := in.verbs.lookup(r.verb)
	switch {
	case !ok:
		in.fail(r.id, r.verb, fmt.Errorf("unknown verb %q (known: %s)", r.verb, in.verbs.names(false)))
	case v.handle == nil:
		in.fail(r.id, r.verb, fmt.Errorf("verb %q is not supported yet by this mqlet (supported: %s)", r.verb, in.verbs.names(true)))
	default:
		v.handle(in, r)
	}
}
