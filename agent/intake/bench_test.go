package intake

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	apiruntime "k8s.io/apimachinery/pkg/runtime"

	"github.com/mqlet/mqlet/agent/manifest"
	"github.com/mqlet/mqlet/agent/pending"
	"github.com/mqlet/mqlet/agent/reply"
	"github.com/mqlet/mqlet/agent/store"
	"github.com/mqlet/mqlet/agent/validate"
	apiv1 "github.com/mqlet/mqlet/api/v1"
	"github.com/mqlet/mqlet/mqtt/outbox"
)

// benchRig is an intake over the real store, the real outbox and the real
// reply sender (every write fsync'd, as in mqlet), with fakes only for the
// pod side.
type benchRig struct {
	in     *Intake
	st     *store.Store
	box    *outbox.Outbox
	sender *reply.Sender
	topics apiv1.Scheme
}

func newBenchRig(b *testing.B) *benchRig {
	dir := b.TempDir()
	st, err := store.Open(filepath.Join(dir, "state.db"))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { st.Close() })
	box, err := outbox.Open(filepath.Join(dir, "outbox.db"), 1<<30, zerolog.Nop())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { box.Close() })
	topics := apiv1.Scheme{Prefix: "mqlet/v1", Node: "n1"}
	sender := reply.NewSender(topics, box, st, nil, zerolog.Nop())
	in := New(Options{Topics: topics, MaxPayloadBytes: 1 << 20, Policy: validate.Policy{}, ApplyDeadline: time.Minute},
		st, sender, &benchTracker{}, &fakeScheduler{deletes: map[string]*int64{}}, &fakeEvents{}, noStatus{}, zerolog.Nop())
	return &benchRig{in: in, st: st, box: box, sender: sender, topics: topics}
}

type benchTracker struct{}

func (benchTracker) Add(string, string, map[string]pending.Want, time.Time) {}

func benchConfigMap(i int) []byte {
	return fmt.Appendf(nil, `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"cm-%d","namespace":"default"},"data":{"key":"value %d"}}`, i, i)
}

func benchPod(i int) []byte {
	return fmt.Appendf(nil, `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"web-%d","namespace":"default","annotations":{"seq":"%d"}},`+
		`"spec":{"containers":[{"name":"main","image":"docker.io/mqlet/busybox:test","imagePullPolicy":"Never","command":["sleep","3600"]}]}}`, i%10, i)
}

// BenchmarkHandle is one apply through Handle, end to end: what a burst of
// commands costs per command when they are handled one at a time.
func BenchmarkHandle(b *testing.B) {
	for _, kind := range []struct {
		name    string
		payload func(int) []byte
	}{{"ConfigMap", benchConfigMap}, {"Pod", benchPod}} {
		b.Run(kind.name, func(b *testing.B) {
			r := newBenchRig(b)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				r.in.Handle(Command{Topic: r.topics.Command("apply", fmt.Sprintf("r%d", i)), Payload: kind.payload(i)})
			}
		})
	}
}

// BenchmarkHandleParts splits one apply into its steps, to see where a
// command's time goes.
func BenchmarkHandleParts(b *testing.B) {
	b.Run("LookupReply", func(b *testing.B) {
		r := newBenchRig(b)
		for i := 0; i < b.N; i++ {
			if _, _, err := r.st.LookupReply(fmt.Sprintf("r%d", i)); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("DecodeValidatePod", func(b *testing.B) {
		r := newBenchRig(b)
		for i := 0; i < b.N; i++ {
			objs, err := manifest.Decode(benchPod(i))
			if err != nil {
				b.Fatal(err)
			}
			if p := r.in.validateAll(fmt.Sprintf("b%d", i), objs); len(p) > 0 {
				b.Fatal(p)
			}
		}
	})
	b.Run("StoreApply", func(b *testing.B) {
		r := newBenchRig(b)
		for i := 0; i < b.N; i++ {
			objs, err := manifest.Decode(benchConfigMap(i))
			if err != nil {
				b.Fatal(err)
			}
			if _, err := r.st.Apply([]apiruntime.Object(objs)); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("ReplySend", func(b *testing.B) { // record (state.db) + outbox put (outbox.db)
		r := newBenchRig(b)
		for i := 0; i < b.N; i++ {
			if err := r.sender.Send(apiv1.Reply{RequestID: fmt.Sprintf("r%d", i), Verb: "apply", Phase: apiv1.Accepted, Message: "stored: ConfigMap default/x created"}); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkPipeline is the same applies through the pipeline: submitted
// without waiting, as a burst arrives, and committed in batches.
func BenchmarkPipeline(b *testing.B) {
	for _, kind := range []struct {
		name    string
		payload func(int) []byte
	}{{"ConfigMap", benchConfigMap}, {"Pod", benchPod}} {
		b.Run(kind.name, func(b *testing.B) {
			r := newBenchRig(b)
			p := NewPipeline(r.in, r.st, r.box, r.sender, PipelineOptions{MaxBacklog: b.N + 1}, zerolog.Nop())
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { defer close(done); p.Run(ctx) }()
			var acked sync.WaitGroup
			acked.Add(b.N)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				p.Submit(Command{Topic: r.topics.Command("apply", fmt.Sprintf("r%d", i)), Payload: kind.payload(i), Ack: acked.Done})
			}
			acked.Wait()
			b.StopTimer()
			cancel()
			<-done
		})
	}
}

// BenchmarkFinalReplies is the tracker's final replies through the Group,
// flushed 256 at a time (a burst of pods reaching Running): Plain is how
// they went before pending replies were persisted (record + outbox put);
// Persisted also decides each request's pending entry in the same store
// transaction, names the reply in the outbox and drops the entry in the
// next store transaction.
func BenchmarkFinalReplies(b *testing.B) {
	for _, persisted := range []bool{false, true} {
		name := "Plain"
		if persisted {
			name = "Persisted"
		}
		b.Run(name, func(b *testing.B) {
			r := newBenchRig(b)
			g := NewGroup(r.st, r.box, zerolog.Nop())
			send := r.sender.With(g.Publisher(), g.Recorder()).Send
			if persisted {
				send = g.Finals(r.sender).Send
				for i := 0; i < b.N; i += 256 {
					err := r.st.Batch(func(tx *store.Tx) error {
						for j := i; j < min(i+256, b.N); j++ {
							p := store.PendingReply{RequestID: fmt.Sprintf("r%d", j), Verb: "apply", Deadline: time.Now().Add(time.Minute),
								Want: map[string]store.PendingWant{fmt.Sprintf("default/web-%d", j): {Generation: 1}}}
							if err := tx.PutPending(p); err != nil {
								return err
							}
						}
						return nil
					})
					if err != nil {
						b.Fatal(err)
					}
				}
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				_ = send(apiv1.Reply{RequestID: fmt.Sprintf("r%d", i), Verb: "apply", Phase: apiv1.Succeeded, Message: fmt.Sprintf("default/web-%d: running", i)})
				if i%256 == 255 {
					g.Flush()
				}
			}
			g.Flush()
		})
	}
}
