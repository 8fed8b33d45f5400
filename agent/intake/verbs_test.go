package intake

import (
	"slices"
	"strings"
	"testing"

	apiv1 "github.com/mqlet/mqlet/api/v1"
)

// The table is the contract's verbs, each once: a verb added to apiv1 must
// get an entry here (a handler, or nil for "not supported yet").
func TestVerbTableIsTheContract(t *testing.T) {
	var names []string
	for _, v := range newVerbTable() {
		if slices.Contains(names, v.name) {
			t.Errorf("verb %q is in the table twice", v.name)
		}
		names = append(names, v.name)
	}
	if !slices.Equal(names, apiv1.Verbs()) {
		t.Fatalf("table verbs %v, contract verbs %v", names, apiv1.Verbs())
	}
}

// Unknown and not-yet-supported verbs are answered from the table, and the
// lists in the messages come from it.
func TestVerbsOutsideTheTableAreAnsweredFromIt(t *testing.T) {
	r := newRig(t)
	r.in.verbs = verbTable{
		{name: "apply", handle: (*Intake).handleApply},
		{name: "frobnicate"},
	}
	r.in.Handle(Command{Topic: "mqlet/v1/n1/cmd/dance/v1", Payload: []byte(`{}`)})
	if got := r.sender.last("v1"); got.Phase != apiv1.Failed || got.Message != `unknown verb "dance" (known: apply, frobnicate)` {
		t.Fatalf("unknown verb: %+v", got)
	}
	r.in.Handle(Command{Topic: "mqlet/v1/n1/cmd/frobnicate/v2", Payload: []byte(`{}`)})
	if got := r.sender.last("v2"); got.Phase != apiv1.Failed || got.Message != `verb "frobnicate" is not supported yet by this mqlet (supported: apply)` {
		t.Fatalf("unsupported verb: %+v", got)
	}
	// get is not in this table: it is unknown, and its empty payload is
	// refused like any other verb's instead of running.
	r.in.Handle(Command{Topic: "mqlet/v1/n1/cmd/get/v3"})
	if got := r.sender.last("v3"); got.Phase != apiv1.Failed || !strings.Contains(got.Message, "empty payload") {
		t.Fatalf("empty get outside the table: %+v", got)
	}
}

// Every verb of the contract has a handler; without the parts the
// operator verbs need (no runtime wired, as in this rig) each says so.
func TestEveryVerbHasAHandler(t *testing.T) {
	for _, v := range newVerbTable() {
		if v.handle == nil {
			t.Errorf("verb %s has no handler", v.name)
		}
	}
	r := newRig(t)
	for _, verb := range []string{"restart", "logs", "config", "cancel"} {
		r.in.Handle(Command{Topic: "mqlet/v1/n1/cmd/" + verb + "/u-" + verb, Payload: []byte(`{}`)})
		want := `verb "` + verb + `" is not supported by this mqlet`
		if got := r.sender.last("u-" + verb); got.Phase != apiv1.Failed || got.Message != want {
			t.Errorf("%s: %+v", verb, got)
		}
	}
	r.in.Handle(Command{Topic: "mqlet/v1/n1/cmd/exec/u-exec", Payload: []byte(`{}`)})
	if got := r.sender.last("u-exec"); got.Phase != apiv1.Failed || got.Message != MsgExecDisabled {
		t.Errorf("exec: %+v", got)
	}
}
