package intake

import (
	"strings"
	"testing"

	apiv1 "github.com/mqlet/mqlet/api/v1"
	"github.com/mqlet/mqlet/signing"
)

func cmYAML(name, value string) string {
	return "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: " + name + "}\ndata: {script: " + value + "}\n"
}

// privilegedUser runs privileged with a ConfigMap as its script (volume)
// and an optional Secret that does not exist yet (env).
func privilegedUser(name, cm string) string {
	return "apiVersion: v1\nkind: Pod\nmetadata: {name: " + name + "}\nspec:\n  volumes:\n  - {name: s, configMap: {name: " + cm + "}}\n  containers:\n  - name: c\n    image: i\n    securityContext: {privileged: true}\n    volumeMounts:\n    - {name: s, mountPath: /s}\n    env:\n    - {name: T, valueFrom: {secretKeyRef: {name: later, key: t, optional: true}}}\n"
}

func TestObjectsOfASignedPrivilegedPodInheritItsSignature(t *testing.T) {
	r, ops, dev := signedRig(t, false)
	n := 0
	// outcome is the request's failed reply, else its accepted one.
	outcome := func(id string) apiv1.Reply {
		r.sender.mu.Lock()
		defer r.sender.mu.Unlock()
		var got apiv1.Reply
		for _, rep := range append(append([]apiv1.Reply(nil), r.sender.replies...), r.sender.unrecorded...) {
			if rep.RequestID == id && (rep.Phase == apiv1.Failed || (rep.Phase == apiv1.Accepted && got.Phase == "")) {
				got = rep
			}
		}
		return got
	}
	send := func(verb string, payload []byte) apiv1.Reply {
		t.Helper()
		n++
		id := verb + "-" + string(rune('a'+n))
		r.in.Handle(Command{Topic: "mqlet/v1/n1/cmd/" + verb + "/" + id, Payload: payload})
		return outcome(id)
	}
	signed := func(s *signing.Signer, verb, body string) apiv1.Reply {
		t.Helper()
		n++
		id := verb + "-" + string(rune('a'+n))
		r.in.Handle(Command{Topic: "mqlet/v1/n1/cmd/" + verb + "/" + id, Payload: signedFor(t, s, verb, id, body)})
		return outcome(id)
	}
	expect := func(what string, got apiv1.Reply, phase, says string) {
		t.Helper()
		if got.Phase != phase || !strings.Contains(got.Message, says) {
			t.Fatalf("%s: %s %q, want %s saying %q", what, got.Phase, got.Message, phase, says)
		}
	}
	script := func() string {
		t.Helper()
		cm, err := r.st.ConfigMap("default", "cfg")
		if err != nil {
			t.Fatal(err)
		}
		return cm.Data["script"]
	}

	expect("signed privileged pod with its ConfigMap", signed(ops, "apply", cmYAML("cfg", "good")+"---\n"+privilegedUser("p", "cfg")), apiv1.Accepted, "created")
	pod, err := r.st.Pod("default", "p")
	if err != nil || pod.Annotations[AnnotationAdmittedProfile] != "privileged" {
		t.Fatalf("stored pod: %v %v", pod.Annotations, err)
	}

	const refused = "is used by Pod default/p, admitted with profile privileged"
	expect("unsigned change", send("apply", []byte(cmYAML("cfg", "evil"))), apiv1.Failed, refused)
	expect("change signed by a key without the profile", signed(dev, "apply", cmYAML("cfg", "evil")), apiv1.Failed, refused)
	expect("unsigned delete", send("delete", []byte(`{"kind":"ConfigMap","name":"cfg"}`)), apiv1.Failed, refused)
	expect("unsigned sync dropping it", send("sync", []byte(webPod)), apiv1.Failed, "ConfigMap default/cfg "+refused)
	expect("unsigned creation of a Secret it will read", send("apply", []byte("apiVersion: v1\nkind: Secret\nmetadata: {name: later}\nstringData: {t: x}\n")), apiv1.Failed, "Secret default/later "+refused)
	if got := script(); got != "good" {
		t.Fatalf("the ConfigMap was changed to %q", got)
	}
	if _, err := r.st.Secret("default", "later"); err == nil {
		t.Fatal("the Secret was created")
	}
	if !strings.Contains(strings.Join(r.events.reasons, ","), ReasonProtectedObject) {
		t.Fatalf("no %s event: %v", ReasonProtectedObject, r.events.reasons)
	}
	expect("change signed with the profile", signed(ops, "apply", cmYAML("cfg", "better")), apiv1.Accepted, "updated")
	if got := script(); got != "better" {
		t.Fatalf("script %q after the signed change", got)
	}

	// An object planted before the pod: the signed pod is not admitted
	// with it until it is applied again, signed.
	expect("unsigned ConfigMap", send("apply", []byte(cmYAML("planted", "evil"))), apiv1.Accepted, "created")
	expect("signed pod using a planted ConfigMap", signed(ops, "apply", privilegedUser("p2", "planted")), apiv1.Failed, "uses ConfigMap default/planted, which was stored by a command signed with less")
	expect("the same with the ConfigMap", signed(ops, "apply", cmYAML("planted", "good")+"---\n"+privilegedUser("p2", "planted")), apiv1.Accepted, "created")

	// The annotations are mqlet's.
	expect("forged admitted profile", send("apply", []byte("apiVersion: v1\nkind: Pod\nmetadata: {name: q, annotations: {mqlet.io/admitted-profile: privileged}}\nspec:\n  containers:\n  - {name: c, image: i}\n")), apiv1.Failed, "is set by mqlet")
	expect("forged signed profile", send("apply", []byte("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: f, annotations: {mqlet.io/signed-profile: privileged}}\n")), apiv1.Failed, "is set by mqlet")

	// What no signed pod lifts stays free to change unsigned, also what a
	// pod uses that the node's own profile admits (signed or not).
	expect("signed pod at the node's profile", signed(ops, "apply", cmYAML("plain", "a")+"---\napiVersion: v1\nkind: Pod\nmetadata: {name: b}\nspec:\n  volumes:\n  - {name: s, configMap: {name: plain}}\n  containers:\n  - {name: c, image: i}\n"), apiv1.Accepted, "created")
	if b, _ := r.st.Pod("default", "b"); b.Annotations[AnnotationAdmittedProfile] != "" {
		t.Fatalf("a pod the node's profile admits is marked: %v", b.Annotations)
	}
	expect("unsigned change of its ConfigMap", send("apply", []byte(cmYAML("plain", "b"))), apiv1.Accepted, "updated")

	// A sync of another namespace deletes nothing of default: not refused.
	r.in.Handle(Command{Topic: "mqlet/v1/n1/ns/other/cmd/sync/ns1", Payload: []byte(`{"apiVersion":"v1","kind":"List","items":[]}`)})
	expect("unsigned sync of another namespace", outcome("ns1"), apiv1.Accepted, "")

	// Once the privileged pods are gone, their objects are free again.
	expect("signed delete of the pods", signed(ops, "delete", `{"kind":"Pod","name":"p"}`), apiv1.Accepted, "deleted")
	expect("unsigned change while p2 uses another", send("apply", []byte(cmYAML("cfg", "after"))), apiv1.Accepted, "updated")
}
