package intake

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/mqlet/mqlet/agent/store"
	"github.com/mqlet/mqlet/agent/streams"
	"github.com/mqlet/mqlet/agent/validate"
	apiv1 "github.com/mqlet/mqlet/api/v1"
	"github.com/mqlet/mqlet/signing"
	"github.com/mqlet/mqlet/signing/noncestore"
)

const privilegedPod = "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  containers:\n  - name: c\n    image: i\n    securityContext: {privileged: true}\n"

// signedRig is a rig whose intake opens commands with a real Verifier that
// trusts two keys: "ops" (may ask for the privileged profile) and "dev".
func signedRig(t *testing.T, required bool) (*rig, *signing.Signer, *signing.Signer) {
	t.Helper()
	r := newRig(t)
	nonces, err := noncestore.Open(filepath.Join(t.TempDir(), "nonces.db"), 1000)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nonces.Close() })
	mk := func(id string) *signing.Signer {
		k, err := signing.GenerateKey()
		if err != nil {
			t.Fatal(err)
		}
		s, err := signing.NewSigner(id, k)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	ops, dev := mk("ops"), mk("dev")
	v, err := signing.NewVerifier(signing.Policy{Required: required, Targets: []string{"n1"}, ClockSkew: time.Second, MaxLifetime: time.Hour, MaxEnvelopeBytes: 16 << 10,
		Keys: []signing.Key{
			{ID: "ops", Public: ops.Public(), Verbs: []string{"*"}, MaxProfile: signing.ProfilePrivileged},
			{ID: "dev", Public: dev.Public(), Verbs: []string{"apply", "get"}},
		}}, nonces, nil)
	if err != nil {
		t.Fatal(err)
	}
	r.in.opts.Opener = v
	// Stands in for the node's profile logic: a privileged-profile command may run privileged pods.
	r.in.opts.ProfilePolicy = func(p validate.Policy, namespace, profile string) validate.Policy {
		if namespace == "default" && profile == signing.ProfilePrivileged {
			p.AllowPrivileged = true
		}
		return p
	}
	return r, ops, dev
}

func signedFor(t *testing.T, s *signing.Signer, verb, id, body string) []byte {
	t.Helper()
	now := time.Now()
	env, err := s.Sign(signing.Claims{Node: "n1", Verb: verb, RequestID: id, IssuedAt: now, Expires: now.Add(time.Minute)}, []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	return env
}

func TestSignedOnlyIntake(t *testing.T) {
	r, ops, _ := signedRig(t, true)
	r.in.Handle(Command{Topic: "mqlet/v1/n1/cmd/apply/u1", Payload: []byte(webPod)})
	if last := r.sender.last("u1"); last.Phase != apiv1.Failed || !strings.Contains(last.Message, "signature required") {
		t.Fatalf("unsigned command on a signed-only node: %+v", last)
	}
	if pods, _ := r.st.ListPods(); len(pods) != 0 {
		t.Fatal("an unsigned command stored a pod")
	}
	if !strings.Contains(strings.Join(r.events.reasons, ","), "FailedSignature") {
		t.Fatalf("no FailedSignature event: %v", r.events.reasons)
	}

	env := signedFor(t, ops, "apply", "s1", webPod)
	r.in.Handle(Command{Topic: "mqlet/v1/n1/cmd/apply/s1", Payload: env})
	if got := strings.Join(r.sender.phases("s1"), ","); got != "accepted,in_progress" {
		t.Fatalf("signed apply phases %q (%+v)", got, r.sender.last("s1"))
	}
	if _, err := r.st.Pod("default", "web"); err != nil {
		t.Fatalf("signed pod not stored: %v", err)
	}
	// The same request redelivered is answered from its record, not run
	// and not refused as a replay.
	r.in.Handle(Command{Topic: "mqlet/v1/n1/cmd/apply/s1", Payload: env})
	if n := len(r.sender.resent); n != 2 || r.sender.resent[n-1] != "s1" || len(r.sched.keys) != 1 {
		t.Fatalf("redelivery: resent=%v scheduled=%v", r.sender.resent, r.sched.keys)
	}
	// The same envelope on another request id fails the binding.
	r.in.Handle(Command{Topic: "mqlet/v1/n1/cmd/apply/s2", Payload: env})
	if last := r.sender.last("s2"); last.Phase != apiv1.Failed || !strings.Contains(last.Message, `signed for request id "s1"`) {
		t.Fatalf("envelope replayed under another id: %+v", last)
	}
	// The signed body, not the envelope, meets the payload limit.
	r.in.Handle(Command{Topic: "mqlet/v1/n1/cmd/apply/s3", Payload: signedFor(t, ops, "apply", "s3", strings.Repeat("x", 5000))})
	if last := r.sender.last("s3"); last.Phase != apiv1.Failed || !strings.Contains(last.Message, "payload of 5000 bytes exceeds") {
		t.Fatalf("oversized signed body: %+v", last)
	}
}

func TestSignedProfileReachesPodValidation(t *testing.T) {
	r, ops, dev := signedRig(t, false)
	// Unsigned and signed by a key without a profile: the node's policy denies it.
	r.in.Handle(Command{Topic: "mqlet/v1/n1/cmd/apply/p1", Payload: []byte(privilegedPod)})
	r.in.Handle(Command{Topic: "mqlet/v1/n1/cmd/apply/p2", Payload: signedFor(t, dev, "apply", "p2", privilegedPod)})
	for _, id := range []string{"p1", "p2"} {
		if last := r.sender.last(id); last.Phase != apiv1.Failed || !strings.Contains(last.Message, "privileged") {
			t.Fatalf("%s: privileged pod without a privileged signature: %+v", id, last)
		}
	}
	// Signed by the key allowed the privileged profile: accepted.
	r.in.Handle(Command{Topic: "mqlet/v1/n1/cmd/apply/p3", Payload: signedFor(t, ops, "apply", "p3", privilegedPod)})
	if last := r.sender.last("p3"); last.Phase == apiv1.Failed {
		t.Fatalf("privileged pod signed by the privileged key: %+v", last)
	}
	// The profile does not leak into the next, unsigned command.
	r.in.Handle(Command{Topic: "mqlet/v1/n1/cmd/apply/p4", Payload: []byte(strings.Replace(privilegedPod, "name: p}", "name: q}", 1))})
	if last := r.sender.last("p4"); last.Phase != apiv1.Failed {
		t.Fatalf("unsigned command after a signed one kept its profile: %+v", last)
	}
	// dev may not sign delete.
	r.in.Handle(Command{Topic: "mqlet/v1/n1/cmd/delete/p5", Payload: signedFor(t, dev, "delete", "p5", `{"kind":"Pod","name":"p"}`)})
	if last := r.sender.last("p5"); last.Phase != apiv1.Failed || !strings.Contains(last.Message, "key dev may not sign verb delete") {
		t.Fatalf("delete signed by dev: %+v", last)
	}
}

// Anyone on the broker can publish a command without a valid signature; its
// refusal must not use up the request id, or the operator's signed command
// with that id (a dashboard's "r1") would only get the refusal back.
func TestRefusedSignatureKeepsTheRequestIDFree(t *testing.T) {
	r, ops, _ := signedRig(t, true)
	r.in.Handle(Command{Topic: "mqlet/v1/n1/cmd/apply/r1", Payload: []byte(webPod)})
	if last := r.sender.last("r1"); last.Phase != apiv1.Failed || !strings.Contains(last.Message, "signature required") {
		t.Fatalf("unsigned command: %+v", last)
	}
	forged := signedFor(t, ops, "apply", "r1", webPod)
	forged[len(forged)-2] ^= 1 // a bad signature
	r.in.Handle(Command{Topic: "mqlet/v1/n1/cmd/apply/r1", Payload: forged})
	if last := r.sender.last("r1"); last.Phase != apiv1.Failed || !strings.Contains(last.Message, "signature") {
		t.Fatalf("forged command: %+v", last)
	}
	r.in.Handle(Command{Topic: "mqlet/v1/n1/cmd/apply/r1", Payload: signedFor(t, ops, "apply", "r1", webPod)})
	if got := strings.Join(r.sender.phases("r1"), ","); got != "accepted,in_progress" {
		t.Fatalf("the signed command after refusals: phases %q (%+v)", got, r.sender.last("r1"))
	}
	if _, err := r.st.Pod("default", "web"); err != nil {
		t.Fatalf("signed pod not stored: %v", err)
	}
}

type heldStreams struct{ running map[string]streams.Kind }

func (h *heldStreams) Start(id string, kind streams.Kind, fn func(ctx context.Context)) error {
	h.running[id] = kind
	return nil
}

func (h *heldStreams) Cancel(id string) bool {
	return h.CancelIf(id, func(streams.Kind) bool { return true })
}

func (h *heldStreams) CancelIf(id string, may func(streams.Kind) bool) bool {
	k, ok := h.running[id]
	if !ok || !may(k) {
		return false
	}
	delete(h.running, id)
	return true
}

// Within its scope, a stream started by a signed command is cancelled only
// by a cancel signed with the same key: MQTT 3.1.1 names no publisher, so
// the key is all that tells requesters apart there.
func TestCancelOfASignedStreamNeedsItsKey(t *testing.T) {
	r, ops, dev := signedRig(t, false)
	held := &heldStreams{running: map[string]streams.Kind{}}
	r.in.opts.Verbs.Streams = held
	owner := "default " + store.SourceOf(&metav1.ObjectMeta{Namespace: "default"})
	r.in.startStreamNow("s1", "logs", streams.Kind{Requester: "key ops", Owner: owner}, func(*Intake, context.Context) {})
	r.in.startStreamNow("s2", "logs", streams.Kind{Owner: owner}, func(*Intake, context.Context) {})

	r.in.Handle(Command{Topic: "mqlet/v1/n1/cmd/cancel/c1", Payload: []byte(`{"requestId":"s1"}`)})
	if last := r.sender.last("c1"); last.Phase != apiv1.Failed || !strings.Contains(last.Message, "signed with key ops") {
		t.Fatalf("an unsigned cancel of a signed stream: %+v", last)
	}
	r.in.Handle(Command{Topic: "mqlet/v1/n1/cmd/cancel/c2", Payload: signedFor(t, dev, "cancel", "c2", `{"requestId":"s1"}`)})
	if last := r.sender.last("c2"); last.Phase != apiv1.Failed {
		t.Fatalf("a cancel signed by another key: %+v", last)
	}
	if _, ok := held.running["s1"]; !ok {
		t.Fatal("the signed stream was cancelled")
	}
	r.in.Handle(Command{Topic: "mqlet/v1/n1/cmd/cancel/c3", Payload: signedFor(t, ops, "cancel", "c3", `{"requestId":"s1"}`)})
	if last := r.sender.last("c3"); last.Phase != apiv1.Succeeded {
		t.Fatalf("a cancel signed by the stream's key: %+v", last)
	}
	r.in.Handle(Command{Topic: "mqlet/v1/n1/cmd/cancel/c4", Payload: []byte(`{"requestId":"s2"}`)})
	if last := r.sender.last("c4"); last.Phase != apiv1.Succeeded {
		t.Fatalf("an unsigned cancel of an unsigned stream: %+v", last)
	}
}
