package session

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/mqlet/mqlet/mqtt/outbox"
)

// The outbox drained through a real session: while the link is down, three
// values of one retained topic coalesce so a subscriber only ever sees the
// latest, and events arrive in order.
func TestOutboxThroughSessionCoalescesWhileOffline(t *testing.T) {
	brokers(t, func(t *testing.T, b testBroker) {
		p := startProxy(t, b.Addr())
		f := newFixture(t, p.URL(), func(o *Options) { o.OnConnect = nil })
		ob, err := outbox.Open(filepath.Join(t.TempDir(), "outbox.db"), 0, zerolog.Nop(), outbox.WithMaxInflight(4))
		if err != nil {
			t.Fatal(err)
		}
		defer ob.Close()
		podTopic := f.scheme.Pod("default", "web")
		obs := newObserver(t, b.URL(), "obs-"+f.scheme.Node)
		obs.subscribe(t, podTopic)
		obs.subscribe(t, f.scheme.Events())

		runSession(t, f.s)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- ob.Run(ctx, f.s) }()
		defer func() {
			cancel()
			if err := <-done; !errors.Is(err, context.Canceled) {
				t.Errorf("outbox Run = %v", err)
			}
		}()
		waitClosed(t, f.s.Connected(), "connection")

		// Online: a Put goes out promptly.
		put := func(m outbox.Message) {
			t.Helper()
			if err := ob.Put(m); err != nil {
				t.Fatal(err)
			}
		}
		put(outbox.Message{Topic: podTopic, Payload: []byte("v0"), QoS: 1, Retained: true})
		expect(t, obs.next(t, "online put"), podTopic, "v0")

		// Offline: three values of the pod and three events.
		_, down := f.s.Connection()
		p.cut()
		waitClosed(t, down, "loss of the link")
		for i := 1; i <= 3; i++ {
			put(outbox.Message{Topic: podTopic, Payload: []byte(fmt.Sprintf("v%d", i)), QoS: 1, Retained: true})
			put(outbox.Message{Topic: f.scheme.Events(), Payload: []byte(fmt.Sprintf("e%d", i)), QoS: 1})
		}
		if st := ob.Stats(); st.Depth != 4 {
			t.Fatalf("outbox depth while offline = %d, want 4 (1 coalesced pod + 3 events)", st.Depth)
		}
		p.resume()
		var got []string
		for len(got) < 4 {
			m := obs.next(t, "drained messages")
			label := "pod"
			if m.topic == f.scheme.Events() {
				label = "event"
			}
			got = append(got, label+"="+m.payload)
		}
		// v3 was put after e2 and before e3, and takes that position.
		want := "[event=e1 event=e2 pod=v3 event=e3]"
		if fmt.Sprint(got) != want {
			t.Fatalf("subscriber saw %v, want %s (only the latest pod value, at its position; events in order)", got, want)
		}
		select {
		case m := <-obs.msgs:
			t.Fatalf("unexpected extra message %+v", m)
		case <-time.After(200 * time.Millisecond):
		}
		waitUntil(t, "outbox empty", func() bool { return ob.Stats().Depth == 0 })
		late := newObserver(t, b.URL(), "late-"+f.scheme.Node)
		late.subscribe(t, podTopic)
		if m := late.next(t, "retained pod"); m.payload != "v3" || !m.retained {
			t.Fatalf("retained pod = %+v, want v3", m)
		}
	})
}
