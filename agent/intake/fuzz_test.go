package intake

import (
	"context"
	"strings"
	"testing"

	apiv1 "github.com/mqlet/mqlet/api/v1"
)

// FuzzHandle feeds arbitrary topics, payloads and retain flags to the
// intake: it must never panic, every command gets a reply, and a retained
// one is refused without being recorded.
func FuzzHandle(f *testing.F) {
	f.Add("apply/r1", []byte(webPod), false)
	f.Add("delete/d1", []byte(`{"kind":"Pod","name":"web","gracePeriodSeconds":-1}`), false)
	f.Add("sync/s1", []byte(`{"apiVersion":"v1","kind":"List","items":[{"apiVersion":"v1","kind":"Secret","metadata":{"name":"s"},"data":{"k":"!!"}}]}`), false)
	f.Add("get", []byte(`{"kind":"pods","namespace":"../../etc"}`), false)
	f.Add("apply/../x", []byte("---\n---\n"), false)
	f.Add("apply/ret1", []byte(webPod), true)
	f.Add("apply/bomb", []byte("a: &a [x,x,x,x,x,x,x,x,x]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\nc: [*b,*b,*b,*b,*b,*b,*b,*b,*b]\n"), false)
	r := newRig(f)
	f.Fuzz(func(t *testing.T, suffix string, payload []byte, retained bool) {
		before := len(r.sender.replies)
		resentBefore := len(r.sender.resent)
		r.in.Handle(Command{Topic: "mqlet/v1/n1/cmd/" + suffix, Payload: payload, Retained: retained})
		answered := len(r.sender.replies) > before || len(r.sender.resent) > resentBefore
		if !answered {
			t.Fatalf("no reply to cmd/%q", suffix)
		}
		if retained && len(r.sender.replies) > before {
			t.Fatalf("a retained command was answered with a recorded reply: %+v", r.sender.replies[before:])
		}
		for _, rep := range r.sender.replies[before:] {
			if rep.RequestID == "" || (rep.Phase != apiv1.Accepted && rep.Phase != apiv1.InProgress && rep.Phase != apiv1.Succeeded && rep.Phase != apiv1.Failed) {
				t.Fatalf("bad reply %+v", rep)
			}
			if strings.ContainsAny(rep.RequestID, "/+#") {
				t.Fatalf("reply id %q is not a single topic level", rep.RequestID)
			}
		}
	})
}

// FuzzPipeline feeds the same commands through the pipeline, two at a time
// in one batch: each is acknowledged exactly once and answered, whatever
// the other one does to the batch.
func FuzzPipeline(f *testing.F) {
	f.Add("apply/r1", []byte(webPod), "apply/r2", []byte(`{"apiVersion":"v1","kind":"List","items":[{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a"}},{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a"}}]}`))
	f.Add("delete/d1", []byte(`{"kind":"Pod","name":"web"}`), "get/g1", []byte(`{}`))
	f.Add("sync/s1", []byte(`{"apiVersion":"v1","kind":"List","items":[]}`), "apply", []byte("---\n---\n"))
	f.Fuzz(func(t *testing.T, suffix1 string, payload1 []byte, suffix2 string, payload2 []byte) {
		r := newPipeRig(t, PipelineOptions{})
		var acks [2]int
		for i, c := range []struct {
			suffix  string
			payload []byte
		}{{suffix1, payload1}, {suffix2, payload2}} {
			r.pipe.Submit(Command{Topic: "mqlet/v1/n1/cmd/" + c.suffix, Payload: c.payload, Ack: func() { acks[i]++ }})
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		r.pipe.Run(ctx) // handles both, in one batch, then returns
		if acks != [2]int{1, 1} {
			t.Fatalf("acknowledgements %v, want one each", acks)
		}
		r.box.mu.Lock()
		n := len(r.box.msgs)
		r.box.mu.Unlock()
		if n < 2 {
			t.Fatalf("%d replies to two commands", n)
		}
	})
}
