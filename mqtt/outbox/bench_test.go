package outbox

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

func BenchmarkPut(b *testing.B) {
	o, err := Open(filepath.Join(b.TempDir(), "ob.db"), 1<<30, zerolog.Nop())
	if err != nil {
		b.Fatal(err)
	}
	defer o.Close()
	payload := make([]byte, 512)
	b.SetBytes(int64(len(payload)))
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		m := Message{Topic: "n/events", Payload: payload, QoS: 1}
		if i%2 == 1 {
			m = Message{Topic: fmt.Sprintf("n/pods/default/p%d", i%64), Payload: payload, QoS: 1, Retained: true}
		}
		if err := o.Put(m); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDrain measures draining into a publisher that confirms at once.
func BenchmarkDrain(b *testing.B) {
	for _, inflight := range []int{1, 16} {
		b.Run(fmt.Sprintf("inflight=%d", inflight), func(b *testing.B) {
			o, err := Open(filepath.Join(b.TempDir(), "ob.db"), 1<<30, zerolog.Nop(), WithMaxInflight(inflight))
			if err != nil {
				b.Fatal(err)
			}
			defer o.Close()
			payload := make([]byte, 512)
			for i := 0; i < b.N; i++ {
				if err := o.Put(Message{Topic: "n/events", Payload: payload, QoS: 1}); err != nil {
					b.Fatal(err)
				}
			}
			pub := newFakePublisher(true)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			b.ResetTimer()
			go func() { done <- o.Run(ctx, pub) }()
			pub.connect()
			tick := time.NewTicker(time.Millisecond)
			for o.Stats().Depth > 0 {
				<-tick.C
			}
			tick.Stop()
			b.StopTimer()
			cancel()
			<-done
		})
	}
}

// BenchmarkPutParallel is many publishers at once (pod workers, the intake,
// telemetry), which is where group commit pays.
func BenchmarkPutParallel(b *testing.B) {
	o, err := Open(filepath.Join(b.TempDir(), "ob.db"), 1<<30, zerolog.Nop())
	if err != nil {
		b.Fatal(err)
	}
	defer o.Close()
	payload := make([]byte, 512)
	b.SetBytes(int64(len(payload)))
	b.SetParallelism(4)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			i++
			m := Message{Topic: "n/events", Payload: payload, QoS: 1}
			if i%2 == 1 {
				m = Message{Topic: fmt.Sprintf("n/pods/default/p%d", i%64), Payload: payload, QoS: 1, Retained: true}
			}
			if err := o.Put(m); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkPutBatch is Put's work for 64 messages at a time, per message.
func BenchmarkPutBatch(b *testing.B) {
	o, err := Open(filepath.Join(b.TempDir(), "ob.db"), 1<<30, zerolog.Nop())
	if err != nil {
		b.Fatal(err)
	}
	defer o.Close()
	payload := make([]byte, 512)
	b.SetBytes(int64(len(payload)))
	batch := make([]Message, 0, 64)
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		batch = append(batch, Message{Topic: "n/events", Payload: payload, QoS: 1})
		if len(batch) == cap(batch) {
			if err := o.PutBatch(batch); err != nil {
				b.Fatal(err)
			}
			batch = batch[:0]
		}
	}
}

// BenchmarkPutLogChunk is the logs verb's path into the outbox: one
// persisted Put (one fsync) per chunk of logs.maxChunkBytes.
func BenchmarkPutLogChunk(b *testing.B) {
	o, err := Open(filepath.Join(b.TempDir(), "ob.db"), 1<<30, zerolog.Nop())
	if err != nil {
		b.Fatal(err)
	}
	defer o.Close()
	payload := make([]byte, 256<<10)
	b.SetBytes(int64(len(payload)))
	for i := 0; b.Loop(); i++ {
		if err := o.Put(Message{Topic: fmt.Sprintf("n/reply/r%d", i), Payload: payload, QoS: 1}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkPutFull measures a Put into a full outbox (16 MiB of 200-byte
// messages) that must drop to make room: into telemetry, the oldest goes;
// into final replies only, a final reply finds none below it to drop first.
func BenchmarkPutFull(b *testing.B) {
	payload := make([]byte, 200)
	for _, tc := range []struct {
		name string
		fill Message
	}{
		{"events", Message{Topic: "n/events", Payload: payload, QoS: 1}},
		{"final-replies", Message{Topic: "n/reply/x", Payload: payload, QoS: 1, Final: true}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			o, err := Open(filepath.Join(b.TempDir(), "ob.db"), DefaultMaxBytes, zerolog.Nop())
			if err != nil {
				b.Fatal(err)
			}
			defer o.Close()
			batch := make([]Message, 1000)
			for i := range batch {
				batch[i] = tc.fill
			}
			for o.Stats().Dropped == 0 {
				if err := o.PutBatch(batch); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(o.Stats().Depth), "entries")
			m := Message{Topic: "n/reply/y", Payload: payload, QoS: 1, Final: true}
			for b.Loop() {
				if err := o.Put(m); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
