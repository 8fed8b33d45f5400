package restart

import (
	"strings"
	"sync"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

func TestCrashLoopDelaysDoubleToTheCap(t *testing.T) {
	c := clocktesting.NewFakeClock(time.Unix(1000, 0))
	tr := New(DefaultPolicy, c)
	const key = "uid/web"
	// Each step: the container exits right after its restart; how long must it wait?
	want := []time.Duration{0, 10, 20, 40, 80, 160, 300, 300, 300}
	for i, w := range want {
		c.Step(time.Second) // it ran one second
		finished := c.Now()
		wait, reason := tr.Decide(key, finished)
		if wait != w*time.Second {
			t.Fatalf("step %d: want wait %vs, got %v", i, int(w), wait)
		}
		if (wait > 0) != (reason != "") {
			t.Fatalf("step %d: wait %v with reason %q", i, wait, reason)
		}
		c.Step(wait)
		if wait, _ := tr.Decide(key, finished); wait != 0 {
			t.Fatalf("step %d: still waiting %v after the wait", i, wait)
		}
		tr.Restarted(key, finished)
	}
}

// TestDecide is the one question asked in each situation.
func TestDecide(t *testing.T) {
	p := Policy{Base: 10 * time.Second, Max: 300 * time.Second, ResetAfter: 10 * time.Minute}
	for _, tc := range []struct {
		name     string
		restarts int           // restarts recorded, each right after an exit
		ran      time.Duration // time from the last restart to the exit asked about
		waited   time.Duration // time since that exit
		want     time.Duration
	}{
		{name: "never restarted", restarts: 0, ran: time.Second, want: 0},
		{name: "first crash loop step", restarts: 1, ran: time.Second, want: 10 * time.Second},
		{name: "part of the wait is over", restarts: 1, ran: time.Second, waited: 4 * time.Second, want: 6 * time.Second},
		{name: "the wait is over", restarts: 1, ran: time.Second, waited: 10 * time.Second, want: 0},
		{name: "third step doubles twice", restarts: 3, ran: time.Second, want: 40 * time.Second},
		{name: "capped", restarts: 12, ran: time.Second, want: 300 * time.Second},
		{name: "ran healthy just under the reset", restarts: 4, ran: 10*time.Minute - time.Second, want: 80 * time.Second},
		{name: "ran healthy for the reset", restarts: 4, ran: 10 * time.Minute, want: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := clocktesting.NewFakeClock(time.Unix(1000, 0))
			tr := New(p, c)
			for range tc.restarts {
				tr.Restarted("k", c.Now())
				c.Step(time.Second)
			}
			if tc.restarts > 0 {
				c.Step(tc.ran - time.Second)
			}
			finished := c.Now()
			c.Step(tc.waited)
			wait, reason := tr.Decide("k", finished)
			if wait != tc.want {
				t.Fatalf("wait %v, want %v", wait, tc.want)
			}
			if wait > 0 && !strings.Contains(reason, "back-off") {
				t.Fatalf("reason %q does not say back-off", reason)
			}
			if ok, d := tr.InBackoff("k", finished); ok != (tc.want > 0) || d != tc.want {
				t.Fatalf("InBackoff = %v %v, want %v", ok, d, tc.want)
			}
		})
	}
}

func TestHealthyRunResetsBackoff(t *testing.T) {
	c := clocktesting.NewFakeClock(time.Unix(1000, 0))
	tr := New(Policy{Base: time.Second, Max: time.Minute, ResetAfter: 10 * time.Minute}, c)
	for range 5 {
		tr.Restarted("k", c.Now())
	}
	if d := tr.Delay("k"); d != 16*time.Second {
		t.Fatalf("delay after 5 restarts = %v, want 16s", d)
	}
	c.Step(10 * time.Minute) // ran healthy
	if wait, _ := tr.Decide("k", c.Now()); wait != 0 {
		t.Fatal("a container that ran 10 min healthy must restart at once")
	}
	tr.Restarted("k", c.Now())
	if d := tr.Delay("k"); d != time.Second {
		t.Fatalf("delay after reset = %v, want base 1s", d)
	}
}

// Keys of one tracker never touch another's: each pod has its own.
func TestTrackersAreIndependent(t *testing.T) {
	c := clocktesting.NewFakeClock(time.Unix(1000, 0))
	a, b := New(DefaultPolicy, c), New(DefaultPolicy, c)
	a.Restarted("u/c", c.Now())
	if a.Delay("u/c") != 10*time.Second || b.Delay("u/c") != 0 {
		t.Fatalf("delays %v %v", a.Delay("u/c"), b.Delay("u/c"))
	}
}

func TestConcurrentUse(t *testing.T) {
	tr := New(DefaultPolicy, nil)
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 100 {
				tr.Restarted(string(rune('a'+i)), time.Now())
				tr.Decide(string(rune('a'+i)), time.Now())
			}
		}()
	}
	wg.Wait()
	if tr.Delay("a") != DefaultPolicy.Max {
		t.Fatalf("after 100 restarts delay = %v, want cap", tr.Delay("a"))
	}
}
