package intake

import (
	"strings"
	"testing"

	"github.com/mqlet/mqlet/agent/reply"
)

// FuzzHandle feeds arbitrary topics and payloads to the intake: it must
// never panic, and every command on a well-formed topic gets a reply.
func FuzzHandle(f *testing.F) {
	f.Add("apply/r1", []byte(webPod))
	f.Add("delete/d1", []byte(`{"kind":"Pod","name":"web","gracePeriodSeconds":-1}`))
	f.Add("sync/s1", []byte(`{"apiVersion":"v1","kind":"List","items":[{"apiVersion":"v1","kind":"Secret","metadata":{"name":"s"},"data":{"k":"!!"}}]}`))
	f.Add("get", []byte(`{"kind":"pods","namespace":"../../etc"}`))
	f.Add("apply/../x", []byte("---\n---\n"))
	r := newRig(f)
	f.Fuzz(func(t *testing.T, suffix string, payload []byte) {
		before := len(r.sender.replies)
		resentBefore := len(r.sender.resent)
		r.in.Handle("mqlet/v1/n1/cmd/"+suffix, payload)
		answered := len(r.sender.replies) > before || len(r.sender.resent) > resentBefore
		if !answered {
			t.Fatalf("no reply to cmd/%q", suffix)
		}
		for _, rep := range r.sender.replies[before:] {
			if rep.RequestID == "" || (rep.Phase != reply.Accepted && rep.Phase != reply.InProgress && rep.Phase != reply.Succeeded && rep.Phase != reply.Failed) {
				t.Fatalf("bad reply %+v", rep)
			}
			if strings.ContainsAny(rep.RequestID, "/+#") {
				t.Fatalf("reply id %q is not a single topic level", rep.RequestID)
			}
		}
	})
}
