package store

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
)

// BenchmarkBatchCommand is one pod apply as the intake's batch writes it,
// 256 commands per transaction (one fsync): the object, the accepted
// reply's record, and (Pending) the pending reply owed. ns/op is per
// command.
func BenchmarkBatchCommand(b *testing.B) {
	for _, withPending := range []bool{false, true} {
		name := "Plain"
		if withPending {
			name = "Pending"
		}
		b.Run(name, func(b *testing.B) {
			s, err := Open(filepath.Join(b.TempDir(), "state.db"))
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			reply := []byte(`{"requestId":"r","verb":"apply","phase":"accepted","message":"stored: Pod default/web created","result":[{"kind":"Pod","key":"default/web","action":"created","generation":1}]}`)
			b.ResetTimer()
			for i := 0; i < b.N; i += 256 {
				err := s.Batch(func(tx *Tx) error {
					for j := i; j < min(i+256, b.N); j++ {
						id := fmt.Sprintf("r%d", j)
						if _, err := tx.Apply([]runtime.Object{pod("default", fmt.Sprintf("web-%d", j%512), "busybox:1")}); err != nil {
							return err
						}
						if err := tx.RecordReply(id, reply, time.Now()); err != nil {
							return err
						}
						if withPending {
							p := PendingReply{RequestID: id, Verb: "apply", Deadline: time.Now().Add(time.Minute),
								Want: map[string]PendingWant{fmt.Sprintf("default/web-%d", j%512): {Generation: 1}}}
							if err := tx.PutPending(p); err != nil {
								return err
							}
						}
					}
					return nil
				})
				if err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
