package intake

import (
	"fmt"
	"strings"
	"testing"

	"github.com/mqlet/mqlet/sealing"
)

const sealedValue = "sealed-intake-value-3f9a"

func sealFor(t *testing.T, id *sealing.Identity, manifest string) []byte {
	t.Helper()
	r, err := sealing.ParseRecipient(id.Recipient())
	if err != nil {
		t.Fatal(err)
	}
	out, n, err := sealing.SealManifest([]byte(manifest), "default", sealing.To(r))
	if err != nil || n != 1 {
		t.Fatalf("sealing: %d %v", n, err)
	}
	return out
}

const plainSecret = `{"apiVersion":"v1","kind":"Secret","metadata":{"name":"creds","namespace":"edge"},"stringData":{"pw":"` + sealedValue + `"}}`

func TestSealedSecretIsUnsealedAtApply(t *testing.T) {
	r := newRig(t)
	node, err := sealing.NewIdentity()
	if err != nil {
		t.Fatal(err)
	}
	other, err := sealing.NewIdentity()
	if err != nil {
		t.Fatal(err)
	}
	r.in.opts.Unsealer = node
	r.in.opts.MaxPayloadBytes = 1 << 20

	r.in.Handle(Command{Topic: "mqlet/v1/n1/cmd/apply/s1", Payload: sealFor(t, node, plainSecret)})
	if last := r.sender.last("s1"); last.Phase != "accepted" {
		t.Fatalf("sealed apply: %+v", last)
	}
	sec, err := r.st.Secret("edge", "creds")
	if err != nil || string(sec.Data["pw"]) != sealedValue || sealing.IsSealed(sec) {
		t.Fatalf("stored secret: %+v %v", sec, err)
	}
	// Sealed again (new ciphertext, same value): nothing changed.
	r.in.Handle(Command{Topic: "mqlet/v1/n1/cmd/apply/s2", Payload: sealFor(t, node, plainSecret)})
	if last := r.sender.last("s2"); last.Phase != "accepted" || !strings.Contains(last.Message, "unchanged") {
		t.Fatalf("re-apply: %+v", last)
	}

	r.in.Handle(Command{Topic: "mqlet/v1/n1/cmd/apply/s3", Payload: sealFor(t, other, strings.Replace(plainSecret, "creds", "x", 1))})
	last := r.sender.last("s3")
	if last.Phase != "failed" || !strings.Contains(last.Message, "this node's sealing key is "+node.KeyID()) {
		t.Fatalf("sealed to another node: %+v", last)
	}
	if _, err := r.st.Secret("edge", "x"); err == nil {
		t.Fatal("a Secret sealed to another node was stored")
	}

	r.in.opts.RequireSealedSecrets = true
	r.in.Handle(Command{Topic: "mqlet/v1/n1/cmd/apply/s4", Payload: []byte(strings.Replace(plainSecret, "creds", "y", 1))})
	last = r.sender.last("s4")
	if last.Phase != "failed" || !strings.Contains(last.Message, "accepts only sealed Secrets") {
		t.Fatalf("unsealed with requireSealedSecrets: %+v", last)
	}
	for _, rep := range r.sender.replies {
		if strings.Contains(rep.Message, sealedValue) || strings.Contains(strings.Join(rep.Errors, " "), sealedValue) {
			t.Fatalf("a reply holds the value: %+v", rep)
		}
	}
	// Sealed ones still go through.
	r.in.Handle(Command{Topic: "mqlet/v1/n1/cmd/sync/s5", Payload: sealFor(t, node, `{"apiVersion":"v1","kind":"List","items":[`+plainSecret+`]}`)})
	if last := r.sender.last("s5"); last.Phase != "accepted" {
		t.Fatalf("sealed sync: %+v", last)
	}
}

func TestTooManySealedValuesAreRefusedBeforeAnyIsOpened(t *testing.T) {
	r := newRig(t)
	node, err := sealing.NewIdentity()
	if err != nil {
		t.Fatal(err)
	}
	r.in.opts.Unsealer = node
	r.in.opts.MaxPayloadBytes = 4 << 20
	var b strings.Builder
	b.WriteString(`{"apiVersion":"v1","kind":"Secret","metadata":{"name":"many","annotations":{"mqlet.io/sealed-to":"` + node.KeyID() + `"}},"data":{`)
	for i := 0; i <= maxSealedValues; i++ {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, `"k%d":"eA=="`, i)
	}
	b.WriteString("}}")
	r.in.Handle(Command{Topic: "mqlet/v1/n1/cmd/apply/m1", Payload: []byte(b.String())})
	if last := r.sender.last("m1"); last.Phase != "failed" || !strings.Contains(last.Message, "at most 1024 are opened") {
		t.Fatalf("%d sealed values: %+v", maxSealedValues+1, last)
	}
}

// A value is bound to the namespace it was sealed for: sent on a namespace
// topic, a Secret sealed for that namespace is opened; sealed for another
// (also "default", which a Secret without namespace is sealed for), it is
// refused, so a value captured from the bus cannot be replayed into a
// namespace its sender did not mean.
func TestSealedSecretIsBoundToItsNamespace(t *testing.T) {
	r := newRig(t)
	node, err := sealing.NewIdentity()
	if err != nil {
		t.Fatal(err)
	}
	r.in.opts.Unsealer = node
	r.in.opts.MaxPayloadBytes = 1 << 20
	rcp, err := sealing.ParseRecipient(node.Recipient())
	if err != nil {
		t.Fatal(err)
	}
	seal := func(defaultNS string) []byte {
		out, _, err := sealing.SealManifest([]byte(`{"apiVersion":"v1","kind":"Secret","metadata":{"name":"creds"},"stringData":{"pw":"`+sealedValue+`"}}`), defaultNS, sealing.To(rcp))
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	r.in.Handle(Command{Topic: "mqlet/v1/n1/ns/team-a/cmd/apply/n1", Payload: seal("team-a")})
	if last := r.sender.last("n1"); last.Phase != "accepted" {
		t.Fatalf("sealed for team-a on its topic: %+v", last)
	}
	if s, err := r.st.Secret("team-a", "creds"); err != nil || string(s.Data["pw"]) != sealedValue {
		t.Fatalf("stored: %v %v", s, err)
	}
	r.in.Handle(Command{Topic: "mqlet/v1/n1/ns/team-b/cmd/apply/n2", Payload: seal("default")})
	if last := r.sender.last("n2"); last.Phase != "failed" {
		t.Fatalf("sealed for default, sent to team-b: %+v", last)
	}
	// The captured team-a Secret with its namespace taken out.
	captured := strings.Replace(string(seal("team-a")), `,"namespace":"team-a"`, "", 1)
	r.in.Handle(Command{Topic: "mqlet/v1/n1/ns/team-b/cmd/apply/n3", Payload: []byte(captured)})
	if last := r.sender.last("n3"); last.Phase != "failed" || !strings.Contains(last.Message, "sealed for another Secret or key") {
		t.Fatalf("team-a's sealed value replayed into team-b: %+v", last)
	}
	if _, err := r.st.Secret("team-b", "creds"); err == nil {
		t.Fatal("team-a's value was stored in team-b")
	}
}
